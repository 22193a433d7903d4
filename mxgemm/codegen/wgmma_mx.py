"""MXFP8 × MXFP8 on Hopper's fp8 tensor cores (``wgmma.mma_async ... .e4m3.e4m3``, sm_90a).

``Y = dequant(XA, XS) @ dequant(W, WS)^T``: activations and weights both OCP MX e4m3 with block-32
E8M0 scales along K. Why wgmma and not ``mma.sync.m16n8k32.e4m3``: on sm_90 that instruction is
emulated (the operands converted to fp16 and run at the fp16 ``mma.sync`` rate, about a third of
wgmma's fp8 rate), so it cannot beat a bf16 GEMM.

One scale block is one instruction: a warpgroup's ``m64n{bn}k32`` of step ``u`` writes a zeroed
fp32 fragment, which is then promoted into the accumulator as ``acc += (tmp · 2^sw[n,u]) · 2^sa[m,u]``
(two exact multiplies by powers of two, up to fp32 range; an FMUL and an FFMA per output). Two
fragments alternate, so step ``u``'s promotion runs on the FP32 pipe while step ``u + 1``'s wgmma
runs on the tensor cores (``wgmma.wait_group 1``). The FP32 work per output per step is the same
issue time as the fp8 tensor work itself (both 1/128 clock per output per SM), so this exact
per-block promotion bounds the kernel at about half of the fp8 peak, near the bf16 peak.

Block: ``wg`` warpgroups (``64 wg`` rows of X) × ``bn`` columns of W, over K in slots of 128 (4
steps). A ``cp.async`` ring of ``stages`` slots, ``stages - 1`` in flight ahead; every wgmma is
waited for before its promotion, so the barrier of iteration ``it`` also frees the slot of
``it - 1`` for refilling. A slot holds X's ``64 wg × 128`` codes and W's ``bn × 128`` codes in
wgmma's 128-byte-swizzled K-major layout (a row's 128 bytes contiguous, its 16-byte chunk ``c`` at
``c ^ (row % 8)``: coalesced global reads, conflict-free shared writes and wgmma reads), then X's
scale codes (4 bytes a row) and W's scales as float32 (``[4, bn]``, converted once per weight:
:func:`weight_scales`); slots are 1024-byte aligned (the swizzle atom).

Rows of X ≥ M are not copied (whatever the slot holds there only reaches rows that are not stored).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import torch
from tvm import tirx

from mxgemm.codegen import build as builder
from mxgemm.codegen.decode import scale_expr
from mxgemm.codegen.wgmma import (
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
from mxgemm.scales import scale_factors

STEP = 32  # K per wgmma (fp8): one scale block
BK = 128  # K per ring slot: one 128-byte swizzle row of fp8 codes, 4 steps
REG_SPARE = 40  # registers a thread needs besides its fragments


@dataclass(frozen=True)
class Hints:
    """wg: consumer warpgroups per block (1, 2, 3), each 64 rows of X; bn: W rows per block, the
    wgmma's N (64, 128); stages: ring slots (2..6); batch: wgmmas issued together (1, 2, 4), each
    into its own fragment, each promoted as soon as it is done while the later ones run."""

    wg: int = 2
    bn: int = 128
    stages: int = 4
    batch: int = 2

    def __post_init__(self) -> None:
        if self.wg not in (1, 2, 3) or self.bn not in (64, 128) or not 2 <= self.stages <= 6:
            raise ValueError(f"wgmma_mx hints {self}: wg 1|2|3, bn 64|128, stages 2..6")
        if self.batch not in (1, 2, 4):
            raise ValueError(f"wgmma_mx hints {self}: batch 1|2|4")
        if ((self.batch + 1) * self.bn // 2 + REG_SPARE) * 128 * self.wg > 65536:
            raise ValueError(
                f"wgmma_mx hints {self}: {self.batch + 1} fragments of {self.bn // 2} "
                f"registers do not fit {self.wg} warpgroups"
            )
        if self.smem() > SMEM_MAX:
            raise ValueError(f"wgmma_mx hints {self}: a {self.smem()}-byte ring is over {SMEM_MAX}")

    @property
    def bm(self) -> int:
        return 64 * self.wg

    def slot_bytes(self) -> tuple[int, int, int, int]:
        """Byte offsets in a slot of W's codes, X's scales, W's scales, and the slot's size."""
        w_off = self.bm * BK
        xs_off = w_off + self.bn * BK
        ws_off = xs_off + self.bm * (BK // STEP)
        return w_off, xs_off, ws_off, -(-(ws_off + 4 * self.bn * (BK // STEP)) // 1024) * 1024

    def smem(self) -> int:
        return self.stages * self.slot_bytes()[3]


def applies(n: int, k: int, h: Hints = Hints()) -> str | None:
    """Why the kernel cannot run ``[*, k] @ [n, k]^T`` with ``h``, or None."""
    if n % h.bn:
        return f"N={n} is not a multiple of {h.bn}"
    if k % BK:
        return f"K={k} is not a multiple of {BK}"
    return None


DEFAULT = Hints()  # 2 warpgroups × 128 columns, 4 slots, wgmmas in pairs: the fastest at M ≥ 1024 (H200)
FORMAT = "mxfp8_e4m3"  # both operands
BLOCK = STEP  # their block size
OUT_DTYPES = ("float32", "float16", "bfloat16")


def hints_for(n: int) -> Hints:
    """:data:`DEFAULT`, or 64 columns a block where N is a multiple of 64 but not of 128."""
    return DEFAULT if n % DEFAULT.bn == 0 else Hints(DEFAULT.wg, 64, DEFAULT.stages, 4)


def device_ok(device: torch.device) -> bool:
    """Whether ``device`` runs the kernel: a CUDA device of compute capability 9.0 (sm_90a code runs
    on Hopper alone)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def compiled(n: int, k: int, out_dtype: str, bias: bool, hints: Hints | None = None):
    """The kernel for ``[*, k] @ [n, k]^T`` (called ``f(XA, XS, W, WS, [Bias], Y)``, :func:`kernel`'s
    arguments), built once into the kernel cache."""
    h = hints or hints_for(n)
    spec = {"op": "wgmma_mx", "n": n, "k": k, "out_dtype": out_dtype, "bias": bias, "hints": asdict(h)}
    return cached(spec, lambda: kernel(n=n, k=k, out_dtype=out_dtype, bias=bias, hints=h))


