"""The kernel of the ``mma`` rule (:mod:`mxgemm.rules.mma` picks its hints and when it applies):
tensor cores fed from registers (``mma.sync.m16n8k16``) for fp16 or bf16 activations at small and
mid M (up to 256 rows), the codes decoded two per integer op (:mod:`mxgemm.codegen.pairs`; bf16
pairs mostly need one more, an exact ``fma.rn.bf16x2``).

The kernel is written as low-level TensorIR (threads, registers, ``ptx_legacy.mma``), not scheduled
from the prim_func, because the mma operand has to be *computed* in registers: no shared-memory
round trip of the decoded tile (the ``tensorcore`` rule's limit) and no float FMA per weight (the
``gemv`` rule's limit). Semantics are those of :func:`mxgemm.codegen.prim_func.prim_func`.

Operands are swapped (``Y^T = W X^T``, as Marlin does for small batches): 16 weight rows are the
mma's M and 8 activation rows its N, so M ≤ 8 wastes no tensor-core work on padding, and each
thread holds two weight rows, whose two scales per step it applies (one per 8 decoded codes).
Layout: the portable code planes, unchanged. The mma's 16-deep K is a permutation of real K chosen
so that a thread's operands are 8 consecutive codes of each of its rows (``w`` bytes per plane) and
8 consecutive activations (16 bytes): in K step ``u`` (32 k, one scale block) lane ``l`` takes rows
``l / 4`` and ``l / 4 + 8`` at k ``32u + 8 (l % 4) + 0..7``; mma ``g`` takes k ``+4g .. +4g+3`` of
every lane. A step's two mmas share one scale per weight row, so they go to a zeroed fp32 fragment
that is added to the accumulator times the scale (exact: a power of two). With ``Hints.frag`` the
codes are one plane of 4 or 8 bits in fragment order (:func:`~mxgemm.layout.frag_order`: a lane's
codes of a 128-K group one run), so a lane takes the mma's standard fragment, K ``2j, 2j+1, 2j+8,
2j+9`` of each 16 (``j = l % 4``), and its activations by four 32-bit loads.

Loads, by ``Hints.stages``:

- 0, a register pipeline: the next iteration's codes, scales and (up to 16 rows) activations are
  loaded into registers while this one computes. Bytes in flight cost registers, which cap occupancy.
- 2..4, a ``cp.async`` ring in shared memory per group of ``kn`` warps that share a K range:
  ``stages - 1`` iterations of codes, scales (each warp's own) and activations (up to 16 rows, one
  copy for the group, each warp issuing a share) in flight, 16-byte copies of whole row runs
  (XOR-swizzled so the lanes' reads hit distinct banks), read back with ``ld.shared`` after
  ``cp.async.wait_group`` and a barrier of the group (a warp barrier for one warp, else a named
  ``bar.sync``). The copies and reads go through ``T.ptx`` with explicit addresses, which TVM's
  shared-memory sync pass leaves alone.

With ``Hints.pdl`` (sm_90, a ring) the kernel is launched with programmatic dependent launch: it
lets the next kernel in the stream be scheduled at once (``griddepcontrol.launch_dependents``),
prefetches its first ring slots of codes and scales into L2, then waits for the previous kernel to
finish (``griddepcontrol.wait``) before it reads anything or writes Y. L2 is the GPU's point of
coherence, so a prefetch of weights that the previous kernel is still writing is harmless.

With ``Hints.fold`` (a ring) the block scales are folded into the decoded pairs where a warp's rows
allow it (:func:`~mxgemm.codegen.pairs.fold`): a prologue scans the warp's scale codes (byte-wise
max and min, the quad's lanes combined, one warp vote); when every row's codes lie within the
format's exact range of the row's largest and none is NaN, each pair is multiplied by its row's
power of two (one exact ``fma`` on the pair) and the mmas accumulate straight into the fp32
accumulator, without the zeroed fragment and its 4 FMAs per n8 tile and step; each output is then
brought to scale once (``ldexpf``). Otherwise the warp runs the plain loop. With ``Hints.mw`` (and
``xs``) ``mw`` warps side by side in M share a column's weight tiles: the ring holds its codes and
scales once, each warp multiplies them by ``1/mw`` of the M tile's n8 tiles, so a warp can hold more
weight tiles for each activation fragment it reads from shared memory.

Grid: ``N / (16 nt kn)`` blocks of ``kw × kn × mw`` warps; a warp owns ``nt`` 16-row weight tiles ×
``1/mw`` of the M tile (n8 tiles: the bucket, padded; rows ≥ M read zeros and are not stored) over
``1/kw`` of K; the ``kw`` warps of a column add up through shared memory.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import asdict, dataclass

from tvm import tirx

from mxgemm import formats
from mxgemm.codegen import nvcc, pairs
from mxgemm.codegen.decode import nan_scales, scale_exponent, scale_expr, u32
from mxgemm.codegen.wgmma import cluster_sync, dsmem_ld4
from mxgemm.layout import plane_widths

STEP = 32  # K per step: 4 threads × 8 codes
SMEM = 48 * 1024  # static shared memory per block (the cross-warp sum)
RING_SMEM = 192 * 1024  # dynamic shared memory per block (the rings; an H100 SM has 228 KB)
SM_SMEM = 228 * 1024  # shared memory of an H100 / H200 SM


@dataclass(frozen=True)
class Hints:
    """Tunable knobs. nt: 16-row weight tiles per warp (1, 2, 4, 8); kw: warps per block, splitting K
    (1, 2, 4, 8); unroll: K steps per loop iteration, their loads issued together (1, 2, 4; 4 or 8
    with a ring); stages: 0 for the register pipeline, else the depth of the ``cp.async`` ring (2..4
    iterations, block-32 scales only); kn: warps per block side by side in N that share one copy of
    the activations (1, 2, 4; more than 1 with a ring only); pdl: programmatic dependent launch
    (sm_90 and newer, with a ring): the launch and first loads overlap the previous kernel's tail, the
    next kernel let in at once (1) or once the previous one is done (2: one kernel ahead at most);
    shl: 1 for the pair decode by left shifts only (``pairs.decode_pair(left=True)``: the FMA pipe
    instead of the ALU pipe, which the decode keeps busiest); xs: 1 (a ring, an M tile over 16 rows)
    for activations that ride the ring too, one copy per group of ``kn`` warps (up to 8), each n8 tile
    read from shared memory just before its mmas (without it every warp loads the whole M tile from
    global memory: at 64 rows that is the activations once per 16 ``nt`` weight rows); fold: 1 (a
    ring) for block scales folded into the decoded pairs (:func:`~mxgemm.codegen.pairs.fold`) where a
    warp's rows allow it, so each mma accumulates straight into the fp32 accumulator (without it
    each step's two mmas go to a zeroed fragment added to the accumulator times the scale: 4 moves
    and 4 FMAs per n8 tile and step, a dependent chain); mw: warps per block side by side in M (1, 2,
    4; with ``xs``), each with ``1/mw`` of the M tile's n8 tiles and the same weight tiles, whose
    codes and scales the ring holds once for the ``mw`` warps (fewer accumulators a warp, so more
    weight tiles a warp: each activation fragment read from shared memory serves ``nt`` of them); frag:
    1 for codes in fragment order (:func:`~mxgemm.layout.frag_order`, one plane of 4 or 8 bits, a
    warp's K a multiple of 128): a lane's codes of a 128-K group are one run, and its activations of a
    step the mma's B fragment (four 32-bit loads, from the ring or from global memory); occ: 1..8 (a
    ring) for at most that many blocks an SM, the ring padded to hold them to it (0: as many as
    fit), so a kernel that needs few registers does not let as many blocks of the next kernel
    launched early (``pdl``) in beside its own; minb: 0, or the blocks an SM the kernel is compiled to
    hold (``__launch_bounds__``' minimum: ptxas keeps a thread's registers within 64K / (minb ×
    threads)), so a grid a little over what fits an SM's registers runs as one wave instead of a full
    wave and a thin tail (:func:`mxgemm.rules.mma.one_wave`), or a kernel that needs many registers
    runs more blocks an SM (:func:`mxgemm.rules.mma.capped`: at most 128 a thread); cvt: 1 (8-bit float codes,
    :func:`~mxgemm.codegen.pairs.cvt_supported`, no ``fold``) for each pair by one
    ``cvt.rn.f16x2`` of the two codes (:func:`~mxgemm.codegen.pairs.cvt_pair`; bf16: then widened,
    two ``cvt`` and a ``prmt``) instead of a byte permute and shifts and masks: the same products,
    and e4m3's NaN codes NaN; stab: 1 (a ring) for the steps' scaling cut to what the outputs need:
    a slot's block scales made floats once, each lane one word of 4 codes, into a table in shared
    memory that the lanes read 4 steps at a time (the 4 lanes of a quad hold the same rows, so
    without it each makes the same ``2**(c-127)``: 3 integer ops a row and step), and at one row (the
    M bucket 1) only the fragment's stored column scaled into the accumulator; ldm: 1 (a ring, not
    ``frag``) for the 4-bit plane's codes read by ``ldmatrix`` (a warp's 16 rows of two steps, the
    fragment's words, in one ``.x4``; one step in an ``.x2``) instead of a 32-bit load a row and
    step, where the format has that plane: a quarter of the loads and of their addresses; ks: 1, 2, 4
    (a ring) blocks of one cluster that split K (``kw`` warps each), their sums added in distributed
    shared memory (:meth:`_Kernel.cluster_sum`): a grid of few weight tiles gets ``ks`` times the
    blocks, each with a ``1/ks`` share of K."""

    nt: int = 4
    kw: int = 4
    unroll: int = 2
    stages: int = 0
    kn: int = 1
    pdl: int = 0
    shl: int = 0
    xs: int = 0
    fold: int = 0
    mw: int = 1
    frag: int = 0
    occ: int = 0
    minb: int = 0
    cvt: int = 0
    stab: int = 0
    ldm: int = 0
    ks: int = 1

    def __post_init__(self) -> None:
        ok = self.nt in (1, 2, 4, 8) and self.kw in (1, 2, 4, 8) and self.stages in (0, 2, 3, 4)
        ok = ok and self.unroll in ((4, 8) if self.stages else (1, 2, 4))
        ok = ok and self.kn in ((1, 2, 4, 8) if self.stages else (1,)) and self.kw * self.kn * self.mw <= 16
        ok = ok and self.mw in ((1, 2, 4) if self.xs else (1,))
        ok = ok and self.pdl in ((0, 1, 2) if self.stages else (0,)) and self.shl in (0, 1)
        ok = ok and self.xs in ((0, 1) if self.stages else (0,)) and (self.xs or self.kn < 8)
        ok = ok and self.fold in ((0, 1) if self.stages else (0,)) and self.frag in (0, 1)
        ok = ok and self.occ in (range(9) if self.stages else (0,))
        ok = ok and 0 <= self.minb and self.minb * 32 * self.kw * self.kn * self.mw <= 2048
        ok = ok and self.cvt in ((0, 1) if not self.fold else (0,))
        ok = ok and self.stab in ((0, 1) if self.stages else (0,))
        ok = ok and self.ldm in ((0, 1) if self.stages and not self.frag else (0,))
        ok = ok and self.ks in ((1, 2, 4) if self.stages else (1,))
        if not ok:
            raise ValueError(f"mma hints out of range: {self}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _ring_layout(h: Hints, bits: int, m_tile: int) -> tuple[int, int, int]:
    """(code bytes, scale bytes, activation bytes) of one ring slot: a warp's 16 rows × ``unroll``
    steps of every plane and of the scales per tile; the group's activations of up to 16 rows."""
    codes = h.nt * 16 * h.unroll * 4 * bits
    scales = h.nt * 16 * h.unroll
    x_n = -(-m_tile // 8)
    acts = h.unroll * x_n * min(8, m_tile) * 4 * 16 if x_n <= 2 or h.xs else 0
    return codes, scales, acts


def _red_bytes(h: Hints, m_tile: int) -> int:
    """The cross-warp sum: every warp but the first of each K split parks its fp32 accumulators (the
    ``mw`` warps of a column hold ``1/mw`` of the M tile each)."""
    return (h.kw - 1) * h.kn * h.nt * -(-m_tile // 8) * 4 * 32 * 4


def _part_bytes(h: Hints, m_tile: int) -> int:
    """The cluster's sum (``ks``): a block's sums (every column's first K warp's), after the
    cross-warp sum's bytes."""
    return h.kn * h.nt * -(-m_tile // 8) * 4 * 32 * 4 if h.ks > 1 else 0


def _slot_bytes(h: Hints, bits: int, m_tile: int) -> int:
    """One ring slot of a group of ``kn`` warps: each warp's codes and scales, one activation copy."""
    codes, scales, acts = _ring_layout(h, bits, m_tile)
    return h.kn * (codes + scales) + acts


def _table_bytes(h: Hints) -> int:
    """The float scales of a slot (``stab``): each warp's 16 rows × ``unroll`` steps per tile."""
    return h.kw * h.kn * h.mw * h.nt * 16 * h.unroll * 4 if h.stab else 0


def smem_bytes(h: Hints, m_tile: int, bits: int = 8) -> tuple[int, int]:
    """(static, dynamic) shared memory of a block. The register pipeline: the cross-warp sum,
    static. A ring: ``stages`` slots per group for ``bits``-wide codes, then (``stab``) the scale
    tables, dynamic; the sum reuses it after the loop."""
    red = _red_bytes(h, m_tile)
    if not h.stages:
        return red, 0
    ring = h.kw * h.stages * _slot_bytes(h, bits, m_tile) + _table_bytes(h)
    return 0, max(red + _part_bytes(h, m_tile), ring, occ_bytes(h.occ))


def occ_bytes(occ: int) -> int:
    """Dynamic shared memory that holds a block to ``occ`` blocks an SM (one more does not fit the
    SM's, 1 KB of it reserved a block); 0 for ``occ`` 0 (no bound)."""
    return 0 if not occ else -(-(SM_SMEM // (occ + 1) - 1024 + 16) // 16) * 16


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
    a_dtype: str = "float16",
) -> tirx.PrimFunc:
    """The kernel as a PrimFunc with :func:`~mxgemm.codegen.prim_func.prim_func`'s arguments: A
    ``a_dtype [m, k]`` (float16 or bfloat16; ``m`` static 1 for the bucket 1, else dynamic), the code
    planes ``uint8 [n, k*w/8]``, S ``uint8 [n, k/block_size]``, Bias ``out_dtype [n]`` (if ``bias``), Y
    ``out_dtype [m, n]``."""
    # here, not at import: a GPU box with the TVM runtime alone runs prebuilt kernels and routes with
    # this module, and its TVM has no script builder
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder() as ib:
        with T.prim_func():
            _Kernel(T, fmt, n, k, m_tile, out_dtype, bias, block_size, hints, a_dtype).emit()
    return ib.get()


@contextlib.contextmanager
def _when(T, cond):
    """Emit the body under ``T.If(cond)`` (unconditionally where ``cond`` is None)."""
    if cond is None:
        yield
        return
    with T.If(cond), T.Then():
        yield


class _Kernel:
    """Emits the kernel into the IR builder frame ``T`` is building (one method per part)."""

    def __init__(self, T, fmt, n, k, m_tile, out_dtype, bias, block_size, h, a_dtype):  # noqa: N803, PLR0913
        self.T, self.fmt, self.n, self.k, self.m_tile = T, fmt, n, k, m_tile
        self.a_dtype, self.fma = a_dtype, pairs.bf16_fma(fmt, a_dtype)
        self.out_dtype, self.bias, self.block_size, self.h = out_dtype, bias, block_size, h
        self.widths = plane_widths(fmt.bits)
        self.xt_n = -(-m_tile // 8)  # n8 tiles of activation rows
        self.xt_w = self.xt_n // h.mw  # of one warp
        if self.xt_n % h.mw:
            raise ValueError(f"mma hints {h}: {self.xt_n} n8 tiles of rows do not split over {h.mw} warps")
        self.steps = k // STEP // (h.kw * h.ks)  # K steps per warp
        self.iters = self.steps // h.unroll
        self.wide = n * k >= 2**31
        self.words = 2 if 8 in self.widths else 1  # uint32 words of a lane's codes of a step, per plane
        # activations ride the pipeline (64 rows in registers: too many; in the ring with ``xs``)
        self.pipe_x = self.xt_n <= 2 or bool(h.xs)
        # register pipeline: the scales of 4 steps in one 32-bit load (block 32, rows 4-byte aligned)
        self.s_word = not h.stages and block_size == STEP and h.unroll == 4 and (k // STEP) % 4 == 0
        if h.stages and block_size != STEP:
            raise ValueError(f"mma ring hints {h} need one scale per 32-wide step, not {block_size}")
        if h.frag and (self.widths not in ((4,), (8,)) or self.steps % 4):
            raise ValueError(
                f"mma hints {h}: fragment order takes one plane of 4 or 8 bits and a warp's K a multiple of "
                f"128 ({fmt.name}: planes {self.widths}, {self.steps * STEP} K a warp)"
            )
        self.fold = pairs.fold(fmt, a_dtype) if h.fold else None
        self.six = pairs.six_supported(fmt, a_dtype) and not h.cvt  # 6-bit floats: a code a byte first
        if h.cvt and not pairs.cvt_supported(fmt, a_dtype):
            raise ValueError(f"mma hints {h}: {fmt.name} codes in {a_dtype} take no cvt of fp8 pairs")
        if h.fold and self.fold is None:
            raise ValueError(f"mma hints {h}: {fmt.name} pairs in {a_dtype} take no folded scale")

    def ix(self, v):
        return tirx.Cast("int64", v) if self.wide else v

    # ---- arguments, threads, registers ---------------------------------------------------------

    def emit(self) -> None:  # noqa: PLR0915
        T, h, n, k = self.T, self.h, self.n, self.k
        T.func_name("main")
        attrs = {"global_symbol": "main", "tirx.noalias": True}
        T.func_attr(
            {**attrs, **({nvcc.PDL: True} if h.pdl else {}), **({nvcc.MIN_BLOCKS: h.minb} if h.minb else {})}
        )
        m = 1 if self.m_tile == 1 else tirx.Var("m", "int64")
        self.m64 = tirx.const(1, "int64") if self.m_tile == 1 else m
        a_h = T.arg("A", T.handle())
        names = [f"B{i}" if len(self.widths) > 1 else "B" for i in range(len(self.widths))]
        b_h = [T.arg(name, T.handle()) for name in names]
        s_h = T.arg("S", T.handle())
        bias_h = T.arg("Bias", T.handle()) if self.bias else None
        y_h = T.arg("Y", T.handle())
        self.A = T.match_buffer(a_h, (m, k), self.a_dtype)
        self.B = [T.match_buffer(b, (n, k * w // 8), "uint8") for b, w in zip(b_h, self.widths, strict=True)]
        self.S = T.match_buffer(s_h, (n, k // self.block_size), "uint8")
        self.Bias = T.match_buffer(bias_h, (n,), self.out_dtype) if self.bias else None
        self.Y = T.match_buffer(y_h, (m, n), self.out_dtype)

        bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
        ty, tz = T.env_thread("threadIdx.y"), T.env_thread("threadIdx.z")
        with contextlib.ExitStack() as launch:
            launch.enter_context(T.launch_thread(bx, n // (16 * h.nt * h.kn)))
            self.rank = 0
            if h.ks > 1:  # the K splits of a column of tiles: one cluster (its block rank is z)
                self.rank = T.env_thread("blockIdx.z")
                launch.enter_context(T.launch_thread(self.rank, h.ks))
                launch.enter_context(T.launch_thread(T.env_thread("clusterCtaIdx.z"), h.ks))
            for thread, extent in ((tz, h.kn * h.mw), (ty, h.kw), (tx, 32)):
                launch.enter_context(T.launch_thread(thread, extent))
            self.ty, self.tz, self.tx = ty, tz, tx
            self.kseg = ty if h.ks == 1 else self.rank * h.kw + ty  # the warp's K range, of kw·ks
            self.quad, self.j = tx // 4, tx % 4
            # the warp's weight column (kn) and M slice (mw): tz = my * kn + col
            self.col, self.my = (tz, 0) if h.mw == 1 else (tz % h.kn, tz // h.kn)
            self.n0 = bx * (16 * h.nt * h.kn) + self.col * (16 * h.nt)
            self.x32 = T.decl_buffer((m * k // 2,), "uint32", data=self.A.data)
            shape = (h.nt, self.xt_w, 4)
            self.acc = T.alloc_buffer(shape, "float32", scope="local")
            self.tmp = T.alloc_buffer(shape, "float32", scope="local")
            self.afr = T.alloc_buffer((h.nt, 2, 4), "uint32", scope="local")
            self.bfr = T.alloc_buffer((self.xt_w, 2, 2), "uint32", scope="local")
            for idx in itertools.product(*map(range, shape)):
                T.buffer_store(self.acc, tirx.const(0.0, "float32"), list(idx))
            if h.pdl:
                nvcc.pdl_around_wait(T, h.pdl, self.prefetch_l2)
            if h.stages:
                self.ring_setup()
            if self.fold is not None:
                self.fold_prologue()
                with T.If(tirx.BufferLoad(self.fast, [0]) != 0):
                    with T.Then():
                        self.ring_loop(fold=True)
                    with T.Else():
                        self.ring_loop()
            elif h.stages:
                self.ring_loop()
            else:
                self.register_loop()
            self.epilogue()

    def _zeroed(self, shape, dtype="uint32"):
        buf = self.T.alloc_buffer(shape, dtype, scope="local")
        for idx in itertools.product(*map(range, shape)):
            self.T.buffer_store(buf, tirx.const(0, dtype), list(idx))
        return buf

    # ---- compute: decode, mma, scale, accumulate one step ----------------------------------------

    def flag_nan(self, scale) -> None:
        """Note NaN scale codes: ``scale(t, r)`` a uint32 of E8M0 codes of row ``r`` of tile ``t``.
        One flag (one register) for all of a lane's rows; :meth:`nan_rows` finds the rows."""
        seen = tirx.BufferLoad(self.nan, [0])
        for t, r in itertools.product(range(self.h.nt), range(2)):
            seen = seen | nan_scales(scale(t, r))
        self.T.buffer_store(self.nan, seen, [0])

    def step(self, word, scale, read_x=None, factor=None) -> None:
        """One K step from registers: ``word(t, r, p, i)`` uint32 word ``i`` of plane ``p`` of this
        lane's row ``r`` (0: ``quad``, 1: ``quad + 8``) of tile ``t``; ``scale(t, r)`` its float32
        block scale; the activations already in :attr:`bfr`, or (``read_x``) read into ``bfr[a]``
        by ``read_x(a)`` one n8 tile at a time (:meth:`step_tiles`). ``factor(t, r)``: the row's
        folded scale multiplier (:class:`~mxgemm.codegen.pairs.Fold`), applied to the pairs instead,
        and the mmas accumulate straight into the accumulator."""
        T, h, xt_n = self.T, self.h, self.xt_w
        if factor is not None:
            fac = T.alloc_buffer((h.nt, 2), "uint32", scope="local")
            for t, r in itertools.product(range(h.nt), range(2)):
                T.buffer_store(fac, factor(t, r), [t, r])
        rows = list(itertools.product(range(h.nt), range(2)))
        six = {
            tr: pairs.six_words(word(*tr, 0, 0), pairs.six_high(word(*tr, 1, 0))) for tr in rows if self.six
        }
        for t, g, q in itertools.product(range(h.nt), range(2), range(4)):
            # a0..a3: rows quad / quad+8 × codes (4g, 4g+1) / (4g+2, 4g+3)
            wd = lambda p, i, t=t, r=q % 2: word(t, r, p, i)  # noqa: E731
            a = self.afr[t, g, q]
            if h.cvt:  # codes 2p, 2p+1 (p = 2g + q // 2): 16-bit half p % 2 of word p // 2
                pairs.cvt_pair(T, self.fmt, a, word(t, q % 2, 0, g), q // 2, self.a_dtype)
                continue
            if self.six:  # (shl: the same kernel)
                pair = pairs.six_pair(self.fmt, *six[t, q % 2], 2 * g + q // 2, dtype=self.a_dtype)
            else:
                pair = pairs.decode_pair(self.fmt, wd, 2 * g + q // 2, left=bool(h.shl), dtype=self.a_dtype)
            T.buffer_store(self.afr, pair, [t, g, q])
            if factor is None and self.fma is not None:
                T.evaluate(T.ptx.fma.rn.bf16x2(a, *self.fma.operands(a)))
            elif factor is not None:
                self.fold_pair(a, fac[t, q % 2])
        if factor is not None:
            for a in range(xt_n):
                if read_x is not None:
                    read_x(a)
                for t in range(h.nt):
                    self.mma_pair(t, a, self.acc)
            return
        if read_x is not None:
            self.step_tiles(scale, read_x)
            return
        for t, a in itertools.product(range(h.nt), range(xt_n)):
            for e in range(4):
                T.buffer_store(self.tmp, tirx.const(0.0, "float32"), [t, a, e])
            self.mma_pair(t, a, self.tmp)
        one = h.stab and self.m_tile == 1  # column 2j + 1 of the fragment is never row 0
        for t, r in itertools.product(range(h.nt), range(2)):
            sc = scale(t, r)
            for a, e in itertools.product(range(xt_n), (2 * r,) if one else (2 * r, 2 * r + 1)):
                prod = tirx.BufferLoad(self.acc, [t, a, e]) + tirx.BufferLoad(self.tmp, [t, a, e]) * sc
                T.buffer_store(self.acc, prod, [t, a, e])

    def fold_pair(self, a, f) -> None:
        """Pair ``a`` (a :attr:`afr` element) times its row's folded scale multiplier ``f`` (uint32
        bits of two fp16 or bf16 powers of two), in place, exactly."""
        T, fold = self.T, self.fold
        fma = T.ptx.fma.rn.f16x2 if self.a_dtype == "float16" else T.ptx.fma.rn.bf16x2
        if self.fma is not None and not fold.merged:  # integer codes: the magic number first
            T.evaluate(fma(a, *self.fma.operands(a)))
        T.evaluate(fma(a, a, f, u32(0x80008000)))  # a f + -0: keeps the sign of zero

    def mma_pair(self, t, a, acc) -> None:
        """The step's two mmas of weight tile ``t`` × activation tile ``a`` into ``acc[t, a]``."""
        ab = {"float16": "fp16", "bfloat16": "bf16"}[self.a_dtype]
        for g in range(2):
            self.T.evaluate(
                self.T.ptx_legacy.mma(
                    "m16n8k16", "row", "col", ab, ab, "fp32",
                    self.afr.data, (t * 2 + g) * 4, self.bfr.data, (a * 2 + g) * 2,
                    acc.data, (t * self.xt_w + a) * 4, False, dtype="float32",
                )
            )  # fmt: skip

    def step_tiles(self, scale, read_x) -> None:
        """The mmas of a step n8 tile by n8 tile (``xs``): read tile ``a``'s activations, then each
        weight tile's two mmas into a zeroed fragment that is scaled into the accumulator at once, so
        only a tile's operands and fragments are live (64 activation rows would otherwise hold 64
        registers of operands and 64 of fragments)."""
        T, h = self.T, self.h
        scl = T.alloc_buffer((h.nt, 2), "float32", scope="local")
        for t, r in itertools.product(range(h.nt), range(2)):
            T.buffer_store(scl, scale(t, r), [t, r])
        for a in range(self.xt_w):
            read_x(a)
            for t in range(h.nt):
                for e in range(4):
                    T.buffer_store(self.tmp, tirx.const(0.0, "float32"), [t, a, e])
                self.mma_pair(t, a, self.tmp)
                for e in range(4):
                    prod = self.acc[t, a, e] + self.tmp[t, a, e] * scl[t, e // 2]
                    T.buffer_store(self.acc, prod, [t, a, e])

    def read_x(self, slot, ur, a) -> None:
        """The warp's activation tile ``a`` of step ``ur`` of a ring slot into ``bfr[a]`` (rows ≥ M
        read what the slot holds: they feed only output columns that are not stored)."""
        dst = [self.bfr[a, g, q] for g in range(2) for q in range(2)]
        self.ld_x(dst, slot, ur, self.my * self.xt_w + a)

    def ld_x(self, dst, slot, ur, a) -> None:
        """This lane's activations of tile ``a``, step ``ur``, of a slot into the 4 registers ``dst``:
        its 16 bytes (K ``8j ..``), or (``frag``) the mma's B fragment: K ``2j, 2j+1`` of each 8-K
        chunk, four 32-bit loads (past an M tile of under 8 rows, lanes read one of its rows again:
        they feed only outputs that are not stored)."""
        T = self.T
        if not self.h.frag:
            T.evaluate(T.ptx.ld.shared.v4.b32(*dst, self._x_addr(slot, ur, a, self.quad, self.j)))
            return
        qn = min(8, self.m_tile)
        row = self.quad if qn == 8 else self.quad % qn  # (rows past the tile: any, unstored)
        for c in range(4):
            T.evaluate(
                T.ptx.ld.shared.b32(
                    dst[c], self._x_addr(slot, ur, a, row, c) + tirx.Cast("uint32", 4 * self.j)
                )
            )

    def _x_addr(self, slot, ur, a, row, chunk):
        """The shared address of 8-K chunk ``chunk`` of activation ``row`` of tile ``a``, step ``ur``, of
        a slot (``frag``: XOR-moved by the row, so the 8 rows' words a load reads hit distinct banks)."""
        if self.h.frag:
            chunk = tirx.bitwise_xor(chunk, row // 2 % 4)
        idx = ((ur * self.xt_n + a) * min(8, self.m_tile) + row) * 4 + chunk
        return self._smem(slot, self.x_off + idx * 16, own=False)

    def set_x(self, xbuf, ur) -> None:
        """The activations of step ``ur`` from ``xbuf[ur, a, 0..3]`` into the mma B fragments."""
        for a, g, q in itertools.product(range(self.xt_n), range(2), range(2)):
            self.T.buffer_store(self.bfr, tirx.BufferLoad(xbuf, [ur, a, 2 * g + q]), [a, g, q])

    def load_x(self, it, xbuf) -> None:
        """The activations of iteration ``it`` from global memory (rows ≥ M keep their zeros)."""
        T, h, k = self.T, self.h, self.k
        step0 = self.kseg * self.steps + it * h.unroll
        for ur, a in itertools.product(range(h.unroll), range(self.xt_n)):
            xrow = tirx.Cast("int64", a * 8 + self.quad)
            with T.If(xrow < self.m64):
                with T.Then():
                    if h.frag:  # K 2j, 2j+1 of each 8-K chunk: the mma's B fragment
                        for c in range(4):
                            off = xrow * (k // 2) + self.ix((step0 + ur) * 16 + 4 * c + self.j)
                            T.buffer_store(xbuf, tirx.BufferLoad(self.x32, [off]), [ur, a, c])
                        continue
                    off = xrow * (k // 2) + self.ix((step0 + ur) * 16 + self.j * 4)
                    vec = tirx.BufferLoad(self.x32, [tirx.Ramp(off, 1, 4)])
                    T.buffer_store(xbuf, vec, [ur, a, tirx.Ramp(0, 1, 4)])

    # ---- stages = 0: register pipeline --------------------------------------------------------

    def register_loop(self) -> None:
        """Iteration ``it + 1``'s loads are in flight in registers while ``it`` computes (the
        activations too, up to 16 rows)."""
        T, h = self.T, self.h
        xraw = self._zeroed((h.unroll, self.xt_n, 4))
        xcur = self._zeroed((h.unroll, self.xt_n, 4))
        wraw = T.alloc_buffer((h.unroll, h.nt, 2, len(self.widths), self.words), "uint32", scope="local")
        sraw = T.alloc_buffer((1 if self.s_word else h.unroll, h.nt, 2), "uint32", scope="local")
        wcur = T.alloc_buffer(wraw.shape, "uint32", scope="local")
        scur = T.alloc_buffer(sraw.shape, "uint32", scope="local")
        if self.s_word:
            self.s32 = T.decl_buffer((self.n * self.k // STEP // 4,), "uint32", data=self.S.data)
        self.views = []
        for bb, w in zip(self.B, self.widths, strict=True):
            # a view whose element is (part of) one thread's w bytes of a step
            vdt, per = {8: ("uint32", 4), 4: ("uint32", 4), 2: ("uint16", 2), 1: ("uint8", 1)}[w]
            self.views.append((T.decl_buffer((self.n * self.k * w // 8 // per,), vdt, data=bb.data), w, per))

        def compute(wbuf, sbuf, xbuf):
            for ur in range(h.unroll):
                self.set_x(xbuf, ur)

                # the exact decode per step: the ring's cheaper one made the 64-row kernels (255
                # registers) 5-10% slower (mma-kn-scales-41e141d.md)
                def scale(t, r, ur=ur):
                    if self.s_word:
                        return scale_expr(tirx.BufferLoad(sbuf, [0, t, r]) >> u32(8 * ur) & u32(255))
                    return scale_expr(tirx.BufferLoad(sbuf, [ur, t, r]))

                self.step(lambda t, r, p, i, ur=ur: tirx.BufferLoad(wbuf, [ur, t, r, p, i]), scale)

        def copy(dst, src):
            for idx in itertools.product(*(range(int(d)) for d in src.shape)):
                T.buffer_store(dst, tirx.BufferLoad(src, list(idx)), list(idx))

        self.load_weights(0, wraw, sraw)
        if self.pipe_x:
            self.load_x(0, xraw)
        with T.serial(0, self.iters - 1) as it:
            copy(wcur, wraw)
            copy(scur, sraw)
            if self.pipe_x:
                copy(xcur, xraw)
            self.load_weights(it + 1, wraw, sraw)
            if self.pipe_x:
                self.load_x(it + 1, xraw)
            else:
                self.load_x(it, xcur)
            compute(wcur, scur, xcur)
        if not self.pipe_x:
            self.load_x(self.iters - 1, xraw)
        compute(wraw, sraw, xraw)

    def load_weights(self, it, wbuf, sbuf) -> None:
        """The codes and scales of iteration ``it`` (``unroll`` steps) into registers."""
        T, h, k = self.T, self.h, self.k
        step0 = self.kseg * self.steps + it * h.unroll
        if self.s_word:
            for t, r in itertools.product(range(h.nt), range(2)):
                row = self.n0 + 16 * t + self.quad + 8 * r
                val = tirx.BufferLoad(self.s32, [(self.ix(row) * (k // STEP) + step0) // 4])
                T.buffer_store(sbuf, val, [0, t, r])
        for ur, t, r in itertools.product(range(h.unroll), range(h.nt), range(2)):
            step, row = step0 + ur, self.n0 + 16 * t + self.quad + 8 * r
            for p, (view, w, per) in enumerate(self.views):
                # this thread's w bytes: (row * k + 32 step + 8 j) * w / 8; frag: lane j's run of the
                # step's 128-K group, word step % 4 of it
                lane = self._lane_byte(step, w)
                base = self.ix(row) * (k * w // 8 // per) + lane // per
                for q in range(max(1, w // 4)):
                    val = tirx.Cast("uint32", tirx.BufferLoad(view, [base + q]))
                    T.buffer_store(wbuf, val, [ur, t, r, p, q])
            if not self.s_word:
                val = tirx.Cast("uint32", tirx.BufferLoad(self.S, [row, step * STEP // self.block_size]))
                T.buffer_store(sbuf, val, [ur, t, r])

    # ---- stages ≥ 2: cp.async ring ------------------------------------------------------------

    def ring_setup(self) -> None:
        """The ring (shared memory), once for every loop of the kernel (and, with two loops, the NaN
        flag)."""
        T, h = self.T, self.h
        codes, scales, _ = _ring_layout(h, self.fmt.bits, self.m_tile)
        self.slot16 = _slot_bytes(h, self.fmt.bits, self.m_tile) // 16  # every part: a multiple of 16 bytes
        # a group's slot: each warp's codes, then its scales; then the activations
        self.w_unit = self.col * ((codes + scales) // 16)  # this warp's column's part, in 16-byte units
        self.s_off, self.x_off = codes, h.kn * (codes + scales)
        # the cross-warp sum reuses the ring after the loop (one dynamic allocation, so a block over
        # 48 KB always gets the opt-in: static + dynamic bytes must not pass 48 KB without it)
        red16 = -(-_red_bytes(h, self.m_tile) // 16)
        self.t_off = h.kw * h.stages * self.slot16  # the scale tables (``stab``), after the slots
        self.part_off = red16  # the cluster's sum (``ks``), after the cross-warp sum
        units = max(self.t_off + _table_bytes(h) // 16, red16 + _part_bytes(h, self.m_tile) // 16)
        if h.occ:  # (smem_bytes)
            units = max(units, occ_bytes(h.occ) // 16)
        self.ring = T.alloc_buffer((units,), "uint32x4", scope="shared.dyn")
        if self.fold is not None:  # before the two loops (else where the loop's registers are)
            self.nan = self._zeroed((1,))

    def ring_loop(self, fold: bool = False) -> None:
        """``stages - 1`` iterations in flight through the group's ring; iteration ``it`` waits for
        its copies (``wait_group``), a barrier of the group (the warp, or its ``kn`` warps) makes
        every lane's copies visible to all, then the slot freed by ``it - 1`` is refilled with ``it +
        stages - 1`` and ``it`` computes. Block scales: :func:`~mxgemm.codegen.decode.scale_exponent`
        (3 ops, code 255 as +inf), NaN codes flagged per word (:meth:`flag_nan`); or, ``fold``,
        multipliers of the decoded pairs (:meth:`fold_prologue`: no NaN code there)."""
        T, h = self.T, self.h
        # a slot's codes and activations go to registers all at once (fewer dependent waits), except
        # with 16 activation rows: one step ahead of the mmas (fewer registers); both measured faster.
        # frag: all at once (a step's words of 8 rows 128 bytes apart share 8 banks: 4-way conflicts)
        ahead = self.xt_n != 2 or bool(h.frag)
        nb = h.unroll if ahead else 2
        wreg = T.alloc_buffer((nb, h.nt, 2, len(self.widths), self.words), "uint32", scope="local")
        sreg = T.alloc_buffer((h.nt, 2, h.unroll // 4), "uint32", scope="local")
        treg = T.alloc_buffer((h.nt, 2, 4), "uint32", scope="local") if h.stab else None
        xreg = self._zeroed((nb, self.xt_n, 4)) if self.pipe_x and not h.xs else None
        xcur = None if self.pipe_x else self._zeroed((h.unroll, self.xt_n, 4))
        if self.fold is None:
            self.nan = self._zeroed((1,))  # nonzero once one of this lane's rows had a NaN scale (255)
        commit = T.ptx["cp.async.commit_group"]
        for s in range(h.stages - 1):
            if s < self.iters:
                self.ring_issue(s, s)
            T.evaluate(commit())
        with T.serial(0, self.iters) as it:
            T.evaluate(T.ptx["cp.async.wait_group"](h.stages - 2))
            if h.kn * h.mw == 1:
                T.evaluate(T.ptx.bar.warp.sync(u32(0xFFFFFFFF)))
            else:  # the group's warps: named barrier 1 + ty (0 is __syncthreads)
                T.evaluate(T.ptx.bar.sync(tirx.Cast("uint32", self.ty + 1), u32(32 * h.kn * h.mw)))
            nxt = it + h.stages - 1
            with T.If(nxt < self.iters):
                with T.Then():
                    self.ring_issue(nxt, nxt % h.stages)
            T.evaluate(commit())
            if not self.pipe_x:
                self.load_x(it, xcur)
            slot = it % h.stages
            self.read_steps(slot, range(h.unroll) if ahead else [0], wreg, xreg, sreg)
            for q in range(0 if fold else h.unroll // 4):  # folded: no NaN code (the prologue)
                self.flag_nan(lambda t, r, q=q: tirx.BufferLoad(sreg, [t, r, q]))
            if h.stab and not fold:
                self.scale_table(slot)
            for ur in range(h.unroll):
                if not ahead and ur + 1 < h.unroll:
                    self.read_steps(slot, [ur + 1], wreg, xreg)
                if h.xs:
                    pass  # each n8 tile from the ring, in :meth:`step`
                elif self.pipe_x:
                    self.set_x(xreg, ur % nb)
                else:
                    self.set_x(xcur, ur)

                def scale(t, r, ur=ur):  # code 255: +inf, made NaN by the flag
                    if h.stab:
                        return tirx.reinterpret("float32", tirx.BufferLoad(treg, [t, r, ur % 4]))
                    return scale_exponent(tirx.BufferLoad(sreg, [t, r, ur // 4]), ur % 4)

                if h.stab and not fold and ur % 4 == 0:
                    self.read_table(treg, ur)

                def factor(t, r, ur=ur):
                    code = tirx.BufferLoad(sreg, [t, r, ur // 4]) >> u32(8 * (ur % 4)) & u32(255)
                    return code * u32(self.fold.mul) + tirx.BufferLoad(self.fold_add, [t, r])

                word = lambda t, r, p, i, b=ur % nb: tirx.BufferLoad(wreg, [b, t, r, p, i])  # noqa: E731
                read_x = (lambda a, ur=ur: self.read_x(slot, ur, a)) if h.xs else None
                self.step(word, scale, read_x, factor if fold else None)

    def _table(self, byte):
        """The shared-state address of byte ``byte`` of this warp's scale table (``stab``: float32
        ``[nt * 16 rows, unroll]``)."""
        h = self.h
        warp = self.ty * (h.kn * h.mw) + self.tz
        return self._ring_addr(self.t_off + warp * (h.nt * h.unroll * 4) + byte // 16, byte % 16)

    def scale_table(self, slot) -> None:
        """The warp's block scales of ring slot ``slot`` as floats (``2**(c-127)``, code 255 +inf) into
        its table: lane ``l`` converts scale word ``l`` (+32 ...), 4 steps of a row; then a warp
        barrier (the barrier at the next iteration's top keeps the table until every lane read it)."""
        T, h = self.T, self.h
        words = h.nt * 16 * h.unroll // 4
        word = T.alloc_buffer((1,), "uint32", scope="local")
        for i in range(-(-words // 32)):
            wi = self.tx + 32 * i
            with _when(T, wi < words if words % 32 else None):
                T.evaluate(T.ptx.ld.shared.b32(word[0], self._smem(slot, self.s_off + 4 * wi)))
                bits = [tirx.reinterpret("uint32", scale_exponent(word[0], b)) for b in range(4)]
                T.evaluate(T.ptx.st.shared.v4.b32(self._table(16 * wi), *bits))
        T.evaluate(T.ptx.bar.warp.sync(u32(0xFFFFFFFF)))

    def read_table(self, treg, ur) -> None:
        """This lane's rows' float scales of steps ``ur .. ur + 3`` from the warp's table into
        ``treg`` (uint32 bits)."""
        T, h = self.T, self.h
        for t, r in itertools.product(range(h.nt), range(2)):
            row = t * 16 + self.quad + 8 * r
            dst = [treg[t, r, q] for q in range(4)]
            T.evaluate(T.ptx.ld.shared.v4.b32(*dst, self._table((row * h.unroll + ur) * 4)))

    def fold_prologue(self) -> None:
        """Whether this warp's block scales fold (:class:`~mxgemm.codegen.pairs.Fold`): each lane
        scans a quarter of its rows' scale codes over the warp's K (uint32 words, byte-wise max and
        min), the quad's lanes combine theirs, and the warp folds (:attr:`fast`) when no row has a
        NaN code and every row's codes lie within the fold's spread of the row's largest. Sets the
        rows' multiplier addends (:attr:`fold_add`) and output exponents (:attr:`out_exp`, for
        ``ldexpf``; :func:`~mxgemm.codegen.pairs.out_factor`'s alone when the warp does not fold)."""
        T, h, fold = self.T, self.h, self.fold
        row_words = self.k // STEP // 4  # the ring has one scale byte a step and ≥ 4 steps a warp
        s32 = T.decl_buffer((self.n * row_words,), "uint32", data=self.S.data)
        words = self.steps // 4  # of a row in this warp's K range
        hi = self._zeroed((h.nt, 2))
        lo = T.alloc_buffer((h.nt, 2), "uint32", scope="local")
        for t, r in itertools.product(range(h.nt), range(2)):
            T.buffer_store(lo, u32(0xFFFFFFFF), [t, r])
        with T.serial(0, -(-words // 4)) as i:
            w = self.j + 4 * i
            with T.If(w < words):
                with T.Then():
                    for t, r in itertools.product(range(h.nt), range(2)):
                        row = self.ix(self.n0 + 16 * t + self.quad + 8 * r)
                        v = tirx.BufferLoad(s32, [row * row_words + self.kseg * (self.steps // 4) + w])
                        T.buffer_store(hi, pairs.vmaxu4(hi[t, r], v), [t, r])
                        T.buffer_store(lo, pairs.vminu4(lo[t, r], v), [t, r])
        ok = self._zeroed((1,), "int32")
        T.buffer_store(ok, tirx.const(1, "int32"), [0])
        self.fold_add = T.alloc_buffer((h.nt, 2), "uint32", scope="local")
        self.out_exp = T.alloc_buffer((h.nt, 2), "int32", scope="local")
        for t, r in itertools.product(range(h.nt), range(2)):
            good, add, exp = pairs.fold_row(T, fold, hi, lo, [t, r])
            T.buffer_store(ok, ok[0] & tirx.Cast("int32", good), [0])
            T.buffer_store(self.fold_add, add, [t, r])
            T.buffer_store(self.out_exp, exp, [t, r])
        self.fast = T.alloc_buffer((1,), "int32", scope="local")
        all_ok = tirx.call_extern("int32", "__all_sync", u32(0xFFFFFFFF), ok[0])
        T.buffer_store(self.fast, all_ok, [0])
        oe = round(math.log2(pairs.out_factor(self.fmt)))
        for t, r in itertools.product(range(h.nt), range(2)):
            out = tirx.Select(self.fast[0] != 0, self.out_exp[t, r] + oe, tirx.const(oe, "int32"))
            T.buffer_store(self.out_exp, out, [t, r])

    def prefetch_l2(self) -> None:
        """L2 prefetch of this warp's codes and scales of the ring's first ``stages - 1`` iterations
        (lanes 0..15: a row each, a prefetch per 128 bytes)."""
        T, h, tx = self.T, self.h, self.tx
        with T.If(tx < 16):
            with T.Then():
                for it in range(min(h.stages - 1, self.iters)):
                    step0 = self.kseg * self.steps + it * h.unroll
                    for t in range(h.nt):
                        row = self.ix(self.n0 + 16 * t + tx)
                        for bb, w in zip(self.B, self.widths, strict=True):
                            for off in range(0, 4 * w * h.unroll, 128):
                                T.evaluate(T.ptx.prefetch.global_.L2(bb.ptr_to([row, step0 * (4 * w) + off])))
                        T.evaluate(T.ptx.prefetch.global_.L2(self.S.ptr_to([row, step0])))

    def _lane_byte(self, step, w: int):
        """The byte of this lane's ``w`` bytes of K step ``step`` in a row of codes (from a 128-K group's
        start): ``32 step + 8 j`` codes, or (``frag``) word ``step % 4`` of lane ``j``'s run."""
        if self.h.frag:
            return step // 4 * (16 * w) + self.j * (4 * w) + step % 4 * w
        return step * (4 * w) + self.j * w

    def _smem(self, slot, byte, own=True):
        """The shared-state address of byte ``byte`` of this warp's part (``own``; else of the
        group's activations, ``byte`` from the slot's start) of ring slot ``slot`` (indexing 16-byte
        elements, so the buffer's extent covers every 16-byte copy)."""
        unit = (self.ty * self.h.stages + slot) * self.slot16 + byte // 16
        return self._ring_addr(unit + self.w_unit if own else unit, byte % 16)

    def _ring_addr(self, unit, rem):
        """The shared-state address of byte ``rem`` (< 16) of the ring's 16-byte element ``unit``."""
        T = self.T
        addr = T.cuda.cvta_generic_to_shared(T.address_of(self.ring[unit]))
        return addr if isinstance(rem, int) and rem == 0 else addr + tirx.Cast("uint32", rem)

    def _swizzle(self, chunk, row, pieces: int):
        """16-byte chunk ``chunk`` of ``row`` (``pieces`` chunks a row) XOR-moved so the 8 rows a
        quarter-warp reads start in distinct bank groups (``frag``, rows of 128 bytes or more: so the
        two rows' runs it reads, chunk ``j`` (4-bit) or ``2j + c`` (8-bit) of a group, are in
        distinct bank groups)."""
        p8 = min(pieces, 8)
        if p8 == 1:
            return chunk
        if self.h.frag and p8 == 8:
            return tirx.bitwise_xor(chunk, row % 2 * (4 if self.widths == (4,) else 1))
        return tirx.bitwise_xor(chunk, row // (8 // p8) % p8)

    def ring_issue(self, it, slot) -> None:
        """``cp.async`` of iteration ``it``'s codes (16-byte chunks of 16 rows × ``unroll`` steps per
        plane and tile) and scales (``unroll`` bytes a row), by the first warp of each column's ``mw``,
        and the activations (16 bytes a lane a step, by the group)."""
        T, h = self.T, self.h
        step0 = self.kseg * self.steps + it * h.unroll
        if h.mw == 1:
            self.ring_issue_codes(step0, slot)
        else:
            with T.If(self.my == 0):
                with T.Then():
                    self.ring_issue_codes(step0, slot)
        if self.pipe_x:
            self.ring_issue_x(step0, slot)

    def ring_issue_codes(self, step0, slot) -> None:
        """The codes and scales of the slot's steps from ``step0``, by one warp."""
        T, h, tx = self.T, self.h, self.tx
        cp16 = T.ptx["cp.async.cg.shared.global"]
        off = 0
        for t in range(h.nt):
            for bb, w in zip(self.B, self.widths, strict=True):
                rowb = 4 * w * h.unroll  # bytes of a row in this slot
                pieces = rowb // 16
                for i in range(-(-16 * pieces // 32)):
                    unit = tx + 32 * i
                    row, c = unit // pieces, unit % pieces
                    grow = self.ix(self.n0 + 16 * t + row)
                    src = bb.ptr_to([grow, step0 * (4 * w) + c * 16])
                    dst = self._smem(slot, off + row * rowb + self._swizzle(c, row, pieces) * 16)
                    if 16 * pieces >= 32 * (i + 1):
                        T.evaluate(cp16(dst, src, 16))
                    else:
                        with T.If(tx < 16 * pieces - 32 * i):
                            with T.Then():
                                T.evaluate(cp16(dst, src, 16))
                off += 16 * rowb
        cp_s = T.ptx["cp.async.ca.shared.global"]
        for t in range(h.nt):  # lanes 0..15: one row's `unroll` scale bytes each
            with T.If(tx < 16):
                with T.Then():
                    src = self.S.ptr_to([self.n0 + 16 * t + tx, step0])
                    T.evaluate(cp_s(self._smem(slot, self.s_off + (t * 16 + tx) * h.unroll), src, h.unroll))

    def ring_issue_x(self, step0, slot) -> None:
        """The group's activations of the slot's steps from ``step0``: chunk c is step ur, n8 tile a,
        row quad, k 8j.. (rows ≥ M not copied)."""
        T, h, tx = self.T, self.h, self.tx
        cp16 = T.ptx["cp.async.cg.shared.global"]
        qn = min(8, self.m_tile)
        total, lanes = h.unroll * self.xt_n * qn * 4, 32 * h.kn * h.mw
        for i in range(-(-total // lanes)):
            c = self.tz * 32 + tx + lanes * i
            ur, a, quad, j = c // (4 * qn * self.xt_n), c // (4 * qn) % self.xt_n, c // 4 % qn, c % 4
            cond = tirx.Cast("int64", a * 8 + quad) < self.m64
            if total < lanes * (i + 1):
                cond = tirx.And(c < total, cond)
            with T.If(cond):
                with T.Then():
                    src = self.A.ptr_to([a * 8 + quad, (step0 + ur) * STEP + j * 8])
                    # (the planes' kernels keep their own form of the same address: their TIR, which the
                    # tune log's records were restated against, stays as it was)
                    dst = (
                        self._x_addr(slot, ur, a, quad, j)
                        if h.frag
                        else self._smem(slot, self.x_off + c * 16, own=False)
                    )
                    T.evaluate(cp16(dst, src, 16))

    def ld_matrices(self, slot, off, urs, dst) -> None:
        """A 4-bit plane's codes of steps ``urs`` of a ring slot (its tile's rows from byte ``off``)
        by ``ldmatrix``: matrix ``2 i + r`` of an ``.x4`` is rows ``8 r ..`` of the pair's step ``i``
        (a row's 16 bytes of a step, wherever :meth:`_swizzle` put them: 8 rows × 8 16-bit
        elements), whose lane ``4 quad + j`` gets word ``j`` of row ``quad``: what a 32-bit load of
        ``dst(ur, r)`` reads; an odd step last by an ``.x2``. Lane ``l`` gives the address of row
        ``l % 8`` of matrix ``l // 8`` (of an ``.x2``'s: ``l // 8 % 2``)."""
        T = self.T
        urs = list(urs)
        for i in range(0, len(urs), 2):
            group = urs[i : i + 2]
            mat = self.tx // 8 % (2 * len(group))
            row = self.tx % 8 + 8 * (mat % 2)
            ur = group[0] + mat // 2
            chunk = self._swizzle(ur, row, self.h.unroll)
            addr = self._smem(slot, off + row * (16 * self.h.unroll) + chunk * 16)
            regs = [dst(u, r) for u in group for r in range(2)]
            num = {4: "x4", 2: "x2"}[len(regs)]
            T.evaluate(getattr(T.ptx.ldmatrix.sync.aligned.m8n8, num).shared.b16(*regs, addr))

    def read_steps(self, slot, urs, wreg, xreg, sreg=None) -> None:
        """This lane's codes of steps ``urs`` of a ring slot into ``wreg[ur % len(wreg)]``, then (if
        ``sreg``) its two rows' scale codes (``unroll`` bytes a row), then (if ``xreg``) its
        activations into ``xreg[ur % len(xreg)]``."""
        T, h = self.T, self.h
        ld = T.ptx.ld.shared
        nb = int(wreg.shape[0])
        off = 0
        for t in range(h.nt):
            for p, w in enumerate(self.widths):
                rowb = 4 * w * h.unroll
                if w == 4 and h.ldm:
                    self.ld_matrices(slot, off, urs, lambda ur, r, t=t, p=p: wreg[ur % nb, t, r, p, 0])
                    off += 16 * rowb
                    continue
                runs = h.frag and list(urs) == list(range(h.unroll))  # a lane's runs read whole
                for ur, r in itertools.product(urs, range(2)):
                    row = self.quad + 8 * r
                    byte = self._lane_byte(ur, w)  # this lane's w bytes of step ur
                    chunk = self._swizzle(byte // 16, row, rowb // 16)
                    addr = self._smem(slot, off + row * rowb + chunk * 16 + byte % 16)
                    dst = [wreg[ur % nb, t, r, p, q] for q in range(self.words)]
                    if runs:  # a 16-byte chunk: steps ur .. ur + 16 / w, read at the first
                        if ur % (16 // w) == 0:
                            steps = range(ur, ur + 16 // w)
                            dst = [wreg[u % nb, t, r, p, q] for u in steps for q in range(self.words)]
                            T.evaluate(ld.v4.b32(*dst, addr))
                    elif w == 8:
                        T.evaluate(ld.v2.b32(*dst, addr))
                    else:
                        T.evaluate(getattr(ld, {4: "b32", 2: "u16", 1: "u8"}[w])(dst[0], addr))
                off += 16 * rowb
        if sreg is not None:
            for t, r in itertools.product(range(h.nt), range(2)):
                addr = self._smem(slot, self.s_off + (t * 16 + self.quad + 8 * r) * h.unroll)
                dst = [sreg[t, r, q] for q in range(h.unroll // 4)]
                T.evaluate(ld.v2.b32(*dst, addr) if len(dst) == 2 else ld.b32(dst[0], addr))
        if xreg is not None:
            for ur, a in itertools.product(urs, range(self.xt_n)):
                dst = [xreg[ur % nb, a, q] for q in range(4)]
                if h.frag:  # (every lane loads: rows past M feed only unstored outputs)
                    self.ld_x(dst, slot, ur, a)
                    continue
                with T.If(tirx.Cast("int64", a * 8 + self.quad) < self.m64):
                    with T.Then():
                        self.ld_x(dst, slot, ur, a)

    # ---- cross-warp sum, then the epilogue (warp 0) ---------------------------------------------

    def nan_rows(self) -> None:
        """The ring's rare path: a scale of this lane's rows was NaN (code 255), which
        :func:`~mxgemm.codegen.decode.scale_exponent` made +inf: rescan the rows' scales over this
        warp's K and make their sums NaN."""
        T, h = self.T, self.h
        nan = tirx.const(float("nan"), "float32")
        with T.serial(0, self.steps) as s:
            block = (self.kseg * self.steps + s) * STEP // self.block_size
            for t, r in itertools.product(range(h.nt), range(2)):
                row = self.n0 + 16 * t + self.quad + 8 * r
                with T.If(tirx.BufferLoad(self.S, [row, block]) == tirx.const(255, "uint8")):
                    with T.Then():
                        for a, e in itertools.product(range(self.xt_w), (2 * r, 2 * r + 1)):
                            T.buffer_store(self.acc, nan, [t, a, e])

    def epilogue(self) -> None:
        T, h, xt_n, tx, ty = self.T, self.h, self.xt_w, self.tx, self.ty
        tiles = list(itertools.product(range(h.nt), range(xt_n), range(4)))
        if h.stages:
            with T.If(tirx.BufferLoad(self.nan, [0]) != u32(0)):
                with T.Then():
                    self.nan_rows()
        if self.fold is not None:  # each warp's sums to true scale before the cross-warp sum
            for t, a, e in tiles:
                val = tirx.ldexp(self.acc[t, a, e], self.out_exp[t, e // 2])
                T.buffer_store(self.acc, val, [t, a, e])
        if h.kw > 1:
            shape = (h.kw - 1, h.kn * h.mw, h.nt, xt_n, 4, 32)
            if h.stages:  # in the ring, once every warp is done with it
                T.evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))
                red = T.decl_buffer(shape, "float32", data=self.ring.data, scope="shared.dyn")
            else:
                red = T.alloc_buffer(shape, "float32", scope="shared")
            with T.If(ty > 0):
                with T.Then():
                    for t, a, e in tiles:
                        val = tirx.BufferLoad(self.acc, [t, a, e])
                        T.buffer_store(red, val, [ty - 1, self.tz, t, a, e, tx])
            T.evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))

        def total(t, a, e):  # the block's sum: this warp's and its column's other K warps'
            val = tirx.BufferLoad(self.acc, [t, a, e])
            for w_ in range(h.kw - 1):
                val = val + tirx.BufferLoad(red, [w_, self.tz, t, a, e, tx])
            return val

        if h.ks > 1:
            self.cluster_sum(total)
            return
        with T.If(ty == 0):
            with T.Then():
                for t, a, e in tiles:
                    self.put(t, a, e, total(t, a, e))

    def put(self, t, a, e, total) -> None:
        """Element ``e`` of this lane's fragment of weight tile ``t`` × activation tile ``a``, summed
        over K (``total``, float32), to Y: brought to scale, the bias added, where its row is < M."""
        T = self.T
        row = (self.my * self.xt_w + a) * 8 + self.j * 2 + e % 2
        col = self.n0 + 16 * t + self.quad + 8 * (e // 2)
        factor = 1.0 if self.h.cvt else pairs.out_factor(self.fmt)  # (cvt: true values)
        val = total if self.fold else total * tirx.const(factor, "float32")
        if self.bias:
            val = val + tirx.Cast("float32", tirx.BufferLoad(self.Bias, [col]))
        with T.If(tirx.Cast("int64", row) < self.m64):
            with T.Then():
                T.buffer_store(self.Y, tirx.Cast(self.out_dtype, val), [row, col])

    def cluster_sum(self, total) -> None:
        """``ks``: the cluster's blocks add up their sums (``total(t, a, e)``, each block's K share) in
        distributed shared memory: every block but the first parks its first K warps' sums in its
        ring (16 bytes a lane and fragment), a cluster barrier, the first block's first K warps add
        them in block order (``ld.shared::cluster``) and write Y, and a second barrier keeps every
        block's shared memory until they are read."""
        T, h, ty, tx = self.T, self.h, self.ty, self.tx
        frags = list(itertools.product(range(h.nt), range(self.xt_w)))
        if h.kw == 1:  # every warp done with the ring (kw > 1: the cross-warp sum's barriers)
            T.evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))

        # the ring seen as floats, as the cross-warp sum sees it (one element type in its scope)
        sums = T.decl_buffer((self.ring.shape[0] * 4,), "float32", data=self.ring.data, scope="shared.dyn")

        def addr(t, a):
            at = (self.part_off + ((self.tz * h.nt + t) * self.xt_w + a) * 32 + tx) * 4
            return T.cuda.cvta_generic_to_shared(T.address_of(sums[at]))

        with T.If(ty == 0):
            with T.Then():
                for t, a, e in itertools.product(range(h.nt), range(self.xt_w), range(4)):
                    T.buffer_store(self.acc, total(t, a, e), [t, a, e])
        with T.If(tirx.And(ty == 0, self.rank > 0)):
            with T.Then():
                for t, a in frags:
                    vals = [tirx.reinterpret("uint32", self.acc[t, a, e]) for e in range(4)]
                    T.evaluate(T.ptx.st.shared.v4.b32(addr(t, a), *vals))
        cluster_sync(T)
        with T.If(tirx.And(ty == 0, self.rank == 0)):
            with T.Then():
                part = T.alloc_buffer((4,), "float32", scope="local")
                for t, a in frags:
                    for rank in range(1, h.ks):  # in block order
                        dsmem_ld4(T, [part[e] for e in range(4)], addr(t, a), u32(rank))
                        for e in range(4):
                            T.buffer_store(self.acc, self.acc[t, a, e] + part[e], [t, a, e])
                    for e in range(4):
                        self.put(t, a, e, self.acc[t, a, e])
        cluster_sync(T)
