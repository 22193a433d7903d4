"""GPU rule (interim): TVM's dlight rules — GEMV for M=1, Matmul (tensor cores for fp16) otherwise,
Fallback last. Our own BitBLAS-style rules replace them where they are slower."""

from __future__ import annotations

import logging
from typing import Any

from mxgemm.rules.base import Rule, Scheduled

log = logging.getLogger(__name__)
STATIC_SMEM = 48 * 1024


class Dlight(Rule):
    """Every CUDA kernel (the last resort of the router)."""

    name = "dlight"

    def applies(self, spec: Any) -> bool:
        return spec.target["kind"] == "cuda"

    def apply(self, spec: Any, make: Any, hints: Any = None) -> Scheduled | None:
        """Schedules ``make(None)``; the name is ``dlight.<the dlight rule that applied>``."""
        import tvm
        import tvm.s_tir.dlight as dl

        if not self.applies(spec):
            return None
        func, target = make(None), spec.target
        full = tvm.target.Target(target)
        # GEMV-style rules size *static* shared arrays from the target's limit, and CUDA caps static
        # shared memory at 48 KB (more needs dynamic shared memory, which only the Matmul rule uses).
        smem = min(target["max_shared_memory_per_block"], STATIC_SMEM)
        static = tvm.target.Target({**target, "max_shared_memory_per_block": smem})
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
                    return Scheduled(f"dlight.{type(rule).__name__}", sch.mod, None)
        return None


RULE = Dlight()
