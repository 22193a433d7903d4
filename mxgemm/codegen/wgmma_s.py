"""A decode-fused GEMM on Hopper's wgmma with both operands in shared memory, for large M: MX/BFP weights
× fp16/bf16 activations (a prototype, not routed).

The usual orientation (``Y = X W^T``): a warpgroup's 64 activation rows are the wgmma's M, a block's
``bn`` weight rows its N. Every thread decodes a share of the block's codes into the weight tile in
shared memory (fp16 or bf16 pairs, :func:`~mxgemm.codegen.pairs.decode_pair`, 16 bytes a thread and
item, 128-byte-swizzled as wgmma reads it), then the warpgroups' wgmmas read it beside the activations
(``wgmma ... m64n{bn}k16`` with both operands from shared memory): one decode serves ``64 wg``
activation rows, where :mod:`~mxgemm.codegen.wgmma_w` decodes into each warpgroup's registers.

Block scales are folded into the decoded pairs (:func:`~mxgemm.codegen.pairs.fold`) so the wgmmas
accumulate the whole K: a prologue scans each weight row's scale codes (a quad a row,
:func:`~mxgemm.codegen.pairs.fold_row`) and keeps the row's multiplier addend and output exponent in
shared memory; a block with a row that does not fold runs each 32-K step's wgmmas into a fragment that
is added to the accumulator times each column's block scale.

K runs in slots of 128 (two 64-K halves, 4 scale steps, 8 wgmmas). A ``cp.async`` ring of ``stages``
slots holds the activations (two 128-byte-swizzled halves), the codes (the portable bytes, one plane of
4 or 8 bits) and the scale codes (4 bytes a row). Two decoded weight tiles alternate: slot ``it`` is
decoded while the wgmmas of slot ``it - 1`` run; a proxy fence and a barrier put the decoded tile before
the wgmmas that read it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

from tvm import tirx

from mxgemm import formats
from mxgemm.codegen import pairs
from mxgemm.codegen.decode import scale_expr, u32
from mxgemm.codegen.wgmma import (
    ROW,
    SMEM_MAX,
    cached,
    descriptor,
    fence_regs,
    main_args,
    ring_turn,
    smem_addr,
    swizzled,
    when,
)

STEP = 32  # K per scale block: two k16 wgmmas
BK = 128  # K per ring slot: two swizzled halves of 64
WIDTHS = (4, 8)  # code widths with one bit plane

# generic-proxy writes (the decoded tile) before the async proxy's reads (wgmma)
FENCE_PROXY = (
    "__device__ __forceinline__ void mxgemm_fence_proxy() {\n"
    '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n'
    "}\n"
)


@dataclass(frozen=True)
class Hints:
    """wg: warpgroups per block (1 or 2), 64 activation rows each; bn: weight rows per block (64 or
    128, the wgmmas' N); stages: ring slots (3..5)."""

    wg: int = 2
    bn: int = 128
    stages: int = 3

    def __post_init__(self) -> None:
        if self.wg not in (1, 2) or self.bn not in (64, 128) or not 3 <= self.stages <= 5:
            raise ValueError(f"wgmma_s hints {self}: wg 1|2, bn 64|128, stages 3..5")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def bm(self) -> int:
        return 64 * self.wg

    def layout(self, bits: int) -> tuple[int, int, int, int, int]:
        """(codes offset, scales offset, slot size) of a ring slot, the two decoded tiles' offset and the
        rows' fold words' offset: the whole layout's bytes are :meth:`smem`."""
        codes = 2 * self.bm * ROW
        scales = codes + self.bn * BK * bits // 8
        slot = -(-(scales + 4 * self.bn) // 1024) * 1024
        tiles = self.stages * slot
        return codes, scales, slot, tiles, tiles + 2 * 2 * self.bn * ROW

    def smem(self, bits: int) -> int:
        return self.layout(bits)[4] + 8 * self.bn


def applies(fmt: formats.Format, n: int, k: int, a_dtype: str, h: Hints = Hints()) -> str | None:
    """Why the kernel cannot run ``[*, k] @ [n, k]^T`` of ``fmt`` weights, or None."""
    if fmt.bits not in WIDTHS:
        return f"{fmt.name}: codes of {fmt.bits} bits (one plane of 4 or 8 bits wanted)"
    if pairs.fold(fmt, a_dtype) is None:
        return f"{fmt.name} pairs in {a_dtype} take no folded scale"
    if n % h.bn:
        return f"N={n} is not a multiple of {h.bn}"
    if k % BK:
        return f"K={k} is not a multiple of {BK}"
    if h.smem(fmt.bits) > SMEM_MAX:
        return f"{h.smem(fmt.bits)} bytes of shared memory exceed {SMEM_MAX}"
    return None


def kernel(
    fmt: formats.Format, *, n: int, k: int, out_dtype: str, bias: bool, a_dtype: str, hints: Hints = Hints()
) -> tirx.PrimFunc:
    """The kernel as a PrimFunc with :func:`~mxgemm.codegen.prim_func.prim_func`'s arguments: A
    ``a_dtype [m, k]`` (m dynamic), B uint8 ``[n, k*bits/8]`` (the portable codes, one plane), S uint8
    ``[n, k/32]``, Bias ``out_dtype [n]`` (if ``bias``), Y ``out_dtype [m, n]``."""
    why = applies(fmt, n, k, a_dtype, hints)
    if why:
        raise ValueError(f"wgmma_s: {why}")
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder() as ib:
        with T.prim_func():
            _Kernel(T, fmt, n, k, out_dtype, bias, a_dtype, hints).emit()
    return ib.get()


def compiled(fmt: str, n: int, k: int, dtype: str, bias: bool, hints: Hints = Hints()):
    """The kernel (called ``f(A, B, S, [Bias], Y)``, :func:`kernel`'s arguments, activations and
    outputs in ``dtype``), built once into the kernel cache."""
    spec = {"op": "wgmma_s", "fmt": fmt, "n": n, "k": k, "dtype": dtype, "bias": bias}
    f = formats.get(fmt)
    return cached(
        {**spec, "hints": asdict(hints)},
        lambda: kernel(f, n=n, k=k, out_dtype=dtype, bias=bias, a_dtype=dtype, hints=hints),
    )


class _Kernel:
    def __init__(self, T, fmt, n, k, out_dtype, bias, a_dtype, h: Hints):  # noqa: N803, PLR0913
        self.T, self.fmt, self.n, self.k, self.h = T, fmt, n, k, h
        self.out_dtype, self.bias, self.a_dtype = out_dtype, bias, a_dtype
        self.w = fmt.bits  # bytes of a row's 8 codes
        self.fold = pairs.fold(fmt, a_dtype)
        self.fma = pairs.bf16_fma(fmt, a_dtype)
        self.codes_off, self.scales_off, self.slot, self.tiles_off, self.rows_off = h.layout(fmt.bits)
        self.iters = k // BK
        self.ahead = h.stages - 2  # the slot refilled was read by the wgmmas of two iterations ago
        self.frag = h.bn // 2  # fp32 registers of a thread's m64n{bn} fragment
        self.threads = 128 * h.wg

    def emit(self) -> None:
        T, h, n, k = self.T, self.h, self.n, self.k
        m, handles, bias_h, y_h = main_args(T, ("A", "B", "S"), self.bias)
        self.m = m
        self.A = T.match_buffer(handles[0], (m, k), self.a_dtype)
        self.B = T.match_buffer(handles[1], (n, k * self.w // 8), "uint8")
        self.S = T.match_buffer(handles[2], (n, k // STEP), "uint8")
        self.Bias = T.match_buffer(bias_h, (n,), self.out_dtype) if self.bias else None
        self.Y = T.match_buffer(y_h, (m, n), self.out_dtype)

        bx, by, tx = T.env_thread("blockIdx.x"), T.env_thread("blockIdx.y"), T.env_thread("threadIdx.x")
        m_tiles = tirx.Cast("int32", (m + (h.bm - 1)) // h.bm)
        with T.launch_thread(bx, m_tiles), T.launch_thread(by, n // h.bn), T.launch_thread(tx, self.threads):
            self.tx, self.m0, self.n0 = tx, tirx.Cast("int64", bx) * h.bm, by * h.bn
            self.wg, self.warp, self.lane = tx // 128, tx % 128 // 32, tx % 32
            self.ring = T.alloc_buffer((h.smem(self.w) // 16,), "uint32x4", scope="shared.dyn")
            self.acc = T.alloc_buffer((self.frag,), "float32", scope="local")
            self.desc = T.alloc_buffer((2,), "uint64", scope="local")
            for i in range(self.frag):
                T.buffer_store(self.acc, tirx.const(0.0, "float32"), [i])
            self.rows_fold()
            self.loop()
            self.epilogue()

    def _at(self, byte):
        return smem_addr(self.T, self.ring, byte)

    # ---- the rows' fold ------------------------------------------------------------------------

    def rows_fold(self) -> None:
        """Each weight row's multiplier addend and output exponent into shared memory (uint32 and int32
        at :attr:`rows_off`, ``+ 4 bn``), and whether the block folds (:attr:`fast`): a quad a row,
        each lane scanning a quarter of the row's scale-code words."""
        T, h, fold = self.T, self.h, self.fold
        words = self.k // STEP // 4
        s32 = T.decl_buffer((self.n * words,), "uint32", data=self.S.data)
        hi = T.alloc_buffer((1,), "uint32", scope="local")
        lo = T.alloc_buffer((1,), "uint32", scope="local")
        ok = T.alloc_buffer((1,), "int32", scope="local")
        T.buffer_store(ok, tirx.const(1, "int32"), [0])
        quads, j = self.threads // 4, self.tx % 4
        oe = round(math.log2(pairs.out_factor(self.fmt)))
        for p in range(-(-h.bn // quads)):
            row = self.tx // 4 + quads * p
            T.buffer_store(hi, u32(0), [0])
            T.buffer_store(lo, u32(0xFFFFFFFF), [0])
            with T.serial(0, -(-words // 4)) as i:
                w = j + 4 * i
                with T.If(tirx.And(w < words, row < h.bn)):
                    with T.Then():
                        v = tirx.BufferLoad(s32, [(self.n0 + row) * words + w])
                        T.buffer_store(hi, pairs.vmaxu4(hi[0], v), [0])
                        T.buffer_store(lo, pairs.vminu4(lo[0], v), [0])
            good, add, exp = pairs.fold_row(T, fold, hi, lo, [0])
            with T.If(row < h.bn):
                with T.Then():
                    T.buffer_store(ok, ok[0] & tirx.Cast("int32", good), [0])
                    with T.If(j == 0):
                        with T.Then():
                            st = T.ptx.st.shared
                            T.evaluate(st.b32(self._at(self.rows_off + 4 * row), add))
                            exp_bits = tirx.reinterpret("uint32", exp + oe)
                            T.evaluate(st.b32(self._at(self.rows_off + 4 * h.bn + 4 * row), exp_bits))
        self.fast = T.alloc_buffer((1,), "int32", scope="local")
        T.buffer_store(self.fast, tirx.call_extern("int32", "__syncthreads_and", ok[0]), [0])

    # ---- loads, decode and wgmma ---------------------------------------------------------------

    def issue(self, it, slot) -> None:
        """``cp.async`` of iteration ``it``'s activations, codes and scale codes into ``slot``."""
        T, h, tx, threads = self.T, self.h, self.tx, self.threads
        cp16 = T.ptx["cp.async.cg.shared.global"]
        base = slot * self.slot
        for r in range(-(-h.bm * 16 // threads)):  # activations: 16 chunks a row, two halves of 8
            i = tx + threads * r
            row, c16 = i // 16, i % 16
            dst = self._at(base + (c16 // 8) * h.bm * ROW + swizzled(row, c16 % 8))
            conds = [self.m0 + row < self.m]
            if h.bm * 16 < threads * (r + 1):
                conds.insert(0, i < h.bm * 16)
            when(T, conds, cp16(dst, self.A.ptr_to([self.m0 + row, it * BK + 8 * c16]), 16))
        per_row = BK * self.w // 8 // 16  # 16-byte chunks of a row's codes
        for r in range(-(-h.bn * per_row // threads)):
            i = tx + threads * r
            row, c = i // per_row, i % per_row
            src = self.B.ptr_to([self.n0 + row, it * (BK * self.w // 8) + 16 * c])
            conds = [i < h.bn * per_row] if h.bn * per_row < threads * (r + 1) else []
            when(T, conds, cp16(self._at(base + self.codes_off + 16 * i), src, 16))
        src = self.S.ptr_to([self.n0 + tx, it * (BK // STEP)])
        dst = self._at(base + self.scales_off + 4 * tx)
        conds = [tx < h.bn] if h.bn < threads else []
        when(T, conds, T.ptx["cp.async.ca.shared.global"](dst, src, 4))  # bn ≤ 128 ≤ threads

    def decode(self, slot, tile, fold: bool) -> None:
        """The slot's codes into decoded tile ``tile``: item ``i`` (row ``i / 16``, 8 codes ``c = i % 16``
        of its 128) is 4 pairs, 16 bytes at chunk ``c % 8`` of the row in half ``c / 8``; ``fold``:
        each pair times its block's folded scale."""
        T, h, threads = self.T, self.h, self.threads
        base = slot * self.slot
        ld, st = T.ptx.ld.shared, T.ptx.st.shared
        words = T.alloc_buffer((2,), "uint32", scope="local")
        sc = T.alloc_buffer((1,), "uint32", scope="local")
        add = T.alloc_buffer((1,), "uint32", scope="local")
        out = T.alloc_buffer((4,), "uint32", scope="local")
        fma = T.ptx.fma.rn.f16x2 if self.a_dtype == "float16" else T.ptx.fma.rn.bf16x2
        for r in range(h.bn * 16 // threads):
            i = self.tx + threads * r
            row, c = i // 16, i % 16
            codes = self._at(base + self.codes_off + row * (BK * self.w // 8) + c * self.w)
            if self.w == 4:
                T.evaluate(ld.b32(words[0], codes))
            else:
                T.evaluate(ld.v2.b32(words[0], words[1], codes))
            wd = lambda p, idx: tirx.BufferLoad(words, [idx])  # noqa: E731
            if fold:
                T.evaluate(ld.u8(sc[0], self._at(base + self.scales_off + 4 * row + c // 4)))
                T.evaluate(ld.b32(add[0], self._at(self.rows_off + 4 * row)))
                fac = sc[0] * u32(self.fold.mul) + add[0]
            for q in range(4):
                T.buffer_store(out, pairs.decode_pair(self.fmt, wd, q, dtype=self.a_dtype), [q])
                a = out[q]
                if self.fma is not None and not (fold and self.fold.merged):
                    T.evaluate(fma(a, a, u32(self.fma[0]), u32(self.fma[1])))
                if fold:
                    T.evaluate(fma(a, a, fac, u32(0x80008000)))  # a f + -0: keeps -0
            dst = self._at(
                self.tiles_off + tile * 2 * h.bn * ROW + (c // 8) * h.bn * ROW + swizzled(row, c % 8)
            )
            T.evaluate(st.v4.b32(dst, out[0], out[1], out[2], out[3]))
        T.evaluate(T.cuda.func_call("mxgemm_fence_proxy", source_code=FENCE_PROXY))
        T.evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))

    def mma(self, slot, tile, steps=range(BK // STEP), into=None) -> None:
        """This warpgroup's wgmmas (2 k16 a step) of the slot's ``steps`` into the accumulator, or
        ``into`` (a fragment the first of them overwrites), one commit group."""
        T, h = self.T, self.h
        ab = {"float16": "f16", "bfloat16": "bf16"}[self.a_dtype]
        op = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{h.bn}k16.f32.{ab}.{ab}"]
        regs = [tirx.BufferLoad(self.acc if into is None else into, [i]) for i in range(self.frag)]
        T.evaluate(T.ptx.wgmma.fence.sync.aligned())
        for n_, (u, g) in enumerate(itertools.product(steps, range(2))):
            kk = 2 * u + g  # k16 slice of the slot: half kk // 4, 32 bytes each
            a = self._at(slot * self.slot + (kk // 4) * h.bm * ROW + self.wg * 64 * ROW + (kk % 4) * 32)
            b = self._at(self.tiles_off + tile * 2 * h.bn * ROW + (kk // 4) * h.bn * ROW + (kk % 4) * 32)
            acc_in = tirx.const(into is None or n_ > 0, "bool")
            T.evaluate(
                op(*regs, descriptor(T, self.desc, 0, a), descriptor(T, self.desc, 1, b), acc_in, 1, 1, 0, 0)
            )
        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())

    # ---- the K loop -----------------------------------------------------------------------------

    def loop(self) -> None:
        T, h = self.T, self.h
        for s in range(self.ahead):
            if s < self.iters:
                self.issue(s, s)
            T.evaluate(T.ptx["cp.async.commit_group"]())
        with T.If(tirx.BufferLoad(self.fast, [0]) != 0):
            with T.Then():
                with T.serial(0, self.iters) as it:
                    slot = it % h.stages
                    ring_turn(T, it, h.stages, self.ahead, self.iters, self.issue)
                    self.decode(slot, it % 2, fold=True)
                    self.mma(slot, it % 2)
                    T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(1))  # iteration it - 1's are done
                T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))
            with T.Else():
                self.tmp = T.alloc_buffer((self.frag,), "float32", scope="local")
                with T.serial(0, self.iters) as it:
                    self.plain_iteration(it)

    def plain_iteration(self, it) -> None:
        """Unfolded (a row whose scales do not fold): each step's two wgmmas into a fragment, added to
        the accumulator times each column's block scale."""
        T, h = self.T, self.h
        slot = it % h.stages
        ring_turn(T, it, h.stages, self.ahead, self.iters, self.issue)
        self.decode(slot, it % 2, fold=False)
        q, code = self.lane % 4, T.alloc_buffer((1,), "uint32", scope="local")
        for u in range(BK // STEP):
            self.mma(slot, it % 2, steps=[u], into=self.tmp)
            T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))
            fence_regs(T, [tirx.BufferLoad(self.tmp, [i]) for i in range(self.frag)])
            for j, c in itertools.product(range(h.bn // 8), range(2)):
                col = 8 * j + 2 * q + c
                T.evaluate(
                    T.ptx.ld.shared.u8(code[0], self._at(slot * self.slot + self.scales_off + 4 * col + u))
                )
                scale = scale_expr(code[0])
                for i in range(2):
                    idx = 4 * j + 2 * i + c
                    val = tirx.BufferLoad(self.acc, [idx]) + tirx.BufferLoad(self.tmp, [idx]) * scale
                    T.buffer_store(self.acc, val, [idx])

    def epilogue(self) -> None:
        T, h = self.T, self.h
        q, quad = self.lane % 4, self.lane // 4
        exp = T.alloc_buffer((1,), "uint32", scope="local")
        oe = round(math.log2(pairs.out_factor(self.fmt)))
        for j, c in itertools.product(range(h.bn // 8), range(2)):
            col = 8 * j + 2 * q + c
            T.evaluate(T.ptx.ld.shared.b32(exp[0], self._at(self.rows_off + 4 * h.bn + 4 * col)))
            e = tirx.Select(self.fast[0] != 0, tirx.reinterpret("int32", exp[0]), tirx.const(oe, "int32"))
            for i in range(2):
                row = self.m0 + self.wg * 64 + self.warp * 16 + quad + 8 * i
                val = tirx.ldexp(tirx.BufferLoad(self.acc, [4 * j + 2 * i + c]), e)
                if self.bias:
                    val = val + tirx.Cast("float32", tirx.BufferLoad(self.Bias, [self.n0 + col]))
                with T.If(row < self.m):
                    with T.Then():
                        T.buffer_store(self.Y, tirx.Cast(self.out_dtype, val), [row, self.n0 + col])