def matmul(
    xa: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``dequant(xa, xs) @ dequant(w, ws)^T (+ bias)`` for e4m3 codes with block-32 E8M0 scales along K,
    on a Hopper GPU, fp32 sums, rounded once to ``out_dtype``.

    Args:
        xa: uint8 ``[m, k]`` e4m3 codes; xs: uint8 ``[m, k/32]`` scale codes.
        w: uint8 ``[n, k]`` e4m3 codes; ws: uint8 ``[n, k/32]`` scale codes.
        out_dtype: float32, float16 or bfloat16.
        bias: ``out_dtype [n]`` or None.

    Returns:
        ``out_dtype [m, n]``.
    """
    m, k = xa.shape
    n = w.shape[0]
    why = _why_not(xa, xs, w, ws, out_dtype, bias)
    if why:
        raise ValueError(f"wgmma_mx.matmul: {why}")
    y = torch.empty(m, n, dtype=out_dtype, device=xa.device)
    if m == 0:
        return y
    func = compiled(n, k, str(out_dtype).removeprefix("torch."), bias is not None)
    args = [xa.contiguous(), xs.contiguous(), w.contiguous(), weight_scales(ws)]
    args += [bias.contiguous()] if bias is not None else []
    builder.launch(func, [*args, y])
    return y


# :func:`matmul` as the custom op ``torch.ops.mxgemm.fp8_matmul`` (fake kernel included), which
# torch.compile and export trace as one node
op = torch.library.custom_op("mxgemm::fp8_matmul", mutates_args=())(matmul)


@op.register_fake
def _(xa, xs, w, ws, out_dtype, bias=None):
    return xa.new_empty((xa.shape[0], w.shape[0]), dtype=out_dtype)


def _why_not(xa, xs, w, ws, out_dtype, bias) -> str | None:
    """What is wrong with :func:`matmul`'s arguments, or None."""
    if xa.dim() != 2 or w.dim() != 2:
        return f"xa and w must be 2-D, got {list(xa.shape)} and {list(w.shape)}"
    (m, k), n = xa.shape, w.shape[0]
    if n % 64:
        return f"N={n} is not a multiple of 64"
    why = applies(n, k, hints_for(n))
    if why:
        return why
    shapes = {"xa": (xa, (m, k)), "xs": (xs, (m, k // BLOCK)), "w": (w, (n, k)), "ws": (ws, (n, k // BLOCK))}
    for name, (t, shape) in shapes.items():
        if t.dtype != torch.uint8 or tuple(t.shape) != shape or t.device != xa.device:
            got = f"{t.dtype} {list(t.shape)} on {t.device}"
            return f"{name} must be uint8 {list(shape)} on {xa.device}, got {got}"
    if not device_ok(xa.device):
        return f"the kernel runs on Hopper (compute capability 9.0) GPUs, not {xa.device}"
    if str(out_dtype).removeprefix("torch.") not in OUT_DTYPES:
        return f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}"
    if bias is not None and (
        bias.dtype != out_dtype or tuple(bias.shape) != (n,) or bias.device != xa.device
    ):
        return f"bias must be {out_dtype} [{n}] on {xa.device}, got {bias.dtype} {list(bias.shape)}"
    return None


def weight_scales(scales: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 ``[n, k/32]`` → float32 ``[k/32, n]`` (``2^(c-127)``, code 255 NaN), the kernel's WS."""
    return scale_factors(scales).t().contiguous()


def kernel(*, n: int, k: int, out_dtype: str, bias: bool, hints: Hints = Hints()) -> tirx.PrimFunc:
    """The kernel as a PrimFunc: XA ``uint8 [m, k]`` (e4m3 codes, m dynamic), XS ``uint8 [m, k/32]``
    (E8M0), W ``uint8 [n, k]`` (e4m3 codes), WS ``float32 [k/32, n]`` (:func:`weight_scales`), Bias
    ``out_dtype [n]`` (if ``bias``), Y ``out_dtype [m, n]``."""
    why = applies(n, k, hints)
    if why:
        raise ValueError(f"wgmma_mx: {why}")
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder() as ib:
        with T.prim_func():
            _Kernel(T, n, k, out_dtype, bias, hints).emit()
    return ib.get()


class _Kernel:
    def __init__(self, T, n, k, out_dtype, bias, h: Hints):  # noqa: N803
        self.T, self.n, self.k, self.out_dtype, self.bias, self.h = T, n, k, out_dtype, bias, h
        self.iters = k // BK
        self.steps = BK // STEP  # wgmmas per slot
        self.ahead = h.stages - 1
        self.w_off, self.xs_off, self.ws_off, self.slot = h.slot_bytes()
        self.frag = h.bn // 2  # fp32 registers of a thread's m64n{bn} fragment

    def emit(self) -> None:
        T, h, n, k = self.T, self.h, self.n, self.k
        m, handles, bias_h, y_h = main_args(T, ("XA", "XS", "W", "WS"), self.bias)
        self.m = m
        self.XA = T.match_buffer(handles[0], (m, k), "uint8")
        self.XS = T.match_buffer(handles[1], (m, k // STEP), "uint8")
        self.W = T.match_buffer(handles[2], (n, k), "uint8")
        self.WS = T.match_buffer(handles[3], (k // STEP, n), "float32")
        self.Bias = T.match_buffer(bias_h, (n,), self.out_dtype) if self.bias else None
        self.Y = T.match_buffer(y_h, (m, n), self.out_dtype)

        bx, by, tx = T.env_thread("blockIdx.x"), T.env_thread("blockIdx.y"), T.env_thread("threadIdx.x")
        m_tiles = tirx.Cast("int32", (m + (h.bm - 1)) // h.bm)
        with T.launch_thread(bx, m_tiles), T.launch_thread(by, n // h.bn), T.launch_thread(tx, 128 * h.wg):
            self.tx, self.m0, self.n0 = tx, tirx.Cast("int64", bx) * h.bm, by * h.bn
            self.wg, self.warp, self.lane = tx // 128, tx % 128 // 32, tx % 32
            self.ring = T.alloc_buffer((h.smem() // 16,), "uint32x4", scope="shared.dyn")
            self.acc = T.alloc_buffer((self.frag,), "float32", scope="local")
            self.tmp = T.alloc_buffer((h.batch, self.frag), "float32", scope="local")
            self.desc = T.alloc_buffer((2,), "uint64", scope="local")
            for i in range(self.frag):
                T.buffer_store(self.acc, tirx.const(0.0, "float32"), [i])
            self.loop()
            self.epilogue()

    # ---- shared memory ------------------------------------------------------------------------

    def _addr(self, slot, byte):
        """Shared-state address (uint32) of byte ``byte`` of ring slot ``slot``."""
        return smem_addr(self.T, self.ring, slot * self.slot + byte)

    def issue(self, it, slot) -> None:
        """``cp.async`` of iteration ``it``'s codes and scales into ``slot`` (every thread a share)."""
        T, h, tx = self.T, self.h, self.tx
        cp16 = T.ptx["cp.async.cg.shared.global"]
        threads = 128 * h.wg
        k0 = it * BK
        # codes: 16-byte chunk i is row i / 8, chunk i % 8 (8 lanes read a row's 128 bytes), stored
        # at chunk (i % 8) ^ (row % 8) of the row
        for part, rows, off in (("x", h.bm, 0), ("w", h.bn, self.w_off)):
            for r in range(-(-rows * 8 // threads)):
                i = tx + threads * r
                row, c = i // 8, i % 8
                dst = self._addr(slot, off + swizzled(row, c))
                conds = [i < rows * 8] if rows * 8 < threads * (r + 1) else []
                if part == "w":
                    copy = cp16(dst, self.W.ptr_to([self.n0 + row, k0 + 16 * c]), 16)
                else:
                    conds.append(self.m0 + row < self.m)
                    copy = cp16(dst, self.XA.ptr_to([self.m0 + row, k0 + 16 * c]), 16)
                when(T, conds, copy)
        # X's scale codes: 4 bytes a row
        sb = BK // STEP
        src = self.XS.ptr_to([self.m0 + tx, it * sb])
        copy = T.ptx["cp.async.ca.shared.global"](self._addr(slot, self.xs_off + sb * tx), src, sb)
        when(T, [tx < h.bm, self.m0 + tx < self.m], copy)
        # W's float scales: 4 rows of bn floats
        chunks = sb * h.bn // 4
        for r in range(-(-chunks // threads)):
            i = tx + threads * r
            row, c = i // (h.bn // 4), i % (h.bn // 4)
            src = self.WS.ptr_to([it * sb + row, self.n0 + 4 * c])
            conds = [i < chunks] if chunks < threads * (r + 1) else []
            when(T, conds, cp16(self._addr(slot, self.ws_off + 16 * i), src, 16))

    # ---- the K loop ---------------------------------------------------------------------------

    def mma(self, slot, u, frag: int) -> None:
        """This warpgroup's wgmma of step ``u`` of ``slot`` into ``tmp[frag]`` (overwritten), its own
        commit group."""
        T, h = self.T, self.h
        a = descriptor(T, self.desc, 0, self._addr(slot, self.wg * 64 * BK + u * STEP))
        b = descriptor(T, self.desc, 1, self._addr(slot, self.w_off + u * STEP))
        op = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{h.bn}k32.f32.e4m3.e4m3"]
        regs = [tirx.BufferLoad(self.tmp, [frag, i]) for i in range(self.frag)]
        T.evaluate(op(*regs, a, b, tirx.const(False, "bool"), 1, 1))
        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())

    def promote(self, slot, u, frag: int) -> None:
        """``acc += tmp[frag] · 2^sw · 2^sa`` with step ``u`` of ``slot``'s scales, once the wgmma that
        wrote it is done (``wait_group`` before; the empty asm keeps the compiler's reads of the
        fragment after it)."""
        T, h = self.T, self.h
        fence_regs(T, [tirx.BufferLoad(self.tmp, [frag, i]) for i in range(self.frag)])
        sb = BK // STEP
        q, quad = self.lane % 4, self.lane // 4
        ld = T.ptx.ld.shared
        codes = T.alloc_buffer((2,), "uint32", scope="local")
        sw = T.alloc_buffer((h.bn // 8, 2), "uint32", scope="local")
        sav = T.alloc_buffer((2,), "float32", scope="local")
        for i in range(2):
            row = self.wg * 64 + self.warp * 16 + quad + 8 * i
            T.evaluate(ld.u8(codes[i], self._addr(slot, self.xs_off + row * sb + u)))
            T.buffer_store(sav, scale_expr(tirx.BufferLoad(codes, [i])), [i])
        for j in range(h.bn // 8):
            addr = self._addr(slot, self.ws_off + 4 * (u * h.bn + 8 * j + 2 * q))
            T.evaluate(ld.v2.b32(sw[j, 0], sw[j, 1], addr))
        for j, c in itertools.product(range(h.bn // 8), range(2)):
            scale = tirx.reinterpret("float32", tirx.BufferLoad(sw, [j, c]))
            for i in range(2):
                idx = 4 * j + 2 * i + c
                part = tirx.BufferLoad(self.tmp, [frag, idx]) * scale
                val = tirx.BufferLoad(self.acc, [idx]) + part * tirx.BufferLoad(sav, [i])
                T.buffer_store(self.acc, val, [idx])

    def loop(self) -> None:
        T, h = self.T, self.h
        commit = T.ptx["cp.async.commit_group"]
        for s in range(self.ahead):
            if s < self.iters:
                self.issue(s, s)
            T.evaluate(commit())
        with T.serial(0, self.iters) as it:
            slot = it % h.stages
            ring_turn(T, it, h.stages, self.ahead, self.iters, self.issue)
            # a batch's wgmmas issued together; each promoted once done, the later ones still running
            # (ptxas keeps them asynchronous in this order; a wgmma issued while an earlier
            # fragment is read makes it serialize them all)
            for u0 in range(0, self.steps, h.batch):
                T.evaluate(T.ptx.wgmma.fence.sync.aligned())
                for j in range(h.batch):
                    self.mma(slot, u0 + j, j)
                for j in range(h.batch):
                    T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(h.batch - 1 - j))
                    self.promote(slot, u0 + j, j)

    def epilogue(self) -> None:
        T, h = self.T, self.h
        q, quad = self.lane % 4, self.lane // 4
        for j, i, c in itertools.product(range(h.bn // 8), range(2), range(2)):
            row = self.m0 + self.wg * 64 + self.warp * 16 + quad + 8 * i
            col = self.n0 + 8 * j + 2 * q + c
            val = tirx.BufferLoad(self.acc, [4 * j + 2 * i + c])
            if self.bias:
                val = val + tirx.Cast("float32", tirx.BufferLoad(self.Bias, [col]))
            with T.If(tirx.Cast("int64", row) < self.m):
                with T.Then():
                    T.buffer_store(self.Y, tirx.Cast(self.out_dtype, val), [row, col])
