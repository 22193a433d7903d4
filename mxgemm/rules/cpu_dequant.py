"""CPU rule for the standalone decode (``op="decode"``): the many-row path decodes W once per call
into 16 or 32 bits and hands it to torch's GEMM (oneDNN), whose microkernels use the CPU's bf16 dot
products where it has them.

Parallel over row tiles. K is walked in groups of ``lanes · per`` codes (``per`` codes a byte of the
CPU layout, :func:`mxgemm.layout.cpu_planes`; ``lanes`` at most 32 and within one scale block:
:func:`mxgemm.layout.cpu_group`):
the ``lanes`` bytes of a group are one contiguous vector load and each of their ``per`` codes one
unrolled step with a constant shift, whose ``lanes`` values are stored contiguously. W is therefore
written in a permuted K order (:func:`mxgemm.layout.k_permuted`); the caller permutes the activations
the same way once per call, which leaves every product and the sum unchanged. (In the natural
order a vector of fp4 codes alternates shifts and reads each byte twice: 4096² mxfp4 into bf16 took
8.2 ms that way against 1.4 ms on a 2-core Zen 5.)
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir

from mxgemm import formats
from mxgemm.layout import cpu_group
from mxgemm.rules.base import Rule, Scheduled

ROWS = 16  # rows of W per parallel task


class CpuDequant(Rule):
    """The standalone decode on an LLVM target, K a multiple of a group."""

    name = "cpu_dequant"

    def applies(self, spec: Any) -> bool:
        group, _, _ = cpu_group(formats.get(spec.fmt).bits, spec.block_size)
        return spec.target["kind"] == "llvm" and spec.op == "decode" and spec.k % group == 0

    def apply(self, spec: Any, make: Any, hints: Any = None) -> Scheduled | None:
        """Schedules the spec's decode_func (W in ``spec.out_dtype``, the permuted K order of the
        module docstring: the function's W argument is ``[n, k / group, per, lanes]``; 3/5/6/7-bit
        codes read one a byte, :func:`mxgemm.layout.cpu_planes`). Bound by writing W: decoding by way
        of fp16 (:func:`mxgemm.codegen.decode.element_expr_f16`), which spares the few-row GEMV its
        float32 subnormals, took the same 1.25 ms for 1024×4096 into fp32 on a 2-core Zen 3."""
        if not self.applies(spec):
            return None
        group, per, lanes = cpu_group(formats.get(spec.fmt).bits, spec.block_size)
        from mxgemm.codegen.prim_func import decode_func

        del make  # it reads the planes of the GPU kernels
        func = decode_func(
            spec.fmt, n=spec.n, k=spec.k, dtype=spec.out_dtype, block_size=spec.block_size, cpu_layout=True
        )
        sch = s_tir.Schedule(func)
        dec = sch.get_sblock("decode")
        i, j = sch.get_loops(dec)
        rows = next(r for r in (ROWS, 8, 4, 2, 1) if spec.n % r == 0)
        io, ii = sch.split(i, [None, rows])
        g, lane, p = sch.split(j, [None, lanes, per])
        sch.reorder(io, ii, g, p, lane)
        sch.parallel(io)
        sch.unroll(p)
        sch.vectorize(lane)
        sch.transform_layout(dec, ("write", 0), lambda r, c: (r, c // group, c % per, c % group // per))
        return Scheduled(self.name, sch.mod, None)


RULE = CpuDequant()
