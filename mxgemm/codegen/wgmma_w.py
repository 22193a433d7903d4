"""A decode-fused GEMM on Hopper's wgmma for mid and large M: MX/BFP weights × fp16/bf16 activations.

Operands are swapped as in :mod:`~mxgemm.codegen.mma` (``Y^T = W X^T``): a warpgroup's 64 weight rows
are the wgmma's M, decoded in registers straight into its A fragment (``wgmma ... m64n{m_tile}k16``
with A from registers, per warp the layout of ``mma.sync.m16n8k16``'s A:
:func:`~mxgemm.codegen.pairs.decode_pair`), and ``m_tile`` activation rows its N, read by the tensor
cores from shared memory (128-byte-swizzled, :mod:`~mxgemm.codegen.wgmma`). The block scales are
folded into the decoded pairs (:func:`~mxgemm.codegen.pairs.fold`: each pair times
``2^(code - row max + c0)``, one exact ``fma``),
so the wgmmas accumulate the whole K in fp32 and each output is brought to scale once (``ldexpf``).
That needs every row's scale codes within the fold's spread of the row's largest and no NaN code:
:func:`foldable` checks a weight once; the row maxima are an argument (R).

Codes are read in the kernel's own K order (:func:`permute_codes`): within each 32-code block, lane
``j``'s 8 codes are those of K ``2j, 2j+1, 2j+8, 2j+9`` (the step's first k16 wgmma) and ``+16`` (its
second), so the activations stay in natural K order.

Block: ``wg`` warpgroups (64 weight rows each) × ``m_tile`` activation rows, over K in slots of 128
(4 scale steps, 8 wgmmas). A ``cp.async`` ring of ``stages`` slots holds the activations (two
128-byte-swizzled halves of 64 K), the codes (XOR-swizzled 16-byte chunks a row, so a quarter-warp's
8 rows hit distinct banks) and the scale codes (4 bytes a row). Each iteration decodes the slot's 4
steps into 32 fragment registers, issues its 8 wgmmas and waits for them; with ``Hints.double`` two
sets of fragments alternate, the next slot decoded while this one's wgmmas run (``wait_group 1``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import torch
from tvm import tirx

from mxgemm import formats
from mxgemm.codegen import pairs
from mxgemm.codegen.decode import u32
from mxgemm.codegen.wgmma import (
    ROW,
    SMEM_MAX,
    cached,
    descriptor,
    main_args,
    ring_turn,
    smem_addr,
    swizzled,
    when,
)

STEP = 32  # K per scale block: two k16 wgmmas
BK = 128  # K per ring slot
WIDTHS = (4, 8)  # code widths with one bit plane


@dataclass(frozen=True)
class Hints:
    """wg: warpgroups per block (1..4), 64 weight rows each; stages: ring slots (3..6); double: 1 to
    decode the next slot while this one's wgmmas run (two fragment sets)."""

    wg: int = 2
    stages: int = 4
    double: int = 1

    def __post_init__(self) -> None:
        if self.wg not in (1, 2, 3, 4) or not 3 <= self.stages <= 6 or self.double not in (0, 1):
            raise ValueError(f"wgmma_w hints {self}: wg 1..4, stages 3..6, double 0|1")

    def slot_bytes(self, m_tile: int, bits: int) -> tuple[int, int, int]:
        """Byte offsets in a slot of the codes and the scale codes, and the slot's size."""
        codes = 2 * m_tile * ROW
        scales = codes + 64 * self.wg * 16 * bits
        return codes, scales, -(-(scales + 64 * self.wg * 4) // 1024) * 1024


def applies(fmt: formats.Format, n: int, k: int, m_tile: int, a_dtype: str, h: Hints = Hints()) -> str | None:
    """Why the kernel cannot run ``[*, k] @ [n, k]^T`` of ``fmt`` weights, or None."""
    if fmt.bits not in WIDTHS:
        return f"{fmt.name}: codes of {fmt.bits} bits (one plane of 4 or 8 bits wanted)"
    if pairs.fold(fmt, a_dtype) is None:
        return f"{fmt.name} pairs in {a_dtype} take no folded scale"
    if n % (64 * h.wg):
        return f"N={n} is not a multiple of {64 * h.wg}"
    if k % (2 * BK if h.double else BK):
        return f"K={k} is not a multiple of {2 * BK if h.double else BK}"
    if m_tile not in (64, 128, 256):
        return f"M tile {m_tile} (64, 128 or 256)"
    if h.stages * h.slot_bytes(m_tile, fmt.bits)[2] > SMEM_MAX:
        return f"{h.stages} slots of {h.slot_bytes(m_tile, fmt.bits)[2]} bytes exceed {SMEM_MAX}"
    return None


def foldable(fmt: formats.Format, scales: torch.Tensor, a_dtype: str) -> bool:
    """Whether every row of uint8 E8M0 ``scales [n, k/32]`` lies within the fold's spread of its largest
    code, with no NaN (255) code: the kernel's condition."""
    f = pairs.fold(fmt, a_dtype)
    if f is None:
        return False
    top, bottom = scales.amax(dim=1).int(), scales.amin(dim=1).int()
    return bool(((top != 255) & (top - bottom <= f.spread)).all())


def permute_codes(blocks: torch.Tensor, bits: int) -> torch.Tensor:
    """Portable uint8 codes ``[n, k*bits/8]`` → the kernel's K order (module docstring), same shape:
    stored code ``8j + 4g + 2h + e`` of each 32-code block is code ``16g + 8h + 2j + e``."""
    from mxgemm import packing

    n = blocks.shape[0]
    codes = packing.unpack(blocks, bits).reshape(n, -1, STEP)
    j, g, h, e = torch.meshgrid(*(torch.arange(s) for s in (4, 2, 2, 2)), indexing="ij")
    src = (16 * g + 8 * h + 2 * j + e).reshape(-1).to(blocks.device)
    return packing.pack(codes[:, :, src].reshape(n, -1), bits)


def kernel(
    fmt: formats.Format,
    *,
    n: int,
    k: int,
    m_tile: int,
    out_dtype: str,
    bias: bool,
    a_dtype: str,
    hints: Hints = Hints(),
) -> tirx.PrimFunc:
    """The kernel as a PrimFunc: A ``a_dtype [m, k]`` (m dynamic), B uint8 ``[n, k*bits/8]``
    (:func:`permute_codes`), S uint8 ``[n, k/32]``, R uint8 ``[n]`` (each row's largest scale code),
    Bias ``out_dtype [n]`` (if ``bias``), Y ``out_dtype [m, n]``."""
    why = applies(fmt, n, k, m_tile, a_dtype, hints)
    if why:
        raise ValueError(f"wgmma_w: {why}")
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder() as ib:
        with T.prim_func():
            _Kernel(T, fmt, n, k, m_tile, out_dtype, bias, a_dtype, hints).emit()
    return ib.get()


def compiled(fmt: str, n: int, k: int, m_tile: int, dtype: str, bias: bool, hints: Hints = Hints()):
    """The kernel (called ``f(A, B, S, R, [Bias], Y)``, :func:`kernel`'s arguments, activations and
    outputs in ``dtype``), built once into the kernel cache."""
    spec = {"op": "wgmma_w", "fmt": fmt, "n": n, "k": k, "m_tile": m_tile, "dtype": dtype, "bias": bias}
    f = formats.get(fmt)
    return cached(
        {**spec, "hints": asdict(hints)},
        lambda: kernel(f, n=n, k=k, m_tile=m_tile, out_dtype=dtype, bias=bias, a_dtype=dtype, hints=hints),
    )


class _Kernel:
    def __init__(self, T, fmt, n, k, m_tile, out_dtype, bias, a_dtype, h: Hints):  # noqa: N803, PLR0913
        self.T, self.fmt, self.n, self.k, self.m_tile = T, fmt, n, k, m_tile
        self.out_dtype, self.bias, self.a_dtype, self.h = out_dtype, bias, a_dtype, h
        self.w = fmt.bits  # bytes of a lane's 8 codes of a row
        self.fold = pairs.fold(fmt, a_dtype)
        self.fma = pairs.bf16_fma(fmt, a_dtype)
        self.codes_off, self.scales_off, self.slot = h.slot_bytes(m_tile, fmt.bits)
        self.iters = k // BK
        self.ahead = h.stages - 2 if h.double else h.stages - 1
        self.frag = m_tile // 2  # fp32 registers of a thread's m64n{m_tile} fragment

    def emit(self) -> None:
        T, h, n, k = self.T, self.h, self.n, self.k
        m, handles, bias_h, y_h = main_args(T, ("A", "B", "S", "R"), self.bias)
        self.m = m
        self.A = T.match_buffer(handles[0], (m, k), self.a_dtype)
        self.B = T.match_buffer(handles[1], (n, k * self.w // 8), "uint8")
        self.S = T.match_buffer(handles[2], (n, k // STEP), "uint8")
        self.R = T.match_buffer(handles[3], (n,), "uint8")
        self.Bias = T.match_buffer(bias_h, (n,), self.out_dtype) if self.bias else None
        self.Y = T.match_buffer(y_h, (m, n), self.out_dtype)

        bx, by, tx = T.env_thread("blockIdx.x"), T.env_thread("blockIdx.y"), T.env_thread("threadIdx.x")
        m_tiles = tirx.Cast("int32", (m + (self.m_tile - 1)) // self.m_tile)
        with (
            T.launch_thread(bx, m_tiles),
            T.launch_thread(by, n // (64 * h.wg)),
            T.launch_thread(tx, 128 * h.wg),
        ):
            self.tx, self.m0, self.n0 = tx, tirx.Cast("int64", bx) * self.m_tile, by * (64 * h.wg)
            self.wg, self.warp, self.lane = tx // 128, tx % 128 // 32, tx % 32
            self.quad, self.j = self.lane // 4, self.lane % 4
            self.ring = T.alloc_buffer((h.stages * self.slot // 16,), "uint32x4", scope="shared.dyn")
            self.acc = T.alloc_buffer((self.frag,), "float32", scope="local")
            self.afr = T.alloc_buffer((1 + h.double, BK // STEP, 2, 4), "uint32", scope="local")
            self.desc = T.alloc_buffer((1,), "uint64", scope="local")
            for i in range(self.frag):
                T.buffer_store(self.acc, tirx.const(0.0, "float32"), [i])
            self.rows_fold()
            self.loop()
            self.epilogue()

    # ---- the rows' fold ------------------------------------------------------------------------

    def row(self, r: int):
        """This thread's weight row ``r`` (0: ``quad``, 1: ``quad + 8``) within the block."""
        return self.wg * 64 + self.warp * 16 + self.quad + 8 * r

    def rows_fold(self) -> None:
        """The multiplier addends (:attr:`fold_add`) and output exponents (:attr:`out_exp`) of this
        thread's two rows, from their largest scale codes (R)."""
        T, fold = self.T, self.fold
        self.fold_add = T.alloc_buffer((2,), "uint32", scope="local")
        self.out_exp = T.alloc_buffer((2,), "int32", scope="local")
        oe = round(math.log2(pairs.out_factor(self.fmt)))
        for r in range(2):
            top = u32(tirx.BufferLoad(self.R, [self.n0 + self.row(r)]))
            T.buffer_store(self.fold_add, (u32(fold.offset + fold.c0) - top) * u32(fold.mul), [r])
            T.buffer_store(self.out_exp, tirx.Cast("int32", top) - (127 + fold.c0 - oe), [r])

    # ---- shared memory ------------------------------------------------------------------------

    def _addr(self, slot, byte):
        return smem_addr(self.T, self.ring, slot * self.slot + byte)

    def _code_chunk(self, row, chunk):
        """Where 16-byte chunk ``chunk`` of a row's codes in a slot lives (XOR-moved so the 8 rows a
        quarter-warp reads start in distinct banks)."""
        pieces = 16 * self.w // 16  # chunks a row
        key = row % 8 if pieces >= 8 else (row // 2) % 4 if pieces == 4 else 0
        return self.codes_off + row * 16 * self.w + tirx.bitwise_xor(chunk, key % pieces) * 16

    def issue(self, it, slot) -> None:
        """``cp.async`` of iteration ``it``'s activations, codes and scale codes into ``slot``."""
        T, h, tx = self.T, self.h, self.tx
        cp16 = T.ptx["cp.async.cg.shared.global"]
        threads = 128 * h.wg
        # activations: 16 chunks a row (128 K of 2 bytes), two swizzled halves of 64 K
        for r in range(-(-self.m_tile * 16 // threads)):
            i = tx + threads * r
            row, c16 = i // 16, i % 16
            dst = self._addr(slot, (c16 // 8) * self.m_tile * ROW + swizzled(row, c16 % 8))
            conds = [self.m0 + row < self.m]
            if self.m_tile * 16 < threads * (r + 1):
                conds.insert(0, i < self.m_tile * 16)
            when(T, conds, cp16(dst, self.A.ptr_to([self.m0 + row, it * BK + 8 * c16]), 16))
        # codes: w chunks a row
        rows = 64 * h.wg
        for r in range(-(-rows * self.w // threads)):
            i = tx + threads * r
            row, c = i // self.w, i % self.w
            src = self.B.ptr_to([self.n0 + row, it * 16 * self.w + 16 * c])
            conds = [i < rows * self.w] if rows * self.w < threads * (r + 1) else []
            when(T, conds, cp16(self._addr(slot, self._code_chunk(row, c)), src, 16))
        # scale codes: 4 bytes a row
        src = self.S.ptr_to([self.n0 + tx, it * (BK // STEP)])
        dst = self._addr(slot, self.scales_off + 4 * tx)
        when(T, [tx < rows] if rows < threads else [], T.ptx["cp.async.ca.shared.global"](dst, src, 4))

    # ---- decode and wgmma -----------------------------------------------------------------------

    def decode(self, slot, buf: int) -> None:
        """This thread's fragments of the slot's 4 steps into ``afr[buf]``: codes of its two rows,
        pairs decoded and multiplied by their folded block scale."""
        T, w = self.T, self.w
        ld = T.ptx.ld.shared
        words = T.alloc_buffer((BK // STEP, 2, 2), "uint32", scope="local")
        sc = T.alloc_buffer((2,), "uint32", scope="local")
        for r in range(2):
            row = self.row(r)
            T.evaluate(ld.b32(sc[r], self._addr(slot, self.scales_off + 4 * row)))
            for u in range(BK // STEP):
                byte = u * 4 * w + self.j * w  # this lane's w bytes of step u
                addr = self._addr(slot, self._code_chunk(row, byte // 16) + byte % 16)
                if w == 8:
                    T.evaluate(ld.v2.b32(words[u, r, 0], words[u, r, 1], addr))
                else:
                    T.evaluate(ld.b32(words[u, r, 0], addr))
        fold = self.fold
        fma = T.ptx.fma.rn.f16x2 if self.a_dtype == "float16" else T.ptx.fma.rn.bf16x2
        for u in range(BK // STEP):
            fac = [
                ((tirx.BufferLoad(sc, [r]) >> u32(8 * u)) & u32(255)) * u32(fold.mul)
                + tirx.BufferLoad(self.fold_add, [r])
                for r in range(2)
            ]
            for g, q in itertools.product(range(2), range(4)):
                # wgmma g's A: rows quad / quad+8 (q % 2) × K 16g + 2j.. / +8 (q // 2)
                wd = lambda p, i, u=u, r=q % 2: tirx.BufferLoad(words, [u, r, i])  # noqa: E731
                pair = pairs.decode_pair(self.fmt, wd, 2 * g + q // 2, dtype=self.a_dtype)
                T.buffer_store(self.afr, pair, [buf, u, g, q])
                a = self.afr[buf, u, g, q]
                if self.fma is not None and not fold.merged:  # integer codes: the magic number first
                    T.evaluate(fma(a, a, u32(self.fma[0]), u32(self.fma[1])))
                T.evaluate(fma(a, a, fac[q % 2], u32(0x80008000)))  # a f + -0: keeps -0

    def mma(self, slot, buf: int) -> None:
        """The slot's 8 wgmmas (4 steps × 2 k16) into the accumulator, one commit group."""
        T = self.T
        ab = {"float16": "f16", "bfloat16": "bf16"}[self.a_dtype]
        op = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{self.m_tile}k16.f32.{ab}.{ab}"]
        regs = [tirx.BufferLoad(self.acc, [i]) for i in range(self.frag)]
        T.evaluate(T.ptx.wgmma.fence.sync.aligned())
        for u, g in itertools.product(range(BK // STEP), range(2)):
            kk = 2 * u + g  # k16 slice of the slot: half kk // 4, 32 bytes each
            start = self._addr(slot, (kk // 4) * self.m_tile * ROW + (kk % 4) * 32)
            a = [tirx.BufferLoad(self.afr, [buf, u, g, q]) for q in range(4)]
            T.evaluate(op(*regs, *a, descriptor(T, self.desc, 0, start), tirx.const(True, "bool"), 1, 1, 0))
        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())

    # ---- the K loop -----------------------------------------------------------------------------

    def iteration(self, it, buf: int) -> None:
        T, h = self.T, self.h
        slot = it % h.stages
        ring_turn(T, it, h.stages, self.ahead, self.iters, self.issue)
        self.decode(slot, buf)
        self.mma(slot, buf)
        # double: the previous slot's wgmmas are done (their fragments and slot free), this one's run on
        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(1 if h.double else 0))

    def loop(self) -> None:
        T, h = self.T, self.h
        for s in range(self.ahead):
            if s < self.iters:
                self.issue(s, s)
            T.evaluate(T.ptx["cp.async.commit_group"]())
        if h.double:  # two iterations a trip: the fragment sets stay static registers
            with T.serial(0, self.iters // 2) as it2:
                for b in range(2):
                    self.iteration(2 * it2 + b, b)
        else:
            with T.serial(0, self.iters) as it:
                self.iteration(it, 0)
        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))

    def epilogue(self) -> None:
        T = self.T
        for jn, i, c in itertools.product(range(self.m_tile // 8), range(2), range(2)):
            col = self.n0 + self.row(i)
            row = self.m0 + 8 * jn + 2 * self.j + c
            val = tirx.ldexp(
                tirx.BufferLoad(self.acc, [4 * jn + 2 * i + c]), tirx.BufferLoad(self.out_exp, [i])
            )
            if self.bias:
                val = val + tirx.Cast("float32", tirx.BufferLoad(self.Bias, [col]))
            with T.If(row < self.m):
                with T.Then():
                    T.buffer_store(self.Y, tirx.Cast(self.out_dtype, val), [row, col])
