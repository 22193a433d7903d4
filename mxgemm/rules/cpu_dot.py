"""CPU rule ``cpu_dot``: many rows of bf16 activations (M ≥ 5) on x86 CPUs with AVX512-BF16, a
decode-fused GEMM on ``vdpbf16ps``. This module is the policy (when it applies, the hint space, the
defaults, the cost model); the kernel and what its hints mean are :mod:`mxgemm.codegen.cpu_dot`.
"""

from __future__ import annotations

import itertools
from typing import Any

from mxgemm import formats
from mxgemm.codegen.cpu_dot import MAX_TILE, Hints, fits, kernel, supports
from mxgemm.codegen.target import cpu_bf16_dots
from mxgemm.rules.base import Rule, Scheduled, cheapest

PREFERRED = (Hints(4, 4, 256), Hints(4, 2, 256), Hints(4, 1, 256))  # measured best first, by N


class CpuDot(Rule):
    """LLVM targets with bf16 dot products, the dynamic-M kernel (bucket None), bf16 activations and
    output, a format whose codes it decodes (:func:`mxgemm.codegen.cpu_dot.supports`), blocks of a
    multiple of 32, and a shape some hints tile."""

    name = "cpu_dot"
    Hints = Hints

    @staticmethod
    def _serves(spec: Any) -> bool:
        return (
            spec.target["kind"] == "llvm"
            and spec.op == "linear"
            and spec.m_bucket is None
            and spec.a_dtype == "bfloat16"
            and spec.out_dtype == "bfloat16"
            and spec.block_size % 32 == 0
            and supports(formats.get(spec.fmt))
            and cpu_bf16_dots(spec.target)
        )

    def candidates(self, spec: Any) -> list[Hints]:
        if not self._serves(spec):
            return []
        shapes = itertools.product((256, 128, 512), (4, 2, 1), (4, 2, 6, 8))
        every = (Hints(mr, nr, kc) for kc, nr, mr in shapes if mr * nr <= MAX_TILE)
        return [h for h in every if fits(h, spec.n, spec.k)]

    def cost(self, spec: Any, h: Hints) -> float:
        """The measured preference order (:data:`PREFERRED`), then fewer tasks than 8 per thread ranked
        down. Measured on a 2-core Zen 5 (AVX-512 BF16), 2026-11-25, mxfp4 4096², median ms, weights
        from DRAM: M=16: 4×2 1.05, 2×4 1.04, 8×1 1.21, 4×1 1.23 (K chunk 256; 512: 1.07); M=64: 4×4
        2.74, 8×2 3.03, 6×4 3.35, 8×1 3.46 (torch bf16: 1.3–1.6 and 2.8–3.4)."""
        rank = PREFERRED.index(h) if h in PREFERRED else len(PREFERRED) + h.mr * h.nr / 100
        tasks = spec.n // (16 * h.nr)
        return rank + (1.0 if tasks < 16 else 0.0)

    def default_hints(self, spec: Any) -> Hints | None:
        return cheapest(self, spec)

    def apply(self, spec: Any, make: Any, hints: Hints | None = None) -> Scheduled | None:
        """The kernel (:func:`mxgemm.codegen.cpu_dot.kernel`; ``make`` is not used: the kernel is
        written, not scheduled); None when the hints do not tile the shape."""
        del make
        h = hints if hints is not None else self.default_hints(spec)
        if h is None or not self._serves(spec) or not fits(h, spec.n, spec.k):
            return None
        import tvm

        func = kernel(formats.get(spec.fmt), n=spec.n, k=spec.k, bias=spec.bias, hints=h)
        return Scheduled(self.name, tvm.IRModule({"main": func}), h)


RULE = CpuDot()
