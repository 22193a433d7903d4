"""Schedule rules: each module holds one rule; `schedule` picks the first that applies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvm import tirx

from mxgemm.rules import cpu


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
        from mxgemm.rules import dlight, gemv

        if m_bucket in gemv.M_TILES:
            got = gemv.apply(make("float32"), target, m_bucket, gemv.Hints(**hints) if hints else None)
            if got is not None:
                return "gemv", got[0].mod, got[1].to_dict()
        name, mod = dlight.apply(make(None), target, m_bucket)
        return name, mod, {}
    scheduled = cpu.apply(make("float32"))
    if scheduled is None:
        return "unscheduled", tvm.IRModule({"main": make("float32")}), {}
    return "cpu", tvm.IRModule({"main": scheduled}), {}


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
