"""GPU rule for fp16 activations at small and mid M (buckets 1, 4, 16, 64): tensor cores fed from
registers (``mma.sync.m16n8k16``), the codes decoded two per integer op (:mod:`mxgemm.codegen.pairs`).

The kernel is written as low-level TensorIR (threads, registers, ``ptx_legacy.mma``), not scheduled
from the prim_func, because the mma operand has to be *computed* in registers: no shared-memory
round trip of the decoded tile (the ``tensorcore`` rule's limit) and no float FMA per weight (the
``gemv`` rule's limit). Semantics are those of :func:`mxgemm.codegen.prim_func.prim_func`.

Operands are swapped (``Y^T = W X^T``, as Marlin does for small batches): 16 weight rows are the
mma's M and 8 activation rows its N, so M ≤ 8 wastes no tensor-core work on padding, and each
thread holds two weight rows, whose two scales per step it applies (one per 8 decoded codes).
Layout: the portable code planes, unchanged. The mma's 16-deep K is a permutation of real K chosen
so that a thread's operands are 8 consecutive codes of each of its rows (one ``w``-byte load per
plane) and 8 consecutive activations (one 16-byte load): in K step ``u`` (32 k, one scale block)
lane ``l`` takes rows ``l / 4`` and ``l / 4 + 8`` at k ``32u + 8 (l % 4) + 0..7``; mma ``g`` takes k
``+4g .. +4g+3`` of every lane. A step's two mmas share one scale per weight row, so they go to a
zeroed fp32 fragment that is added to the accumulator times the scale (exact: a power of two).

Grid: ``N / (16 nt)`` blocks of ``kw`` warps; a warp owns ``nt`` 16-row weight tiles × the M tile
(n8 tiles: the bucket, padded; rows ≥ M read zeros and are not stored) over ``1/kw`` of K; the
warps of a block add up through shared memory.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from tvm import tirx

from mxgemm import formats
from mxgemm.codegen import pairs
from mxgemm.codegen import target as targets
from mxgemm.codegen.decode import scale_expr
from mxgemm.layout import plane_widths

M_TILES = (1, 4, 16, 64)  # M buckets this rule serves
STEP = 32  # K per step: 4 threads × 8 codes
SMEM = 48 * 1024  # static shared memory per block


@dataclass(frozen=True)
class Hints:
    """Tunable knobs. nt: 16-row weight tiles per warp (1, 2, 4, 8); kw: warps per block, splitting K
    (1, 2, 4, 8); unroll: K steps per loop iteration, their loads issued together (1, 2, 4)."""

    nt: int = 4
    kw: int = 4
    unroll: int = 2

    def __post_init__(self) -> None:
        if self.nt not in (1, 2, 4, 8) or self.kw not in (1, 2, 4, 8) or self.unroll not in (1, 2, 4):
            raise ValueError(f"mma hints out of range: {self}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def applies(fmt: formats.Format, block_size: int, a_dtype: str, m_bucket: int | None) -> bool:
    """fp16 activations, a bucket of :data:`M_TILES`, a format whose codes are exact in fp16 and
    one scale per step (block ≥ 32)."""
    return a_dtype == "float16" and m_bucket in M_TILES and block_size >= STEP and pairs.supported(fmt)


def fits(h: Hints, n: int, k: int, plane_bits: int = 0) -> bool:
    """Whether ``h`` tiles an ``[n, k]`` weight (any code width: a step is 32 k of every plane)."""
    del plane_bits
    return n % (16 * h.nt) == 0 and k % STEP == 0 and (k // STEP) % (h.kw * h.unroll) == 0


def shape_fits(n: int, k: int) -> bool:
    """Whether some hints tile an ``[n, k]`` weight."""
    return any(fits(h, n, k) for h in candidates(n, 1))


def smem_bytes(h: Hints, m_tile: int) -> int:
    """Shared memory of the cross-warp sum: every warp but the first parks its accumulators."""
    return (h.kw - 1) * h.nt * -(-m_tile // 8) * 4 * 32 * 4


def candidates(n: int, m_tile: int) -> list[Hints]:
    """The hint space the tuner searches (deterministic order; only combinations that tile N, fit
    the 48 KB of static shared memory and keep the accumulators ≤ 64 registers)."""
    space = (Hints(*h) for h in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4)))
    return [
        h
        for h in space
        if n % (16 * h.nt) == 0 and smem_bytes(h, m_tile) <= SMEM and h.nt * -(-m_tile // 8) <= 16
    ]


def cost(h: Hints, target: dict[str, Any], n: int, k: int, plane_bits: int, m_tile: int) -> float:
    """Relative cost (lower is better) for ranking candidates: ≈ 24 KB of weight loads in flight per
    SM (Little's law at HBM3 latency), the cross-warp reduction, and registers (accumulators grow
    with nt × the M tile)."""
    del k
    sms = targets.sm_count(target["arch"])
    blocks = n // (16 * h.nt)
    warps = min(blocks * h.kw, sms * 32)
    inflight = warps * 32 * 2 * plane_bits * h.unroll * h.nt
    starved = max(1.0, sms * 24 * 1024 / inflight)
    waves = -(-blocks // (sms * max(1, 16 // h.kw)))
    regs = 1.0 + 0.1 * max(0, h.nt * -(-m_tile // 8) - 8)
    return starved * regs * (1 + 0.02 * h.kw) * (1 + 0.05 * (waves > 1))


def default_hints(target: dict[str, Any], n: int, k: int, plane_bits: int, m_tile: int) -> Hints | None:
    """What measured fastest on an H100 (``benchmarks/README.md``): one weight tile and 4 steps in
    flight per warp up to 16 rows, 4 warps a block (8 when N gives fewer than 4 blocks an SM); two
    tiles and 2 steps at 64 rows (the accumulators double). Else the first smaller fitting
    configuration, else the cheapest candidate by :func:`cost`; None when nothing tiles the shape."""
    sms = targets.sm_count(target["arch"])
    if m_tile <= 16:
        kw = 8 if n // 16 <= 4 * sms else 4
        prefs = [(1, kw, 4), (1, 4, 4), (1, 2, 4), (1, 1, 4), (1, 4, 2), (1, 2, 2), (1, 1, 2)]
    else:
        prefs = [(2, 4, 2), (1, 4, 2), (1, 2, 2), (1, 1, 2), (1, 4, 1)]
    cands = [h for h in candidates(n, m_tile) if fits(h, n, k)]
    first = next((Hints(*p) for p in prefs if Hints(*p) in cands), None)
    return first or (min(cands, key=lambda h: cost(h, target, n, k, plane_bits, m_tile)) if cands else None)


def apply(spec: Any, tuned: list[Hints]) -> tuple[tirx.PrimFunc, Hints] | None:
    """(kernel, hints used) for a :class:`~mxgemm.codegen.build.KernelSpec` (``op="linear"``): the
    first of ``tuned`` that fits, else the defaults; None when the rule does not apply or nothing
    tiles the shape."""
    fmt = formats.get(spec.fmt)
    if not applies(fmt, spec.block_size, spec.a_dtype, spec.m_bucket):
        return None
    h = next((t for t in tuned if fits(t, spec.n, spec.k) and smem_bytes(t, spec.m_bucket) <= SMEM), None)
    h = h or default_hints(spec.target, spec.n, spec.k, plane_widths(fmt.bits)[0], spec.m_bucket)
    if h is None:
        return None
    args = dict(n=spec.n, k=spec.k, m_tile=spec.m_bucket, out_dtype=spec.out_dtype, bias=spec.bias)
    return kernel(fmt, **args, block_size=spec.block_size, hints=h), h


def kernel(
    fmt: formats.Format,
    *,
    n: int,
    k: int,
    m_tile: int,
    out_dtype: str,
    bias: bool,
    block_size: int,
    hints: Hints,
) -> tirx.PrimFunc:
    """The kernel as a PrimFunc with :func:`~mxgemm.codegen.prim_func.prim_func`'s arguments: A
    ``float16 [m, k]`` (``m`` static 1 for the bucket 1, else dynamic), the code planes ``uint8 [n,
    k*w/8]``, S ``uint8 [n, k/block_size]``, Bias ``out_dtype [n]`` (if ``bias``), Y ``out_dtype [m, n]``."""
    # here, not at import: a GPU box with the TVM runtime alone runs prebuilt kernels and routes with
    # this module, and its TVM has no script builder
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    h = hints
    widths = plane_widths(fmt.bits)
    xt_n = -(-m_tile // 8)  # n8 tiles of activation rows
    steps = k // STEP // h.kw  # K steps per warp
    wide = n * k >= 2**31
    # scales of `unroll` = 4 steps in one 32-bit load (block 32, rows 4-byte aligned)
    s_word = block_size == STEP and h.unroll == 4 and (k // STEP) % 4 == 0
    pipe_x = xt_n <= 2

    def ix(v):
        return tirx.Cast("int64", v) if wide else v

    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("main")
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            m = 1 if m_tile == 1 else tirx.Var("m", "int64")
            m64 = tirx.const(1, "int64") if m_tile == 1 else m
            a_h = T.arg("A", T.handle())
            b_h = [T.arg(f"B{i}" if len(widths) > 1 else "B", T.handle()) for i in range(len(widths))]
            s_h = T.arg("S", T.handle())
            bias_h = T.arg("Bias", T.handle()) if bias else None
            y_h = T.arg("Y", T.handle())
            A = T.match_buffer(a_h, (m, k), "float16")
            B = [T.match_buffer(bh, (n, k * w // 8), "uint8") for bh, w in zip(b_h, widths, strict=True)]
            S = T.match_buffer(s_h, (n, k // block_size), "uint8")
            Bias = T.match_buffer(bias_h, (n,), out_dtype) if bias else None
            Y = T.match_buffer(y_h, (m, n), out_dtype)

            bx, ty, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.y"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, n // (16 * h.nt)), T.launch_thread(ty, h.kw), T.launch_thread(tx, 32):
                x32 = T.decl_buffer((m * k // 2,), "uint32", data=A.data)
                s32 = T.decl_buffer((n * k // block_size // 4,), "uint32", data=S.data) if s_word else None
                # per plane: a view whose element is (part of) one thread's w bytes of a step
                views = []
                for bb, w in zip(B, widths, strict=True):
                    vdt, per = {8: ("uint32", 4), 4: ("uint32", 4), 2: ("uint16", 2), 1: ("uint8", 1)}[w]
                    views.append((T.decl_buffer((n * k * w // 8 // per,), vdt, data=bb.data), w, per))
                acc = T.alloc_buffer((h.nt, xt_n, 4), "float32", scope="local")
                tmp = T.alloc_buffer((h.nt, xt_n, 4), "float32", scope="local")
                xraw = T.alloc_buffer((h.unroll, xt_n, 4), "uint32", scope="local")
                xcur = T.alloc_buffer(xraw.shape, "uint32", scope="local")
                wraw = T.alloc_buffer((h.unroll, h.nt, 2, len(widths), 2), "uint32", scope="local")
                sraw = T.alloc_buffer((h.unroll if not s_word else 1, h.nt, 2), "uint32", scope="local")
                wcur = T.alloc_buffer(wraw.shape, "uint32", scope="local")
                scur = T.alloc_buffer(sraw.shape, "uint32", scope="local")
                afr = T.alloc_buffer((h.nt, 2, 4), "uint32", scope="local")
                bfr = T.alloc_buffer((xt_n, 2, 2), "uint32", scope="local")

                quad, j = tx // 4, tx % 4
                n0 = bx * (16 * h.nt)
                for t, a, e in itertools.product(range(h.nt), range(xt_n), range(4)):
                    T.buffer_store(acc, tirx.const(0.0, "float32"), [t, a, e])
                for u, a, q in itertools.product(range(h.unroll), range(xt_n), range(4)):
                    T.buffer_store(xraw, tirx.const(0, "uint32"), [u, a, q])
                    T.buffer_store(xcur, tirx.const(0, "uint32"), [u, a, q])

                def load_weights(it, wbuf, sbuf):
                    """The codes and scales of iteration ``it`` (``unroll`` steps) into registers."""
                    step0 = ty * steps + it * h.unroll
                    if s_word:
                        for t, r in itertools.product(range(h.nt), range(2)):
                            row = n0 + 16 * t + quad + 8 * r
                            val = tirx.BufferLoad(s32, [(ix(row) * (k // STEP) + step0) // 4])
                            T.buffer_store(sbuf, val, [0, t, r])
                    for ur, t, r in itertools.product(range(h.unroll), range(h.nt), range(2)):
                        step, row = step0 + ur, n0 + 16 * t + quad + 8 * r
                        for p, (view, w, per) in enumerate(views):
                            # this thread's w bytes: (row * k + 32 step + 8 j) * w / 8
                            base = ix(row) * (k * w // 8 // per) + (step * (4 * w) + j * w) // per
                            for q in range(max(1, w // 4)):
                                val = tirx.Cast("uint32", tirx.BufferLoad(view, [base + q]))
                                T.buffer_store(wbuf, val, [ur, t, r, p, q])
                        if not s_word:
                            val = tirx.Cast("uint32", tirx.BufferLoad(S, [row, step * STEP // block_size]))
                            T.buffer_store(sbuf, val, [ur, t, r])

                def load_x(it, xbuf):
                    """The activations of iteration ``it`` (rows ≥ M keep their zeros)."""
                    step0 = ty * steps + it * h.unroll
                    for ur, a in itertools.product(range(h.unroll), range(xt_n)):
                        xrow = tirx.Cast("int64", a * 8 + quad)
                        with T.If(xrow < m64):
                            with T.Then():
                                off = xrow * (k // 2) + ix((step0 + ur) * 16 + j * 4)
                                vec = tirx.BufferLoad(x32, [tirx.Ramp(off, 1, 4)])
                                T.buffer_store(xbuf, vec, [ur, a, tirx.Ramp(0, 1, 4)])

                def compute(wbuf, sbuf, xbuf):
                    """Decode, mma, scale, accumulate one iteration."""
                    for ur in range(h.unroll):
                        for t, g, q in itertools.product(range(h.nt), range(2), range(4)):
                            # a0..a3: rows quad / quad+8 × codes (4g, 4g+1) / (4g+2, 4g+3)
                            word = lambda p, i, ur=ur, t=t, r=q % 2: tirx.BufferLoad(wbuf, [ur, t, r, p, i])  # noqa: E731
                            T.buffer_store(afr, pairs.decode_pair(fmt, word, 2 * g + q // 2), [t, g, q])
                        for a, g, q in itertools.product(range(xt_n), range(2), range(2)):
                            T.buffer_store(bfr, tirx.BufferLoad(xbuf, [ur, a, 2 * g + q]), [a, g, q])
                        for t, a in itertools.product(range(h.nt), range(xt_n)):
                            for e in range(4):
                                T.buffer_store(tmp, tirx.const(0.0, "float32"), [t, a, e])
                            for g in range(2):
                                T.evaluate(
                                    T.ptx_legacy.mma(
                                        "m16n8k16", "row", "col", "fp16", "fp16", "fp32",
                                        afr.data, (t * 2 + g) * 4, bfr.data, (a * 2 + g) * 2,
                                        tmp.data, (t * xt_n + a) * 4, False, dtype="float32",
                                    )
                                )  # fmt: skip
                        for t, r in itertools.product(range(h.nt), range(2)):
                            if s_word:
                                code = tirx.BufferLoad(sbuf, [0, t, r]) >> tirx.const(8 * ur, "uint32")
                                code = code & tirx.const(255, "uint32")
                            else:
                                code = tirx.BufferLoad(sbuf, [ur, t, r])
                            sc = scale_expr(code)
                            for a, e in itertools.product(range(xt_n), (2 * r, 2 * r + 1)):
                                prod = tirx.BufferLoad(acc, [t, a, e]) + tirx.BufferLoad(tmp, [t, a, e]) * sc
                                T.buffer_store(acc, prod, [t, a, e])

                def copy(dst, src):
                    for idx in itertools.product(*(range(int(d)) for d in src.shape)):
                        T.buffer_store(dst, tirx.BufferLoad(src, list(idx)), list(idx))

                # software pipeline: iteration it + 1's loads are in flight while it computes (the
                # activations too, up to 16 rows; 64 rows would take too many registers)
                iters = steps // h.unroll
                load_weights(0, wraw, sraw)
                if pipe_x:
                    load_x(0, xraw)
                with T.serial(0, iters - 1) as it:
                    copy(wcur, wraw)
                    copy(scur, sraw)
                    if pipe_x:
                        copy(xcur, xraw)
                    load_weights(it + 1, wraw, sraw)
                    if pipe_x:
                        load_x(it + 1, xraw)
                    else:
                        load_x(it, xcur)
                    compute(wcur, scur, xcur)
                if not pipe_x:
                    load_x(iters - 1, xraw)
                compute(wraw, sraw, xraw)
                # cross-warp sum, then the epilogue (warp 0)
                if h.kw > 1:
                    red = T.alloc_buffer((h.kw - 1, h.nt, xt_n, 4, 32), "float32", scope="shared")
                    with T.If(ty > 0):
                        with T.Then():
                            for t, a, e in itertools.product(range(h.nt), range(xt_n), range(4)):
                                T.buffer_store(red, tirx.BufferLoad(acc, [t, a, e]), [ty - 1, t, a, e, tx])
                    T.evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))
                with T.If(ty == 0):
                    with T.Then():
                        for t, a, e in itertools.product(range(h.nt), range(xt_n), range(4)):
                            total = tirx.BufferLoad(acc, [t, a, e])
                            for w_ in range(h.kw - 1):
                                total = total + tirx.BufferLoad(red, [w_, t, a, e, tx])
                            row = a * 8 + j * 2 + e % 2
                            col = n0 + 16 * t + quad + 8 * (e // 2)
                            val = total * tirx.const(pairs.out_factor(fmt), "float32")
                            if bias:
                                val = val + tirx.Cast("float32", tirx.BufferLoad(Bias, [col]))
                            with T.If(tirx.Cast("int64", row) < m64):
                                with T.Then():
                                    T.buffer_store(Y, tirx.Cast(out_dtype, val), [row, col])
    return ib.get()
