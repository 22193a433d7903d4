"""Schedule rules: each module holds one rule; `schedule` picks the first that applies."""

from __future__ import annotations

from typing import Any

from tvm import tirx

from mxgemm.rules import cpu


def schedule(func: tirx.PrimFunc, target: dict[str, Any], m_bucket: int | None) -> tuple[str, Any]:
    """(rule name, scheduled IRModule) for ``func`` on ``target`` serving M rows up to ``m_bucket``."""
    import tvm

    if target["kind"] == "cuda":
        from mxgemm.rules import dlight, gemv

        if m_bucket == 1 and (sch := gemv.apply(func, target)) is not None:
            return "gemv", sch.mod
        return dlight.apply(func, target, m_bucket)
    scheduled = cpu.apply(func)
    if scheduled is None:
        return "unscheduled", tvm.IRModule({"main": func})
    return "cpu", tvm.IRModule({"main": scheduled})
