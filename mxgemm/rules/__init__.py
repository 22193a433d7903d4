"""Schedule rules: each module holds one rule; `schedule` picks the first that applies."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tvm import tirx

from mxgemm.rules import cpu

log = logging.getLogger(__name__)


def schedule(
    make: Callable[[str | None], tirx.PrimFunc],
    target: dict[str, Any],
    m_bucket: int | None,
    hints: dict[str, Any] | None = None,
) -> tuple[str, Any, dict[str, Any]]:
    """(rule name, scheduled IRModule, the hints used) for the decode-fused prim_func ``make(decode_dtype)``
    on ``target`` serving M rows up to ``m_bucket``; ``hints`` (from a tune log) override the rule's
    defaults."""
    import tvm

    if target["kind"] == "cuda":
        from mxgemm.rules import dlight, gemv, tensorcore

        if m_bucket in tensorcore.M_TILES:
            func = make(None)  # decode in a_dtype: the tensor cores take fp16
            for h in _tuned(tensorcore.Hints, hints) + [None]:  # tuned, else the defaults
                if (got := tensorcore.apply(func, target, m_bucket, h)) is not None:
                    return "tensorcore", got[0].mod, got[1].to_dict()

        if m_bucket in gemv.M_TILES:
            func = make("float32")
            for h in _tuned(gemv.Hints, hints) + [None]:  # tuned, else the defaults
                if (got := gemv.apply(func, target, m_bucket, h)) is not None:
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


def _tuned(kind: Callable, hints: dict[str, Any] | None) -> list:
    """``[kind(**hints)]``, or ``[]`` when there are none or they do not fit ``kind`` (logged)."""
    if not hints:
        return []
    try:
        return [kind(**hints)]
    except (TypeError, ValueError) as e:
        log.warning("ignoring tuned hints %s: %s", hints, e)
        return []
