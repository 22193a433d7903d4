"""Schedule rules: each module holds one rule; `schedule` picks the first that applies.

The registry: :data:`RULES` names every rule, :func:`get` returns one by name. A rule's tunable knobs
are its frozen ``Hints`` dataclass (``cpu``'s are a ``{"n_tile": t}`` dict); tune records name the
rule their hints belong to, and :func:`schedule` hands them to that rule, typed, never guessing a rule
from field names.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tvm import tirx

from mxgemm import formats
from mxgemm.rules import cpu

log = logging.getLogger(__name__)


RULES = ("cpu", "mma", "gemv", "tensorcore", "dequant", "dlight")
TUNABLE = ("cpu", "mma", "gemv", "tensorcore")  # rules with hints (what a tune record may name)


def get(name: str) -> ModuleType:
    """The rule module called ``name`` (one of :data:`RULES`; ``dlight.GEMV``-style names give dlight)."""
    base = name.split(".", maxsplit=1)[0]
    if base not in RULES:
        raise ValueError(f"no schedule rule {name!r}: rules are {', '.join(RULES)}")
    return importlib.import_module(f"mxgemm.rules.{base}")


def name_of(hints: Any) -> str:
    """The name of the rule whose ``Hints`` class ``hints`` is an instance of."""
    name = type(hints).__module__.rsplit(".", maxsplit=1)[-1]
    if name not in TUNABLE or type(hints) is not getattr(get(name), "Hints", None):
        raise TypeError(f"{hints!r} is not a schedule rule's Hints (rules with hints: {', '.join(TUNABLE)})")
    return name


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
    rule: str | None = None,
) -> tuple[str, Any, dict[str, Any]]:
    """(rule name, scheduled IRModule, the hints used) for the kernel of ``spec`` (a
    :class:`~mxgemm.codegen.build.KernelSpec`, ``op="linear"``): ``make(decode_dtype)`` gives its
    decode-fused prim_func; ``hints`` of rule ``rule`` (a tune record's) go to that rule first, typed
    by its ``Hints``; then the rule for the shape and the ones after it, with their defaults
    (``tensorcore`` → ``gemv`` → dlight). Hints that their rule does not take are logged and ignored."""
    import tvm

    m_bucket = spec.m_bucket
    if hints and rule not in TUNABLE:
        log.warning("ignoring tuned hints %s: they name no rule with hints (%r)", hints, rule)
        hints = None
    if target["kind"] == "cuda":
        from mxgemm.rules import dlight, gemv, mma, tensorcore

        typed = _tuned(get(rule).Hints, hints) if hints and rule != "cpu" else []
        tuned_rule = get(rule) if typed else None  # hints its rule refuses: as if there were none
        first = rule_for(spec.fmt, spec.n, spec.k, m_bucket, spec.a_dtype, spec.block_size, target)
        fmt = formats.get(spec.fmt)
        for r in dict.fromkeys(x for x in (tuned_rule, first, tensorcore, gemv) if x is not None):
            tuned = typed if r is tuned_rule else []
            if r is mma and (got := mma.apply(spec, tuned)) is not None:
                return "mma", tvm.IRModule({"main": got[0]}), got[1].to_dict()
            if r is tensorcore and m_bucket in tensorcore.M_TILES and spec.a_dtype == "float16":
                func = make(None)  # decode in a_dtype: the tensor cores take fp16
                for h in [*tuned, None]:  # tuned, else the defaults
                    if (got := tensorcore.apply(func, target, fmt, m_bucket, h)) is not None:
                        return "tensorcore", got[0].mod, got[1].to_dict()
            if r is gemv and m_bucket in gemv.M_TILES:
                func = make("float32")
                for h in [*tuned, None]:
                    if (got := gemv.apply(func, target, fmt, m_bucket, h)) is not None:
                        return "gemv", got[0].mod, got[1].to_dict()
        name, mod = dlight.apply(make(None), target, m_bucket)
        return name, mod, {}
    func = make("float32")
    tuned = _tuned(dict, hints) if rule == "cpu" else []
    got = next((g for h in tuned if (g := cpu.apply(func, h))), None) or cpu.apply(func)
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
    if rule not in TUNABLE:
        return f"no rule {rule!r} with hints (tunable rules: {', '.join(TUNABLE)})"
    if rule == "cpu":
        ok = set(config) <= {"n_tile"} and config.get("n_tile", 1) in cpu.N_TILES
        return None if ok else f"cpu hints out of range: {config}"
    try:
        get(rule).Hints(**config)
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
