"""Schedule rules: each module holds one rule; `schedule` picks the first that applies."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tvm import tirx

from mxgemm import formats
from mxgemm.rules import cpu

log = logging.getLogger(__name__)


def rule_for(
    fmt: str, n: int, k: int, m_bucket: int | None, a_dtype: str, block_size: int, target: dict[str, Any]
):
    """The tunable CUDA rule (module) that serves this layer shape and M bucket: ``mma`` (fp16, codes
    exact in fp16, a tile that fits; not 8-bit codes at M=1, which ``gemv`` streams faster),
    else ``tensorcore`` (fp16, buckets 16/64), else ``gemv`` (buckets 1/4/16); None for the rest
    (dlight). The one routing `schedule` and `mxgemm tune` share; a tune log may pin another rule."""
    from mxgemm.layout import plane_widths
    from mxgemm.rules import gemv, mma, tensorcore

    f = formats.get(fmt)
    if (
        not (plane_widths(f.bits)[0] == 8 and m_bucket == 1)
        and mma.applies(f, block_size, a_dtype, m_bucket)
        and mma.default_hints(target, n, k, f, m_bucket, block_size)
    ):
        return mma
    if m_bucket in tensorcore.M_TILES and a_dtype == "float16":
        return tensorcore
    return gemv if m_bucket in gemv.M_TILES else None


def schedule(
    make: Callable[[str | None], tirx.PrimFunc],
    target: dict[str, Any],
    spec: Any,
    hints: dict[str, Any] | None = None,
) -> tuple[str, Any, dict[str, Any]]:
    """(rule name, scheduled IRModule, the hints used) for the kernel of ``spec`` (a
    :class:`~mxgemm.codegen.build.KernelSpec`, ``op="linear"``): ``make(decode_dtype)`` gives its
    decode-fused prim_func; ``hints`` (from a tune log) override the rule's defaults. A rule that
    cannot tile the shape hands over to the next (``tensorcore`` → ``gemv`` → dlight)."""
    import tvm

    m_bucket = spec.m_bucket
    if target["kind"] == "cuda":
        from mxgemm.rules import dlight, gemv, mma, tensorcore

        # Tuned hints name their rule by their fields (a tune log keeps the fastest rule's record);
        # then the rule for the shape, then the ones after it.
        hinted = [r for r in (mma, tensorcore, gemv) if _tuned(r.Hints, hints, quiet=True)]
        first = rule_for(spec.fmt, spec.n, spec.k, m_bucket, spec.a_dtype, spec.block_size, target)
        if hints and not hinted:
            log.warning("ignoring tuned hints %s: no rule takes them", hints)
        fmt = formats.get(spec.fmt)
        for rule in dict.fromkeys(r for r in (*hinted, first, tensorcore, gemv) if r is not None):
            tuned = _tuned(rule.Hints, hints, quiet=True)
            if rule is mma and (got := mma.apply(spec, tuned)) is not None:
                return "mma", tvm.IRModule({"main": got[0]}), got[1].to_dict()
            if rule is tensorcore and m_bucket in tensorcore.M_TILES and spec.a_dtype == "float16":
                func = make(None)  # decode in a_dtype: the tensor cores take fp16
                for h in [*tuned, None]:  # tuned, else the defaults
                    if (got := tensorcore.apply(func, target, fmt, m_bucket, h)) is not None:
                        return "tensorcore", got[0].mod, got[1].to_dict()
            if rule is gemv and m_bucket in gemv.M_TILES:
                func = make("float32")
                for h in [*tuned, None]:
                    if (got := gemv.apply(func, target, fmt, m_bucket, h)) is not None:
                        return "gemv", got[0].mod, got[1].to_dict()
        name, mod = dlight.apply(make(None), target, m_bucket)
        return name, mod, {}
    func = make("float32")
    got = next((g for h in _tuned(dict, hints) if (g := cpu.apply(func, h))), None) or cpu.apply(func)
    if got is None:
        return "unscheduled", tvm.IRModule({"main": func}), {}
    return "cpu", tvm.IRModule({"main": got[0]}), got[1]


def schedule_decode(func: tirx.PrimFunc, target: dict[str, Any]) -> tuple[str, Any]:
    """(rule name, scheduled IRModule) for the standalone decode of ``decode_func``."""
    import tvm

    if target["kind"] == "cuda":
        from mxgemm.rules import dequant

        if (sch := dequant.apply(func, target)) is not None:
            return "dequant", sch.mod
        from mxgemm.rules import dlight

        return dlight.apply(func, target, None)
    return "unscheduled", tvm.IRModule({"main": func})


def hints_problem(rule: str, config: dict[str, Any]) -> str | None:
    """Why ``config`` is not a hint set of ``rule`` (as a tune record names them), or None."""
    from mxgemm.rules import gemv, mma, tensorcore

    kinds = {"mma": mma.Hints, "gemv": gemv.Hints, "tensorcore": tensorcore.Hints}
    if rule == "cpu":
        ok = set(config) <= {"n_tile"} and config.get("n_tile", 1) in cpu.N_TILES
        return None if ok else f"cpu hints out of range: {config}"
    if rule not in kinds:
        return f"no rule {rule!r} (tunable rules: cpu, {', '.join(kinds)})"
    try:
        kinds[rule](**config)
    except (TypeError, ValueError) as e:
        return f"{rule} hints {config}: {e}"
    return None


def _tuned(kind: Callable, hints: dict[str, Any] | None, quiet: bool = False) -> list:
    """``[kind(**hints)]``, or ``[]`` when there are none or they do not fit ``kind`` (logged unless
    ``quiet``)."""
    if not hints:
        return []
    try:
        return [kind(**hints)]
    except (TypeError, ValueError) as e:
        if not quiet:
            log.warning("ignoring tuned hints %s: %s", hints, e)
        return []
