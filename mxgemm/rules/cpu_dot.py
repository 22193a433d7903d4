"""CPU rule ``cpu_dot``: a decode-fused GEMM for any M on x86 CPUs with AVX-512 (BW): on
``vdpbf16ps`` for bf16 activations where the CPU has AVX512-BF16, else on fp32 multiply-adds. This
module is the policy (when it applies, the hint space, the defaults, the cost model); the kernel and
what its hints mean are :mod:`mxgemm.codegen.cpu_dot`.
"""

from __future__ import annotations

import itertools
from typing import Any

from mxgemm import formats
from mxgemm.codegen.cpu_dot import KCS, MAX_TILE, Hints, fits, kernel, supports
from mxgemm.codegen.target import cpu_bf16_dots, cpu_word_lookups
from mxgemm.rules.base import Rule, Scheduled, cheapest

# (mr, nr) by the kernel's dot, measured best first (fp32 multiply-adds hold twice the weight registers)
PREFERRED = {
    "bf16": ((4, 4), (8, 2), (4, 2), (4, 1), (2, 4)),
    "fma": ((4, 2), (8, 1), (6, 2), (4, 4), (4, 1)),
}


class CpuDot(Rule):
    """LLVM targets with AVX512-BW (:meth:`dot`), the dynamic-M kernel (bucket None), fp16 or bf16
    activations and output, a format whose codes it decodes (:func:`mxgemm.codegen.cpu_dot.supports`),
    blocks of a multiple of 32, and a shape some hints tile."""

    name = "cpu_dot"
    Hints = Hints

    @staticmethod
    def dot(spec: Any) -> str | None:
        """How the kernel multiplies for ``spec``'s target and activations
        (:func:`mxgemm.codegen.cpu_dot.kernel`): ``"bf16"`` for bfloat16 rows where the CPU has bf16
        dot products, else ``"fma"`` where it has AVX512-BW; None where neither."""
        if spec.a_dtype == "bfloat16" and cpu_bf16_dots(spec.target):
            return "bf16"
        return "fma" if cpu_word_lookups(spec.target) else None

    def _serves(self, spec: Any) -> bool:
        return (
            spec.target["kind"] == "llvm"
            and spec.op == "linear"
            and spec.m_bucket is None
            and spec.a_dtype in ("bfloat16", "float16")
            and spec.out_dtype == spec.a_dtype
            and spec.block_size % 32 == 0
            and supports(formats.get(spec.fmt))
            and self.dot(spec) is not None
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
        0.24 / 0.47, M=4 0.31 / 0.38 / 0.51, M=256 10.8 / 10.5 / 10.8. With fp32 multiply-adds (fp16
        rows): M=16 4×2 1.41, 8×1 1.36, 4×4 1.59, 6×2 1.57; M=64 4×2 5.27, 6×2 5.55, 8×1 5.60, 4×4
        5.86, 4×1 6.40, 8×2 6.63."""
        shape, prefs = (h.mr, h.nr), PREFERRED[self.dot(spec) or "bf16"]
        rank = prefs.index(shape) if shape in prefs else len(prefs) + h.mr * h.nr / 100
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

        f = formats.get(spec.fmt)
        args = dict(n=spec.n, k=spec.k, bias=spec.bias, hints=h, a_dtype=spec.a_dtype, dot=self.dot(spec))
        func = kernel(f, **args)
        return Scheduled(self.name, tvm.IRModule({"main": func}), h)


RULE = CpuDot()
