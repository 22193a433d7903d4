"""GPU rule (interim): TVM's dlight rules — GEMV for M=1, Matmul (tensor cores for fp16) otherwise,
Fallback last. Our own BitBLAS-style rules replace them where they are slower."""

from __future__ import annotations

import logging
from typing import Any

from tvm import tirx

log = logging.getLogger(__name__)
STATIC_SMEM = 48 * 1024


def apply(func: tirx.PrimFunc, target: dict[str, Any], m_bucket: int | None) -> tuple[str, Any]:
    """(name of the dlight rule that applied, scheduled IRModule)."""
    import tvm
    import tvm.s_tir.dlight as dl

    full = tvm.target.Target(target)
    # GEMV-style rules size *static* shared arrays from the target's limit, and CUDA caps static shared
    # memory at 48 KB (more needs dynamic shared memory, which only the Matmul rule uses).
    static = tvm.target.Target(
        {**target, "max_shared_memory_per_block": min(target["max_shared_memory_per_block"], STATIC_SMEM)}
    )
    for rule in (dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Matmul(), dl.gpu.Fallback()):
        tgt = full if isinstance(rule, dl.gpu.Matmul) else static
        with tgt:
            try:
                sch = rule.apply(func, tgt, False)
            except Exception as e:  # noqa: BLE001 (a rule whose analysis chokes does not apply)
                log.debug("dlight %s does not apply: %s", type(rule).__name__, e)
                continue
            if isinstance(sch, list):
                sch = sch[0] if sch else None
            if sch is not None:
                return f"dlight.{type(rule).__name__}", sch.mod
    raise RuntimeError(f"no GPU schedule rule applies to this function (m_bucket={m_bucket})")
