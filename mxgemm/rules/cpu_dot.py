"""CPU rule ``cpu_dot``: many rows of bf16 activations (M ≥ 5) on x86 CPUs with AVX512-BF16, a
decode-fused GEMM on ``vdpbf16ps``. This module is the policy (when it applies, the hint space, the
defaults, the cost model); the kernel and what its hints mean are :mod:`mxgemm.codegen.cpu_dot`.
"""

from __future__ import annotations

import itertools
from typing import Any

from mxgemm import formats
from mxgemm.codegen.cpu_dot import KCS, MAX_TILE, Hints, fits, kernel, supports
from mxgemm.codegen.target import cpu_bf16_dots
from mxgemm.rules.base import Rule, Scheduled, cheapest

PREFERRED = ((4, 4), (8, 2), (4, 2), (4, 1), (2, 4))  # (mr, nr), measured best first


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
        shapes = itertools.product((kc for kc in KCS if spec.k % kc == 0), (4, 2, 1), (4, 2, 6, 8, 1))
        every = (Hints(mr, nr, kc) for kc, nr, mr in shapes if mr * nr <= MAX_TILE)
        return [h for h in every if fits(h, spec.n, spec.k)]

    def cost(self, spec: Any, h: Hints) -> float:
        """The measured preference of tile shapes (:data:`PREFERRED`), a K chunk near 256 (the largest
        dividing K up to it), and at least 16 tasks (8 a thread on 2 cores). Measured on a 2-core Zen 5
        (AVX-512 BF16), 2026-11-25, mxfp4 4096², every call on another of 12 weight copies (from
        DRAM), hint sets interleaved, median ms: M=16 4×4 0.80, 8×2 0.78, 6×2 0.84, 8×1 0.84, 4×2 0.86,
        4×1 0.87, 2×4 0.89, 6×4 0.92; M=64 4×4 2.65, 8×2 2.68, 6×2 2.84, 4×2 3.01, 2×4 3.09, 8×1 3.10, 4×1
        3.13, 6×4 3.18; M=256 4×4 10.5, 8×2 11.0, 4×2 12.0; K chunks of 128 / 256 / 512 (4×4): M=1 0.21 /
        0.24 / 0.47, M=4 0.31 / 0.38 / 0.51, M=256 10.8 / 10.5 / 10.8."""
        shape = (h.mr, h.nr)
        rank = PREFERRED.index(shape) if shape in PREFERRED else len(PREFERRED) + h.mr * h.nr / 100
        tasks = spec.n // (16 * h.nr)
        return rank + abs(256 - h.kc) / 256 + (0.5 if h.kc > 256 else 0.0) + (2.0 if tasks < 16 else 0.0)

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
