"""A decode-fused GEMM on Hopper's wgmma for mid and large M: MX/BFP weights × fp16/bf16 activations.

Operands are swapped as in :mod:`~mxgemm.codegen.mma` (``Y^T = W X^T``): a warpgroup's 64 weight rows
are the wgmma's M, decoded in registers straight into its A fragment (``wgmma ... m64n{mt}k16``
with A from registers, per warp the layout of ``mma.sync.m16n8k16``'s A:
:func:`~mxgemm.codegen.pairs.decode_pair`), and ``Hints.mt`` activation rows its N, read by the tensor
cores from shared memory (128-byte-swizzled, :mod:`~mxgemm.codegen.wgmma`). The block scales are
folded into the decoded pairs (:func:`~mxgemm.codegen.pairs.fold`: each pair times
``2^(code - row max + c0)``, one exact ``fma``), so the wgmmas accumulate the whole K in fp32 and each
output is brought to scale once (``ldexpf``). That needs every row's scale codes within the fold's
spread of the row's largest and no NaN code: a prologue finds each row's largest and smallest code
(byte-wise max/min over the row's scale words, the quad's lanes combined) and the block votes
(``__syncthreads_and``); a block that does not fold runs each step's two wgmmas into a fragment that
is added to the accumulator times the rows' block scales.

The codes are the portable planes that :mod:`~mxgemm.codegen.mma` reads (:func:`~mxgemm.layout.plane_widths`:
one plane of 2, 4 or 8 bits, or for 6-bit codes a plane of their low 4 bits and one of their high 2).
A wgmma's A fragment wants lane ``j``'s 8 codes of a 32-code step to be those of K ``2j, 2j+1, 2j+8,
2j+9`` (the step's first k16 wgmma) and ``+16`` (its second), so the activations stay in natural K
order: each lane loads its rows' 8, 16 or 32 bytes of the step of each plane and gathers them with
``prmt`` (2-bit planes: and shifts). A slot holds each plane's codes apart, so its rows' 16-byte chunks
stay whole for ``cp.async`` and TMA. With ``Hints.frag`` the codes (one plane of 4 or 8 bits) come in
fragment order (:func:`~mxgemm.layout.frag_order`): a lane's codes of a row's slot are one run, read
as they are.

Block: ``wg`` warpgroups (64 weight rows each) × ``mt`` activation rows, over K in slots of 128
(4 scale steps, 8 wgmmas). A ``cp.async`` ring of ``stages`` slots holds the activations (two
128-byte-swizzled halves of 64 K), the codes (XOR-swizzled 16-byte chunks a row, so a quarter-warp's
8 rows hit distinct banks) and the scale codes (4 bytes a row). Each iteration decodes the slot's 4
steps into 32 fragment registers, issues its 8 wgmmas and waits for them; with ``Hints.double`` two
sets of fragments alternate, the next slot decoded while this one's wgmmas run (``wait_group 1``).

Ring sync (``Hints.ring``): 0, a block barrier an iteration (after ``cp.async.wait_group``); 1, two
mbarriers a slot after the ring (their 1 KB keeps the slots' 1024-byte swizzle alignment): ``full``
completes when every thread's copies into the slot landed (``cp.async.mbarrier.arrive.noinc``),
``empty`` when every thread is done with it (its wgmmas waited for), so a warp runs ahead until a
slot it refills is still read.

Loads by TMA (``Hints.tma``, on the mbarrier ring): 1, the activations; 2, the codes too. One thread
a block loads them with ``cp.async.bulk.tensor`` through tensor maps the host encodes per call
(activations: boxes of 64 K × ``mt`` rows, 128-byte swizzle, rows past M read as zeros; codes: a
row's bytes of the slot × the block's rows, the 64- or 128-byte swizzle that is the chunks' XOR
above), completing on the slot's ``full`` barrier (``expect_tx``); the other threads issue only
the scale codes' copies. With ``Hints.prod``, warp 0 alone refills the ring (its lanes copy the scale
codes): only it waits for the slot it refills to be empty, the other warps only for slots to fill.
(Multicasting the activations to a cluster of 2 or 4 blocks along N lost to one block's loads on every
shape and M measured on an H100.)

Split K (``Hints.splits`` > 1, for grids short of the SMs): grid z takes a K range each and writes its
fp32 partial sums, already brought to scale, into a workspace ``[splits, m, n]``; a second kernel
adds them in split order (deterministic) with the bias and writes Y. Every split scans its rows'
whole scale codes, so all agree on the fold. With ``Hints.cluster`` a tile's splits run as one
cluster of blocks (grid z, up to 8) and add up in distributed shared memory instead: each block, its
wgmmas done, writes its sums brought to scale into its own ring (``[mt, 64 wg + 4]`` fp32, the
padding makes the stores conflict-free), a cluster barrier, then each block adds a ``1/splits`` share
of the tile's rows from every block's shared memory in split order (``mapa`` +
``ld.shared::cluster``; the second kernel's bits), adds the bias and writes Y, and a second cluster
barrier keeps every block's shared memory until all have read it. No workspace, no second kernel.

Stream-K (``Hints.sk`` 1 or 2, on the mbarrier ring): a persistent grid of ``sk`` blocks an SM (no
more than there is work) instead of a block a tile, so the last wave does not idle SMs. The tiles'
K iterations (tiles in N-major order, a tile's M tiles adjacent) are cut into units (two iterations
with ``double``) and each block takes an equal contiguous run of them: whole tiles in the middle,
written to Y, and parts of at most two at its ends. The ring runs on across a block's tiles. A part's
fp32 sums, brought to scale, go to a workspace ``[blocks, 2, mt, 64 wg]`` (the block's first and
last tile); a second kernel adds a shared tile's parts in block order (deterministic) with the bias.
Every part scans its rows' whole scale codes, so all agree on the fold. With 256-row tiles, a tile
whose scales do not fold adds each step's products into its workspace slot through volatile loads
and stores (:func:`~mxgemm.codegen.wgmma.fma_to`): with plain ones the compiler holds the slot's 128
sums in registers across the K loop, beside the accumulator, and spills.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import asdict, dataclass

from tvm import tirx

from mxgemm import formats
from mxgemm.codegen import nvcc, pairs
from mxgemm.codegen import target as targets
from mxgemm.codegen.decode import scale_expr, u32
from mxgemm.codegen.wgmma import (
    DESC,
    ROW,
    SMEM_MAX,
    bar_sync,
    cached,
    cluster_sync,
    descriptor,
    dsmem_ld4,
    fence_regs,
    fma_to,
    main_args,
    ring_turn,
    smem_addr,
    st_shared,
    swizzled,
    when,
)
from mxgemm.layout import plane_widths

STEP = 32  # K per scale block: two k16 wgmmas
BK = 128  # K per ring slot (``Hints.bk`` 64: half of it)
WIDTHS = (2, 4, 8)  # widths of the bit planes read (6-bit codes: planes of 4 and 2 bits)
SWIZZLE = {16: 0, 32: 1, 64: 2, 128: 3}  # TMA's swizzle mode of a plane's row of a slot, by its bytes
M_TILES = (16, 32, 64, 128, 256)  # activation rows a block
# past 128 activation rows (a 128-register accumulator), a thread loads a step's code words just
# before decoding it, and the unfolded path decodes a step at a time and runs its wgmmas on 64-row
# parts of the tile (a 32-register fragment beside the accumulator): no spills
BIG = 128
SPLITS = (1, 2, 4, 8)  # K ranges (grid z)
PAD = 4  # floats after each row of a cluster's partial tile in shared memory (conflict-free stores)
TMA = (0, 1, 2)  # loads by TMA: none, the activations, the activations and the codes
SK = (0, 1, 2)  # stream-K: off, or a persistent grid of 1 or 2 blocks an SM
PROD = (0, 1, 2)  # who refills the ring (tma 2): every thread, warp 0, or a warpgroup of its own
# prod 2 with two warpgroups: registers of a compute and of a producer thread. The block starts with
# 168 a thread (384 threads); the producer's 128 × (168 - 40) make the computes' 256 × (232 - 168)
REGS = (232, 40)
SM_SMEM = 228 * 1024  # shared memory of an SM (1 KB of it reserved a block)
FIX = 8  # outputs a thread of the stream-K fixup


@dataclass(frozen=True)
class Hints:
    """wg: warpgroups per block (1..4), 64 weight rows each; stages: ring slots (3..6); double: 1 to
    decode the next slot while this one's wgmmas run (two fragment sets); mt: activation rows a
    block (the wgmmas' N: 16, 32, 64, 128 or 256; the grid tiles any M); splits: K ranges run by
    separate blocks (1, 2, 4, 8), their partial sums added by a second kernel; ring: how the ring's slots are
    synchronized (0: a block barrier an iteration, 1: mbarriers a slot); tma: what TMA loads
    (``ring`` 1) instead of every thread's ``cp.async``: 0, nothing; 1, the activations; 2, the
    activations and the codes; sk: stream-K (``ring`` 1, no ``splits``): 0, a block a tile; 1 or 2, a
    persistent grid of that many blocks an SM sharing out the tiles' K iterations evenly; prod (``tma``
    2): who refills the ring: 0, every thread (each waits for the slot it refills to be empty); 1,
    warp 0 alone (its lanes copy the scale codes), the other warps only waiting for slots to fill;
    2 (``wg`` 1 or 2), the first warp of one more warpgroup, the producer, which runs ahead of the
    others by as many slots as are free; lean: 1 to make each wgmma's descriptor by one add to the
    slot's, each fold multiplier by a byte permute and a multiply-add, and (fp4 into fp16) a lane's
    4 pairs of a step from one word (:func:`~mxgemm.codegen.pairs.decode_quad`: the plain decode's
    pairs): fewer instructions a K iteration; 2, that and the outputs brought to scale by one multiply a row's
    output instead of ``ldexpf`` where the exponents allow (:meth:`_Kernel._store`); cluster: 1 to
    add a split K's partial sums in distributed shared memory across a cluster of the splits' blocks
    instead of a workspace and a second kernel (``splits`` > 1); early: 1 to issue the ring's first
    loads before the scan of the rows' scale codes (whose global loads then overlap them; the
    producer warpgroup, ``prod`` 2, starts at once and the others vote on a barrier of their own), 0
    to scan first (stream-K scans at every tile, after the ring's first loads); frag: 1 to read the
    codes in fragment order (:func:`~mxgemm.layout.frag_order`: a lane's codes of a row's slot are
    one 16- or 32-byte run, one or two ``ld.shared.v4`` and no ``prmt``), 0 in the planes' K order;
    pdl (``sk`` 0): launch with programmatic dependent launch: while the previous kernel finishes the
    block prefetches its first slots' codes and scale codes into L2 and (``early`` 0) scans its scale
    codes, none of which the previous kernel writes; it waits for it (``griddepcontrol.wait``) before
    it loads an activation or writes anything (the second kernel of a split K waits at its start); 1
    lets the next kernel in the stream start at once (``griddepcontrol.launch_dependents`` first: on a
    grid short of the SMs the kernels after it start too, each prefetching), 2 once the previous kernel
    is done (after the wait: one kernel ahead at most); cvt: 1 (8-bit float codes,
    :func:`~mxgemm.codegen.pairs.cvt_supported`) for each pair by one ``cvt.rn.f16x2``, bf16 then
    widened (:func:`~mxgemm.codegen.pairs.cvt_pair`: the elements themselves, folded and brought to scale
    accordingly; e4m3's NaN codes NaN); bk: K a ring slot holds (128, or 64: half the bytes a slot,
    so twice the slots fit, e.g. five of 8-bit codes with two warpgroups × 256 rows where two of 128
    do; a slot holds its K window's 4 scale codes a row, of which it uses the half its K is in)."""

    wg: int = 2
    stages: int = 4
    double: int = 1
    mt: int = 128
    splits: int = 1
    ring: int = 0
    tma: int = 0
    sk: int = 0
    prod: int = 0
    lean: int = 0
    cluster: int = 0
    early: int = 0
    frag: int = 0
    pdl: int = 0
    cvt: int = 0
    bk: int = BK

    def __post_init__(self) -> None:
        ok = self.bk in (BK, BK // 2) and self.wg in (1, 2, 3, 4) and self.double in (0, 1)
        ok = ok and 3 <= self.stages <= (6 if self.bk == BK else 8)
        ok = ok and self.mt in M_TILES and self.splits in SPLITS and self.ring in (0, 1)
        ok = ok and self.sk in SK and (not self.sk or (self.ring and self.splits == 1))
        ok = ok and self.prod in PROD and (not self.prod or self.tma == 2)
        ok = ok and (self.prod < 2 or self.wg <= 2) and self.lean in (0, 1, 2)
        ok = ok and self.cluster in (0, 1) and (not self.cluster or self.splits > 1)
        ok = ok and self.early in (0, 1) and not (self.early and self.sk) and self.frag in (0, 1)
        ok = ok and self.pdl in (0, 1, 2) and not (self.pdl and self.sk) and self.cvt in (0, 1)
        ok = ok and not (self.frag and self.bk != BK)
        if not ok or self.tma not in TMA or (self.tma and not self.ring):
            raise ValueError(
                f"wgmma_w hints {self}: bk 128|64, wg 1..4, stages 3..6 (bk 64: 3..8), double 0|1, "
                "mt 16|32|64|128|256, splits 1|2|4|8, ring 0|1, tma 0|1|2 (with ring 1), "
                "sk 0|1|2 (with ring 1 and splits 1), "
                "prod 0|1|2 (with tma 2; 2 with wg 1|2), lean 0|1|2, cluster 0|1 (1 with splits > 1), "
                "early 0|1 (1 with sk 0), frag 0|1 (0 with bk 64), pdl 0|1|2 (sk 0), cvt 0|1"
            )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def smem_bytes(self, bits: int) -> int:
        """Dynamic shared memory of a block: the slots, and (``ring``) 1 KB for the mbarriers."""
        return self.stages * self.slot_bytes(bits)[2] + 1024 * self.ring

    def partial_bytes(self) -> int:
        """Shared memory of a block's partial tile (``cluster``): ``mt`` rows of ``64 wg`` fp32 sums
        and :data:`PAD` more."""
        return self.mt * (64 * self.wg + PAD) * 4

    def slot_bytes(self, bits: int) -> tuple[int, int, int]:
        """Byte offsets in a slot of the codes and the scale codes, and the slot's size."""
        codes = self.bk // 64 * self.mt * ROW  # 128-byte-swizzled halves of 64 K
        scales = codes + 64 * self.wg * self.bk * bits // 8
        return codes, scales, -(-(scales + 64 * self.wg * 4) // 1024) * 1024


def applies(fmt: formats.Format, n: int, k: int, a_dtype: str, h: Hints = Hints()) -> str | None:
    """Why the kernel cannot run ``[*, k] @ [n, k]^T`` of ``fmt`` weights, or None."""
    widths = plane_widths(fmt.bits)
    if any(w not in WIDTHS for w in widths):
        return f"{fmt.name}: codes of {fmt.bits} bits in planes of {widths} bits (planes of 2, 4 or 8 wanted)"
    if h.frag and (len(widths) > 1 or widths[0] == 2):
        return f"{fmt.name}: fragment order takes one plane of 4 or 8 bits, not {widths}"
    if pairs.fold(fmt, a_dtype) is None:
        return f"{fmt.name} pairs in {a_dtype} take no folded scale"
    if h.cvt and not pairs.cvt_supported(fmt, a_dtype):
        return f"{fmt.name} codes in {a_dtype} take no cvt of fp8 pairs"
    if n % (64 * h.wg):
        return f"N={n} is not a multiple of {64 * h.wg}"
    if k % (h.splits * (2 * h.bk if h.double else h.bk)) or k % BK:  # (a slot's scale word: 128 K)
        per = f"{h.splits} ranges of " if h.splits > 1 else ""
        return f"K={k} is not a multiple of {per}{max(2 * h.bk if h.double else h.bk, BK)}"
    if h.mt > 64 and h.wg > 2:  # ptxas: 128-row tiles need ~200 registers a thread, 256-row ~240
        return f"{h.wg} warpgroups with an M tile of {h.mt} spill registers (170 at most at 384 threads)"
    if h.smem_bytes(fmt.bits) > SMEM_MAX:
        bars = " and the barriers" if h.ring else ""
        return f"{h.stages} slots of {h.slot_bytes(fmt.bits)[2]} bytes{bars} exceed {SMEM_MAX}"
    if h.cluster and h.partial_bytes() > h.stages * h.slot_bytes(fmt.bits)[2]:
        return f"a partial tile of {h.partial_bytes()} bytes exceeds the {h.stages} slots it reuses (cluster)"
    if h.sk and h.mt * 64 * h.wg % (256 * FIX):
        return f"stream-K's fixup takes tiles of {256 * FIX} outputs at least, not {h.mt} × {64 * h.wg}"
    if h.sk == 2 and h.prod == 2:
        return "two blocks with a producer warpgroup do not fit an SM's registers (sk 2)"
    if h.sk == 2 and 2 * (h.smem_bytes(fmt.bits) + 1024) > SM_SMEM:
        return f"two blocks of {h.smem_bytes(fmt.bits)} bytes of shared memory do not fit an SM (sk 2)"
    return None


def kernel(
    fmt: formats.Format,
    *,
    n: int,
    k: int,
    out_dtype: str,
    bias: bool,
    a_dtype: str,
    hints: Hints = Hints(),
) -> tirx.PrimFunc:
    """The kernel as a PrimFunc with :func:`~mxgemm.codegen.prim_func.prim_func`'s arguments: A
    ``a_dtype [m, k]`` (m dynamic), B uint8 ``[n, k*bits/8]`` (the portable codes of one plane; of two:
    B0 uint8 ``[n, k/2]``, the codes' low 4 bits, and B1 uint8 ``[n, k/4]``, their high 2), S uint8
    ``[n, k/32]``, Bias ``out_dtype [n]`` (if ``bias``), Y ``out_dtype [m, n]``."""
    why = applies(fmt, n, k, a_dtype, hints)
    if why:
        raise ValueError(f"wgmma_w: {why}")
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder() as ib:
        with T.prim_func():
            _Kernel(T, fmt, n, k, out_dtype, bias, a_dtype, hints).emit()
    return ib.get()


def compiled(fmt: str, n: int, k: int, dtype: str, bias: bool, hints: Hints = Hints()):
    """The kernel (called ``f(A, B, S, [Bias], Y)``, :func:`kernel`'s arguments, activations and
    outputs in ``dtype``), built once into the kernel cache."""
    spec = {"op": "wgmma_w", "fmt": fmt, "n": n, "k": k, "dtype": dtype, "bias": bias}
    f = formats.get(fmt)
    return cached(
        {**spec, "hints": asdict(hints)},
        lambda: kernel(f, n=n, k=k, out_dtype=dtype, bias=bias, a_dtype=dtype, hints=hints),
    )


class _Kernel:
    def __init__(self, T, fmt, n, k, out_dtype, bias, a_dtype, h: Hints):  # noqa: N803, PLR0913
        self.T, self.fmt, self.n, self.k, self.m_tile = T, fmt, n, k, h.mt
        self.out_dtype, self.bias, self.a_dtype, self.h = out_dtype, bias, a_dtype, h
        self.w = fmt.bits  # bytes of a lane's 8 codes of a row
        self.widths = plane_widths(fmt.bits)  # its bit planes' widths, low bits first
        self.fold = pairs.fold(fmt, a_dtype, true_values=bool(h.cvt))
        self.fma = None if h.cvt else pairs.bf16_fma(fmt, a_dtype)  # (cvt: true values)
        self.quads = h.lean and pairs.quad_supported(fmt, a_dtype)  # (one plane of 4-bit codes)
        self.six = pairs.six_supported(fmt, a_dtype)  # 6-bit floats: a code a byte first
        self.codes_off, self.scales_off, self.slot = h.slot_bytes(fmt.bits)
        self.bk, self.steps = h.bk, h.bk // STEP  # K of a slot, scale steps of a slot
        self.chunks = h.bk * fmt.bits // 128  # 16-byte chunks of a row's codes in a slot
        self.pchunks = [h.bk * w // 128 for w in self.widths]  # of each plane
        # each plane's codes of a slot: the block's rows, a row's chunks together
        self.poff = [self.codes_off + 64 * h.wg * 16 * sum(self.pchunks[:p]) for p in range(len(self.widths))]
        self.iters = k // h.bk // h.splits  # a block's
        self.ahead = h.stages - 2 if h.double else h.stages - 1
        self.frag = h.mt // 2  # fp32 registers of a thread's m64n{mt} fragment
        self.part = h.mt if h.mt <= BIG else 64  # activation rows of an unfolded path's wgmma
        self.unit = 2 if h.double else 1  # iterations of a stream-K unit (double: a trip's two)
        self.ctas = targets.sm_count("sm_90") * h.sk  # blocks of a stream-K grid (at most)
        self.c0 = 0  # the ring's count at the first iteration of the block's current tile
        self.part_of = None  # stream-K: (block, workspace slot, the tile run whole?) of the current tile

    def emit(self) -> None:
        T, h, n, k = self.T, self.h, self.n, self.k
        planes = ["B"] if len(self.widths) == 1 else [f"B{p}" for p in range(len(self.widths))]
        m, handles, bias_h, y_h = main_args(T, ("A", *planes, "S"), self.bias, pdl=bool(h.pdl))
        self.m = m
        self.A = T.match_buffer(handles[0], (m, k), self.a_dtype)
        planes = zip(handles[1:-1], self.widths, strict=True)
        self.Bs = [T.match_buffer(b, (n, k * w // 8), "uint8") for b, w in planes]
        self.S = T.match_buffer(handles[-1], (n, k // STEP), "uint8")
        self.Bias = T.match_buffer(bias_h, (n,), self.out_dtype) if self.bias else None
        self.Y = T.match_buffer(y_h, (m, n), self.out_dtype)

        # split K: the partial sums of split z, brought to scale (fp32 [splits, m, n]); stream-K: a
        # block's parts of its first and last tile (fp32 [blocks, 2, mt, 64 wg])
        split_ws = h.splits > 1 and not h.cluster
        self.ws = T.alloc_buffer((h.splits, m, n), "float32", scope="global") if split_ws else None
        if h.sk:
            self.ws = T.alloc_buffer((self.ctas, 2, h.mt, 64 * h.wg), "float32", scope="global")
        self.tmaps = self.tensor_maps() if h.tma else None
        bx, by, tx = T.env_thread("blockIdx.x"), T.env_thread("blockIdx.y"), T.env_thread("threadIdx.x")
        m_tiles = tirx.Cast("int32", (m + (self.m_tile - 1)) // self.m_tile)
        if h.sk:
            self.stream_k(bx, tx, m_tiles)
            self.fixup()
            return
        with contextlib.ExitStack() as launch:
            launch.enter_context(T.launch_thread(bx, m_tiles))
            launch.enter_context(T.launch_thread(by, n // (64 * h.wg)))
            self.z = None
            if h.splits > 1:
                self.z = T.env_thread("blockIdx.z")
                launch.enter_context(T.launch_thread(self.z, h.splits))
            if h.cluster:  # the splits of a tile: one cluster (its block rank is z)
                launch.enter_context(T.launch_thread(T.env_thread("clusterCtaIdx.z"), h.splits))
            launch.enter_context(T.launch_thread(tx, 128 * (h.wg + (h.prod == 2))))
            self.m0, self.n0 = tirx.Cast("int64", bx) * self.m_tile, by * (64 * h.wg)
            self.block_buffers(tx)
            self.zero_acc()
            self.start()
            self.prologue()
            compute = self.fold_loop_and_epilogue if h.early else self.loop_and_epilogue
            if h.prod == 2:
                self.specialized(compute)
            else:
                compute()
            if h.cluster:
                self.cluster_reduce()
        if h.splits > 1 and not h.cluster:
            self.add_splits()

    def block_buffers(self, tx) -> None:
        """The thread's coordinates, the ring, the accumulator, the fragments and the descriptor."""
        T, h = self.T, self.h
        self.tx = tx
        self.wg, self.warp, self.lane = tx // 128, tx % 128 // 32, tx % 32
        self.quad, self.j = self.lane // 4, self.lane % 4
        self.ring = T.alloc_buffer((h.smem_bytes(self.w) // 16,), "uint32x4", scope="shared.dyn")
        self.acc = T.alloc_buffer((self.frag,), "float32", scope="local")
        self.afr = T.alloc_buffer((1 + h.double, self.steps, 2, 4), "uint32", scope="local")
        self.desc = T.alloc_buffer((1,), "uint64", scope="local")

    def fold_loop_and_epilogue(self) -> None:
        """``early``: the block's fold scanned (the ring's first loads in flight), then its tile."""
        self.rows_fold()
        self.loop_and_epilogue()

    def loop_and_epilogue(self) -> None:
        """A block's tile: its K loop, then its sums brought to scale and stored."""
        self.loop(self.iters)
        self.epilogue()

    def specialized(self, compute) -> None:
        """``prod`` 2: the last warpgroup's first warp refills the ring throughout (as many slots
        ahead as are free), the others ``compute()``; with two compute warpgroups, the registers move
        from the producer to them (``setmaxnreg``: :data:`REGS`)."""
        T, h = self.T, self.h
        setmax = lambda how, n: T.evaluate(T.ptx[f"setmaxnreg.{how}.sync.aligned.u32"](n))  # noqa: E731
        with T.If(self.tx >= 128 * h.wg):
            with T.Then():
                if h.wg == 2:
                    setmax("dec", REGS[1])
                with T.If(self.tx < 128 * h.wg + 32):
                    with T.Then():
                        with T.serial(0, self.iters) as t:
                            with T.If(t >= h.stages):
                                with T.Then():
                                    self._wait(t % h.stages, 1, (t // h.stages - 1) % 2)
                            self.issue(t, t % h.stages)
                            self._arrive_full(t % h.stages)
            with T.Else():
                if h.wg == 2:
                    setmax("inc", REGS[0])
                compute()

    def zero_acc(self) -> None:
        for i in range(self.frag):
            self.T.buffer_store(self.acc, tirx.const(0.0, "float32"), [i])

    # ---- stream-K ------------------------------------------------------------------------------

    def sk_grid(self, m_tiles):
        """Stream-K: the tiles (int64), the units, the blocks launched (the grid, at most a unit each)
        and a unit's block ``g(x) = ((x + 1) blocks - 1) // units``: block ``b`` takes the units from
        ``b units // blocks``."""
        tiles = tirx.Cast("int64", m_tiles) * (self.n // (64 * self.h.wg))
        units = tiles * (self.k // self.bk // self.unit)
        blocks = tirx.min(tirx.const(self.ctas, "int64"), units)
        return tiles, units, blocks

    def tile_origin(self, tile, m_tiles):
        """The first activation row (int64) and weight row (int32) of ``tile`` (int32, N-major)."""
        mi, ni = tirx.truncmod(tile, m_tiles), tirx.truncdiv(tile, m_tiles)
        return tirx.Cast("int64", mi) * self.m_tile, ni * (64 * self.h.wg)

    def stream_k(self, bx, tx, m_tiles) -> None:
        """The persistent kernel: block ``bx``'s units, tile by tile (a part of its first and last, whole
        ones between), one ring throughout."""
        T, h = self.T, self.h
        per_tile = self.k // self.bk // self.unit  # units
        _, units, blocks = self.sk_grid(m_tiles)
        threads = 128 * (h.wg + (h.prod == 2))
        with T.launch_thread(bx, tirx.Cast("int32", blocks)), T.launch_thread(tx, threads):
            self.block_buffers(tx)
            g = tirx.Cast("int64", bx)
            u0 = T.Bind(tirx.Cast("int32", g * units // blocks))  # the block's units: [u0, u1)
            u1 = T.Bind(tirx.Cast("int32", (g + 1) * units // blocks))
            self.x0 = u0 * self.unit  # the block's first iteration of the tiles' whole run
            self.iters = T.Bind((u1 - u0) * self.unit)
            self.zero_acc()  # (once: ptxas serializes the wgmmas where the loop writes the registers)
            self.m_tiles = m_tiles
            # the tile of the last issue and its origin (:meth:`coords`)
            self.issued = T.alloc_buffer((3,), "int32", scope="local")
            T.buffer_store(self.issued, tirx.const(-1, "int32"), [0])
            first = tirx.truncdiv(u0, per_tile)
            self.prologue()

            def tiles() -> None:
                with T.serial(0, tirx.truncdiv(u1 - 1, per_tile) - first + 1) as v:
                    tile = T.Bind(first + v)
                    lo = T.Bind(tirx.max(u0, tile * per_tile))
                    hi = T.Bind(tirx.min(u1, (tile + 1) * per_tile))
                    self.m0, self.n0 = (T.Bind(x) for x in self.tile_origin(tile, m_tiles))
                    self.c0 = T.Bind((lo - u0) * self.unit)
                    slot = tirx.Select(v == 0, tirx.const(0, "int32"), tirx.const(1, "int32"))
                    self.part_of = (bx, slot, hi - lo == per_tile)
                    self.rows_fold()
                    self.loop((hi - lo) * self.unit)
                    self.epilogue()

            if h.prod == 2:  # (the ring counts run on across the tiles: the producer's loop is the same)
                self.specialized(tiles)
            else:
                tiles()

    def coords(self, it):
        """The activation row and weight row (the tile's origin) and the K iteration that ring count
        ``it`` loads."""
        if not self.h.sk:
            if self.z is not None:  # the block's K range
                it = self.z * self.iters + it
            return self.m0, self.n0, it
        T, per = self.T, self.k // self.bk
        x = self.x0 + it
        tile = tirx.truncdiv(x, per)
        with T.If(tile != self.issued[0]):  # a new tile: its origin (a division by the M tiles)
            with T.Then():
                T.buffer_store(self.issued, tile, [0])
                for i, v in enumerate(self.tile_origin(tile, self.m_tiles)):
                    T.buffer_store(self.issued, tirx.Cast("int32", v), [i + 1])
        m0 = tirx.Cast("int64", tirx.BufferLoad(self.issued, [1]))
        return m0, tirx.BufferLoad(self.issued, [2]), tirx.truncmod(x, per)

    def fixup(self) -> None:
        """The second kernel of stream-K: each tile that blocks share gets their parts added in block
        order, plus the bias (blocks of :data:`FIX` × 256 outputs of a tile, :data:`FIX` a thread, 256
        apart; tiles one block ran whole are left as written). Block ``g0``, the first on the tile,
        holds its part in its last slot unless the tile is its first; the others hold it in slot 0."""
        T, h, m = self.T, self.h, self.m
        bx, by, tx = T.env_thread("blockIdx.x"), T.env_thread("blockIdx.y"), T.env_thread("threadIdx.x")
        m_tiles = tirx.Cast("int32", (m + (self.m_tile - 1)) // self.m_tile)
        per_tile = self.k // self.bk // self.unit
        tiles, units, blocks = self.sk_grid(m_tiles)
        cols = 64 * h.wg
        with T.launch_thread(bx, tirx.Cast("int32", tiles)), T.launch_thread(by, h.mt * cols // (256 * FIX)):
            with T.launch_thread(tx, 256):
                u = tirx.Cast("int64", bx) * per_tile  # the tile's first unit
                owner = lambda x: tirx.truncdiv((x + 1) * blocks - 1, units)  # noqa: E731
                g0, g1 = T.Bind(owner(u)), T.Bind(owner(u + per_tile - 1))
                first = T.Bind(tirx.Select(tirx.truncdiv(g0 * units, blocks) == u, 0, 1))  # g0's slot
                m0, n0 = self.tile_origin(tirx.Cast("int32", bx), m_tiles)
                acc = T.alloc_buffer((FIX,), "float32", scope="local")
                at = [((by * FIX + e) * 256 + tx) for e in range(FIX)]  # the outputs' places in the tile
                with T.If(g0 != g1):
                    with T.Then():
                        for e in range(FIX):
                            part = tirx.BufferLoad(self.ws, [g0, first, at[e] // cols, at[e] % cols])
                            T.buffer_store(acc, part, [e])
                        with T.serial(g0 + 1, g1 + 1) as g:
                            for e in range(FIX):
                                part = tirx.BufferLoad(self.ws, [g, 0, at[e] // cols, at[e] % cols])
                                T.buffer_store(acc, acc[e] + part, [e])
                        for e in range(FIX):
                            row, col = at[e] // cols, at[e] % cols
                            val = acc[e]
                            if self.bias:
                                val = val + tirx.Cast("float32", tirx.BufferLoad(self.Bias, [n0 + col]))
                            with T.If(m0 + row < m):
                                with T.Then():
                                    T.buffer_store(
                                        self.Y, tirx.Cast(self.out_dtype, val), [m0 + row, n0 + col]
                                    )

    # ---- the rows' fold ------------------------------------------------------------------------

    def row(self, r: int):
        """This thread's weight row ``r`` (0: ``quad``, 1: ``quad + 8``) within the block."""
        return self.wg * 64 + self.warp * 16 + self.quad + 8 * r

    def rows_fold(self) -> None:
        """Whether the block's scales fold (:attr:`fast`, the same in every thread), and this thread's
        two rows' multiplier addends (:attr:`fold_add`) and output exponents (:attr:`out_exp`): each
        lane scans a quarter of its rows' scale codes (uint32 words, byte-wise max and min), the
        quad's lanes combine theirs; a block folds when no row of it has a NaN code and every row's
        codes lie within the fold's spread of the row's largest."""
        T, fold, k = self.T, self.fold, self.k
        words = k // STEP // 4  # of a row
        s32 = T.decl_buffer((self.n * words,), "uint32", data=self.S.data)
        hi = T.alloc_buffer((2,), "uint32", scope="local")
        lo = T.alloc_buffer((2,), "uint32", scope="local")
        for r in range(2):
            T.buffer_store(hi, u32(0), [r])
            T.buffer_store(lo, u32(0xFFFFFFFF), [r])
        # (stream-K scans at every tile: its loads issued back to back)
        with (T.unroll if self.h.sk else T.serial)(0, -(-words // 4)) as i:
            w = self.j + 4 * i
            with T.If(tirx.And(self.tx < 128 * self.h.wg, w < words) if self.h.prod == 2 else w < words):
                with T.Then():
                    for r in range(2):
                        v = tirx.BufferLoad(s32, [(self.n0 + self.row(r)) * words + w])
                        T.buffer_store(hi, pairs.vmaxu4(hi[r], v), [r])
                        T.buffer_store(lo, pairs.vminu4(lo[r], v), [r])
        ok = T.alloc_buffer((1,), "int32", scope="local")
        T.buffer_store(ok, tirx.const(1, "int32"), [0])
        self.fold_add = T.alloc_buffer((2,), "uint32", scope="local")
        self.out_exp = T.alloc_buffer((2,), "int32", scope="local")
        oe = 0 if self.h.cvt else round(math.log2(pairs.out_factor(self.fmt)))  # (cvt: true values)
        for r in range(2):
            good, add, exp = pairs.fold_row(T, fold, hi, lo, [r])
            good = tirx.Cast("int32", good)
            if self.h.prod == 2:  # the producer's threads have no rows
                good = good | tirx.Cast("int32", self.tx >= 128 * self.h.wg)
            T.buffer_store(ok, ok[0] & good, [0])
            T.buffer_store(self.fold_add, add, [r])
            T.buffer_store(self.out_exp, exp + oe, [r])
        self.fast = T.alloc_buffer((1,), "int32", scope="local")
        if (self.h.sk or self.h.early) and self.h.prod == 2:  # the compute warpgroups alone (barrier 1)
            votes = T.alloc_buffer((1,), "uint32", scope="local")
            threads = 128 * self.h.wg
            T.evaluate(
                T.ptx["bar.red.popc.u32"](
                    votes[0], u32(1), u32(threads), T.ptx.pred(tirx.BufferLoad(ok, [0]))
                )
            )
            T.buffer_store(self.fast, tirx.Cast("int32", votes[0] == u32(threads)), [0])
        else:
            T.buffer_store(self.fast, tirx.call_extern("int32", "__syncthreads_and", ok[0]), [0])
        for r in range(2):  # unfolded: the sums times out_factor alone
            out = tirx.Select(self.fast[0] != 0, self.out_exp[r], tirx.const(oe, "int32"))
            T.buffer_store(self.out_exp, out, [r])

    # ---- TMA -----------------------------------------------------------------------------------

    def tensor_maps(self):
        """The host-encoded tensor maps (``tma``) of A (boxes of 64 K × ``mt`` rows, 128-byte swizzle,
        rows past M zeros) and, with ``tma`` 2, of each code plane (a row's bytes of a slot × the
        block's rows, swizzled as :meth:`_code_chunk` places them: 16-, 32-, 64- or 128-byte rows,
        swizzles 0, 1, 2, 3: :data:`SWIZZLE`)."""
        T, k = self.T, self.k
        grids = [(self.A, self.a_dtype, (k, self.m, 2 * k, 64, self.m_tile), 3)]
        for b, w, chunks in zip(self.Bs, self.widths, self.pchunks, strict=True) if self.h.tma == 2 else []:
            rb = 16 * chunks
            dims = (k * w // 8, self.n, k * w // 8, rb, 64 * self.h.wg)
            grids.append((b, "uint8", dims, SWIZZLE[rb]))
        maps = []
        for buf, dtype, dims, swizzle in grids:  # dims: sizes, byte stride, box; element strides 1
            tmap = T.Bind(T.tvm_stack_alloca("tensormap", 1))
            encode = T.tensormap_encode_tiled(
                tmap, buf.data, *dims, 1, 1, descriptor_dtype=dtype, rank=2, swizzle=swizzle, l2_promotion=2
            )
            T.evaluate(encode)
            maps.append(tmap)
        return maps

    def tma_issue(self, m0, n0, it, slot) -> None:
        """Thread 0: the slot's ``full`` barrier expects the bytes, and TMA loads the activations'
        halves of 64 K (and, ``tma`` 2, the codes) of K iteration ``it`` of the tile at ``m0, n0`` into
        ``slot``."""
        T, h, mt = self.T, self.h, self.m_tile
        full = smem_addr(T, self.ring, self._bar(slot, 0))
        chain = T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"]
        loads = [(half * mt * ROW, 0, it * self.bk + 64 * half, m0) for half in range(self.bk // 64)]
        if h.tma == 2:
            planes = enumerate(zip(self.poff, self.pchunks, strict=True))
            loads += [(off, 1 + p, it * 16 * c, n0) for p, (off, c) in planes]
        size = self.codes_off + (64 * h.wg * 16 * self.chunks if h.tma == 2 else 0)
        with T.If(self.tx == (128 * h.wg if h.prod == 2 else 0)):
            with T.Then():
                T.evaluate(T.ptx["mbarrier.arrive.expect_tx.shared.b64"](full, u32(size)))
                for at, which, inner, row in loads:
                    box = [tirx.Cast("int32", inner), tirx.Cast("int32", row)]
                    T.evaluate(chain(self._addr(slot, at), T.address_of(self.tmaps[which]), *box, full))

    # ---- shared memory ------------------------------------------------------------------------

    def _addr(self, slot, byte):
        return smem_addr(self.T, self.ring, slot * self.slot + byte)

    def _code_chunk(self, row, chunk, plane: int = 0):
        """Where 16-byte chunk ``chunk`` of a row's codes of bit plane ``plane`` in a slot lives
        (XOR-moved so the 8 rows a quarter-warp reads start in distinct banks; TMA's 128-, 64- and
        32-byte swizzles of the rows; rows of one chunk stay as they are)."""
        pieces = self.pchunks[plane]
        key = row % 8 if pieces >= 8 else (row // 2) % 4 if pieces == 4 else (row // 4) % 2
        return self.poff[plane] + row * 16 * pieces + tirx.bitwise_xor(chunk, key % pieces) * 16

    def issue(self, it, slot) -> None:
        """``cp.async`` (and TMA) of the activations, codes and scale codes of ring count ``it`` (its
        tile and K iteration: :meth:`coords`) into ``slot``."""
        T, h, tx = self.T, self.h, self.tx
        m0, n0, it = self.coords(it)
        cp16 = T.ptx["cp.async.cg.shared.global"]
        threads = 128 * h.wg
        if h.tma:
            self.tma_issue(m0, n0, it, slot)
        # activations: a 16-byte chunk per 8 K of a row (16 or 8 a row), swizzled halves of 64 K
        per = self.bk // 8
        for r in range(0 if h.tma else -(-self.m_tile * per // threads)):
            i = tx + threads * r
            row, c16 = i // per, i % per
            dst = self._addr(slot, (c16 // 8) * self.m_tile * ROW + swizzled(row, c16 % 8))
            conds = [m0 + row < self.m]
            if self.m_tile * per < threads * (r + 1):
                conds.insert(0, i < self.m_tile * per)
            when(T, conds, cp16(dst, self.A.ptr_to([m0 + row, it * self.bk + 8 * c16]), 16))
        # codes: the row's bytes of the slot in 16-byte chunks, plane by plane
        rows = 64 * h.wg
        for p, (b, per) in enumerate(zip(self.Bs, self.pchunks, strict=True)):
            for r in range(0 if h.tma == 2 else -(-rows * per // threads)):
                i = tx + threads * r
                row, c = i // per, i % per
                src = b.ptr_to([n0 + row, it * 16 * per + 16 * c])
                conds = [i < rows * per] if rows * per < threads * (r + 1) else []
                when(T, conds, cp16(self._addr(slot, self._code_chunk(row, c, p)), src, 16))
        # scale codes: 4 bytes a row, those of the 128 K the slot is in (prod: warp 0's lanes, a row each 32)
        cp4 = T.ptx["cp.async.ca.shared.global"]
        window = it * (BK // STEP) if self.bk == BK else it // 2 * (BK // STEP)  # the word's first code
        if h.prod:
            for r in range(rows // 32):
                row = self.lane + 32 * r
                src = self.S.ptr_to([n0 + row, window])
                T.evaluate(cp4(self._addr(slot, self.scales_off + 4 * row), src, 4))
            return
        src = self.S.ptr_to([n0 + tx, window])
        dst = self._addr(slot, self.scales_off + 4 * tx)
        when(T, [tx < rows] if rows < threads else [], cp4(dst, src, 4))

    # ---- decode and wgmma -----------------------------------------------------------------------

    def lane_words(self, slot, row, u, words, r) -> None:
        """This lane's codes of step ``u`` of ``row`` into ``words[u, r]`` (a word a plane, two of one
        8-bit plane): the 8 codes of K ``2j, 2j+1, 2j+8, 2j+9`` and ``+16`` (the step's two k16
        wgmmas), gathered from the step's portable bytes with ``prmt`` (4-bit codes: bytes ``j, 4+j,
        8+j, 12+j``; 8-bit: half ``j % 2`` of words ``j/2, 2+j/2, 4+j/2, 6+j/2``; 2-bit: nibble ``j``
        of each 16-bit half of the step's 8 bytes, bytes ``j/2, 2+j/2, 4+j/2, 6+j/2`` then shifts; 6-bit
        floats: those bytes as they are, for :func:`~mxgemm.codegen.pairs.six_words`)."""
        T, j = self.T, self.j
        ld = T.ptx.ld.shared
        perm = lambda a, b, sel: tirx.call_pure_extern("uint32", "__byte_perm", a, b, sel)  # noqa: E731
        ju = tirx.Cast("uint32", j)
        for p, w in enumerate(self.widths):
            if w == 2:  # the step's 8 bytes: half a chunk
                raw = T.alloc_buffer((2,), "uint32", scope="local")
                at = self._code_chunk(row, u * 8 // 16, p) + 8 * u % 16
                T.evaluate(ld.v2.b32(raw[0], raw[1], self._addr(slot, at)))
                pick = ju // u32(2) * u32(0x1111) + u32(0x6420)  # byte j / 2 of each 16-bit half
                if self.six:  # as they are: nibble j % 2 of each byte (pairs.six_words)
                    T.buffer_store(words, perm(raw[0], raw[1], pick), [u, r, p])
                    continue
                x = perm(raw[0], raw[1], pick) >> (ju % u32(2) * u32(4)) & u32(0x0F0F0F0F)
                T.buffer_store(words, perm(x | x >> u32(4), u32(0), u32(0x4420)), [u, r, p])
                continue
            raw = T.alloc_buffer((4 * (w // 4),), "uint32", scope="local")
            raw4 = [[raw[4 * c + i] for i in range(4)] for c in range(w // 4)]
            for c in range(w // 4):
                T.evaluate(ld.v4.b32(*raw4[c], self._addr(slot, self._code_chunk(row, (w // 4) * u + c, p))))
            if w == 4:
                pick = ju | ((ju + u32(4)) << u32(4))  # byte j of the first word, then of the second
                lo, hi = perm(raw4[0][0], raw4[0][1], pick), perm(raw4[0][2], raw4[0][3], pick)
                T.buffer_store(words, perm(lo, hi, u32(0x5410)), [u, r, p])
                continue
            half = (ju % u32(2)) * u32(2)  # half j % 2 of the first word, then of the second
            pick = half | ((half + u32(1)) << u32(4)) | ((half + u32(4)) << u32(8))
            pick = pick | ((half + u32(5)) << u32(12))
            odd = j >= 2  # words j / 2 + 2i
            word = lambda i, raw=raw, odd=odd: tirx.Select(odd, raw[2 * i + 1], raw[2 * i])  # noqa: E731
            for out in range(2):
                T.buffer_store(words, perm(word(2 * out), word(2 * out + 1), pick), [u, r, out])

    def row_words(self, slot, row, steps, words, r) -> None:
        """This lane's codes of ``steps`` of ``row`` into ``words[u, r]`` (:meth:`lane_words`); ``frag``:
        the lane's run of the row's slot (``w // 4`` words a step, step ``u`` at word ``u * w // 4``)
        read whole where ``steps`` are the slot's four, else a step at a time."""
        if not self.h.frag:
            for u in steps:
                self.lane_words(slot, row, u, words, r)
            return
        T, per = self.T, self.w // 4  # words a step
        if list(steps) == list(range(self.steps)):
            for c in range(per):
                dst = [words[u, r, o] for u in range(4 * c // per, 4 * (c + 1) // per) for o in range(per)]
                chunk = self._code_chunk(row, per * self.j + c)
                T.evaluate(T.ptx.ld.shared.v4.b32(*dst, self._addr(slot, chunk)))
            return
        for u in steps:
            chunk = self._code_chunk(row, per * self.j + u * per // 4)
            byte = 4 * per * u % 16
            if per == 1:
                T.evaluate(T.ptx.ld.shared.b32(words[u, r, 0], self._addr(slot, chunk + byte)))
            else:
                T.evaluate(
                    T.ptx.ld.shared.v2.b32(words[u, r, 0], words[u, r, 1], self._addr(slot, chunk + byte))
                )

    def decode(self, slot, buf: int, fold: bool, steps=None, it=None) -> None:
        """This thread's fragments of the slot's ``steps`` (all) into ``afr[buf]``: codes of its two
        rows, pairs decoded and (``fold``) multiplied by their folded block scale (ring count ``it``'s:
        :meth:`scale_words`)."""
        T = self.T
        steps = self.each(steps)
        words = T.alloc_buffer((self.steps, 2, 2), "uint32", scope="local")
        late = self.m_tile > BIG  # a step's words loaded just before its decode
        for r in range(2):
            self.row_words(slot, self.row(r), [] if late else list(steps), words, r)
        sc = self.scale_words(slot, it) if fold else None
        fma = T.ptx.fma.rn.f16x2 if self.a_dtype == "float16" else T.ptx.fma.rn.bf16x2
        for u in steps:
            for r in range(2) if late else []:
                self.row_words(slot, self.row(r), [u], words, r)
            if fold:
                fac = [self.multiplier(sc, r, u) for r in range(2)]
            if self.quads:  # a row's 4 pairs of the step at once
                quads = [pairs.decode_quad(self.fmt, tirx.BufferLoad(words, [u, r, 0])) for r in range(2)]
            if self.six:  # a row's codes of the step a byte (the 2-bit nibbles at bit 4 (j % 2) a byte)
                at = tirx.Cast("uint32", self.j % 2 * 4)
                six = [
                    pairs.six_words(*(tirx.BufferLoad(words, [u, r, p]) for p in (0, 1)), at)
                    for r in range(2)
                ]
            for g, q in itertools.product(range(2), range(4)):
                # wgmma g's A: rows quad / quad+8 (q % 2) × K 16g + 2j.. / +8 (q // 2)
                wd = lambda p, i, u=u, r=q % 2: tirx.BufferLoad(words, [u, r, p + i])  # noqa: E731
                a = self.afr[buf, u, g, q]
                if self.h.cvt:  # codes 2p, 2p+1 (p = 2g + q // 2): 16-bit half p % 2 of word p // 2
                    pairs.cvt_pair(
                        T, self.fmt, a, tirx.BufferLoad(words, [u, q % 2, g]), q // 2, self.a_dtype
                    )
                elif self.quads:
                    T.buffer_store(self.afr, quads[q % 2][2 * g + q // 2], [buf, u, g, q])
                elif self.six:
                    pair = pairs.six_pair(self.fmt, *six[q % 2], 2 * g + q // 2, dtype=self.a_dtype)
                    T.buffer_store(self.afr, pair, [buf, u, g, q])
                else:
                    pair = pairs.decode_pair(self.fmt, wd, 2 * g + q // 2, dtype=self.a_dtype)
                    T.buffer_store(self.afr, pair, [buf, u, g, q])
                if self.fma is not None and not (fold and self.fold.merged):  # the magic number
                    T.evaluate(fma(a, *self.fma.operands(a)))
                if fold:
                    T.evaluate(fma(a, a, fac[q % 2], u32(0x80008000)))  # a f + -0: keeps -0

    def scale_words(self, slot, it):
        """This thread's two rows' scale codes of the slot, of ring count ``it`` (a uint32 each, the
        slot's first step's code in the low byte: ``bk`` 64 takes the word's high half where ``it``'s K
        iteration is odd)."""
        T = self.T
        sc = T.alloc_buffer((2,), "uint32", scope="local")
        for r in range(2):
            T.evaluate(T.ptx.ld.shared.b32(sc[r], self._addr(slot, self.scales_off + 4 * self.row(r))))
            if self.bk != BK:
                odd = tirx.Cast("uint32", self.k_iter(it) % 2)
                T.buffer_store(sc, tirx.BufferLoad(sc, [r]) >> (odd << u32(4)), [r])
        return sc

    def each(self, steps):
        """``steps`` (of a slot), or all of them where None."""
        return range(self.steps) if steps is None else steps

    def k_iter(self, it):
        """Ring count ``it``'s K iteration, up to a multiple of 2 (``bk`` 64 asks only its parity):
        the block's K range's (split K) or, stream-K, its run's (a tile's iterations, ``k / bk``,
        are even)."""
        if self.h.sk:
            return self.x0 + it
        return it if self.z is None else self.z * self.iters + it

    @staticmethod
    def code(sc, r: int, u: int):
        return (tirx.BufferLoad(sc, [r]) >> u32(8 * u)) & u32(255)

    def multiplier(self, sc, r: int, u: int):
        """The fold multiplier of row ``r``'s step ``u`` (:class:`~mxgemm.codegen.pairs.Fold`): the
        code times ``mul`` plus the row's addend; ``lean``: the code put in both 16-bit halves by one
        ``prmt`` (``mul`` is a power of two times ``0x10001``), then one multiply-add."""
        add = tirx.BufferLoad(self.fold_add, [r])
        if not self.h.lean:
            return self.code(sc, r, u) * u32(self.fold.mul) + add
        both = pairs.prmt(tirx.BufferLoad(sc, [r]), u32(0), 0x4040 | u << 8 | u, cuda=True)
        return both * u32(self.fold.mul // 0x10001) + add

    def mma(self, slot, buf: int, steps=None, into=None, part: int = 0, fresh=None) -> None:
        """The wgmmas (2 k16 a step) of the slot's ``steps`` into the accumulator (the first of them
        overwrites it where ``fresh``, a runtime condition), or ``into`` (a fragment the first of them
        overwrites: the tile's activation rows ``part * self.part`` on, :attr:`part` of them), one
        commit group."""
        T = self.T
        steps = self.each(steps)
        ab = {"float16": "f16", "bfloat16": "bf16"}[self.a_dtype]
        cols = self.m_tile if into is None or into is self.acc else self.part
        op = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{cols}k16.f32.{ab}.{ab}"]
        regs = [tirx.BufferLoad(self.acc if into is None else into, [i]) for i in range(cols // 2)]
        if self.h.lean:  # the slot's descriptor, to which each wgmma adds its offset / 16
            lo = T.alloc_buffer((1,), "uint32", scope="local")
            desc = descriptor(T, self.desc, 0, self._addr(slot, 0))
            T.buffer_store(lo, tirx.Cast("uint32", desc), [0])
        T.evaluate(T.ptx.wgmma.fence.sync.aligned())
        for n_, (u, g) in enumerate(itertools.product(steps, range(2))):
            kk = 2 * u + g  # k16 slice of the slot: half kk // 4, 32 bytes each
            off = (kk // 4) * self.m_tile * ROW + part * cols * ROW + (kk % 4) * 32
            if self.h.lean:  # (a slot's bytes lie below 256 KB: no carry out of the address field)
                lo_kk = tirx.Cast("uint64", tirx.BufferLoad(lo, [0]) + u32(off // 16))
                desc = lo_kk | tirx.const(DESC >> 32 << 32, "uint64")
            else:
                desc = descriptor(T, self.desc, 0, self._addr(slot, off))
            a = [tirx.BufferLoad(self.afr, [buf, u, g, q]) for q in range(4)]
            acc_in = tirx.const(into is None or n_ > 0, "bool")
            if fresh is not None and n_ == 0:
                acc_in = tirx.Not(fresh)
            T.evaluate(op(*regs, *a, desc, acc_in, 1, 1, 0))
        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())

    # ---- the K loop -----------------------------------------------------------------------------

    def _bar(self, slot, empty: int) -> int:
        """Byte offset in the ring of slot ``slot``'s ``full`` (0) or ``empty`` (1) mbarrier (``ring``)."""
        return self.h.stages * self.slot + 16 * (2 * slot + empty)

    def _counts(self) -> tuple[int, int]:
        """Arrivals that complete a slot's ``full`` and ``empty`` barriers: every copying thread's
        (all of them, or with ``prod`` the refilling warp's lanes) once its copies landed, every
        thread's when done with the slot; with ``tma``, the ``expect_tx`` too, and a warp's (not a
        thread's) when done."""
        threads = 32 if self.h.prod else 128 * self.h.wg  # those that copy into a slot
        return (threads + 1, 4 * self.h.wg) if self.h.tma else (threads, threads)

    def _arrive_full(self, slot) -> None:
        """The slot's ``full`` barrier gets this thread's arrival once its copies so far have landed."""
        addr = smem_addr(self.T, self.ring, self._bar(slot, 0))
        self.T.evaluate(self.T.ptx["cp.async.mbarrier.arrive.noinc.shared.b64"](addr))

    def _wait(self, slot, empty: int, parity) -> None:
        bar = self.T.address_of(self.ring[self._bar(slot, empty) // 16])
        self.T.evaluate(self.T.cuda.mbarrier_wait(bar, parity))

    def head(self, it) -> None:
        """The ring's turn at iteration ``it``: slot ``it + ahead`` refilled, slot ``it``'s copies waited
        for (``ring`` 0: :func:`~mxgemm.codegen.wgmma.ring_turn`; 1: the slot to refill waited empty,
        then this one full)."""
        T, h = self.T, self.h
        if not h.ring:
            ring_turn(T, it, h.stages, self.ahead, self.iters, self.issue)
            return
        if h.prod == 2:  # the producer refills the ring
            self._wait(it % h.stages, 0, (it // h.stages) % 2)
            return
        t = it + self.ahead
        with T.If(self._refills(t < self.iters)):
            with T.Then():
                with T.If(t >= h.stages):
                    with T.Then():
                        self._wait(t % h.stages, 1, (t // h.stages - 1) % 2)
                self.issue(t, t % h.stages)
                self._arrive_full(t % h.stages)
        self._wait(it % h.stages, 0, (it // h.stages) % 2)

    def _refills(self, cond):
        """``cond`` and (``prod``) this thread is in warp 0, the one that refills the ring."""
        return tirx.And(self.tx < 32, cond) if self.h.prod else cond

    def release(self, it) -> None:
        """``ring`` 1: this thread is done with iteration ``it``'s slot (its wgmmas waited for); with
        ``tma``, a warp is (past its warpgroup's ``wgmma.wait_group``): its lane 0 arrives."""
        T, h = self.T, self.h
        if not h.ring:
            return
        with T.If(it >= self.c0):  # stream-K: the tile's own (the last one's was released)
            with T.Then():
                addr = smem_addr(T, self.ring, self._bar(it % h.stages, 1))
                when(T, [self.lane == 0] if h.tma else [], T.ptx.mbarrier.arrive.shared.b64(addr, u32(1)))

    def iteration(self, it, buf: int) -> None:
        """Folded: decode the slot, issue its 8 wgmmas; ``double``: the previous slot's are done."""
        T, h = self.T, self.h
        slot = it % h.stages
        self.head(it)
        self.decode(slot, buf, fold=True, it=it)
        self.mma(slot, buf, fresh=it == self.c0 if h.sk else None)
        # double: the previous slot's wgmmas are done (their fragments and slot free), this one's run on
        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(1 if h.double else 0))
        self.release(it - 1 if h.double else it)

    def plain_iteration(self, it) -> None:
        """Unfolded (rows whose scales do not fold): each step's two wgmmas into a fragment, added to
        the accumulator times the rows' block scales."""
        T, h = self.T, self.h
        slot = it % h.stages
        self.head(it)
        big = self.m_tile > BIG
        if not big:
            self.decode(slot, 0, fold=False)
        sc = self.scale_words(slot, it)
        # stream-K: a step's wgmmas overwrite the accumulator, added to the workspace (ptxas serializes
        # the wgmmas of a loop in which other instructions write their accumulator)
        tmp = self.acc if h.sk else self.tmp
        part = self.frag if h.sk else self.part // 2  # the fragment's registers of a part of the rows
        for u, p in itertools.product(range(self.steps), range(self.frag // part)):
            if big and p == 0:
                self.decode(slot, 0, fold=False, steps=[u])
            self.mma(slot, 0, steps=[u], into=tmp, part=p)
            T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))
            fence_regs(T, [tirx.BufferLoad(tmp, [i]) for i in range(part)])
            scale = [scale_expr(self.code(sc, r, u)) for r in range(2)]
            for idx in range(part):
                acc = self.sums(p * part + idx)
                if h.sk and big:  # (the workspace: an fma in memory, not 128 promoted registers that spill)
                    fma_to(T, tirx.BufferLoad(*acc), tirx.BufferLoad(tmp, [idx]), scale[idx // 2 % 2])
                    continue
                val = tirx.BufferLoad(*acc) + tirx.BufferLoad(tmp, [idx]) * scale[idx // 2 % 2]
                T.buffer_store(acc[0], val, acc[1])
        self.release(it)

    def sums(self, a: int):
        """Where the unfolded path adds accumulator register ``a``'s sums: the register, or (stream-K)
        the element of the tile's workspace slot (the tile's parts are written there anyway)."""
        if not self.h.sk:
            return self.acc, [a]
        g, slot, _ = self.part_of
        return self.ws, [g, slot, 8 * (a // 4) + 2 * self.j + a % 2, self.row(a // 2 % 2)]

    def start(self) -> None:
        """What a block does before its ring: (``early`` 0) the scan of its scale codes and, with
        ``pdl``, that and an L2 prefetch of its first slots before it waits for the previous kernel
        (:func:`~mxgemm.codegen.nvcc.pdl_around_wait`)."""
        h = self.h
        scan = self.rows_fold if not h.early else lambda: None
        if not h.pdl:
            scan()
            return
        # (the scale scan reads weights alone; activations and Y after the wait)
        nvcc.pdl_around_wait(self.T, h.pdl, lambda: (self.prefetch_l2(), scan()))

    def prefetch_l2(self) -> None:
        """``pdl``: L2 prefetch of the block's codes and scale codes of its first ``stages`` K
        iterations (threads ``0 .. 64 wg``: a row each, a prefetch per 128 bytes)."""
        T, h = self.T, self.h
        first = self.coords(0)[2]  # the block's first K iteration
        its = min(h.stages, self.iters)
        with T.If(self.tx < 64 * h.wg):
            with T.Then():
                row = self.n0 + self.tx
                for b, chunks in zip(self.Bs, self.pchunks, strict=True):
                    for off in range(0, its * 16 * chunks, 128):
                        T.evaluate(T.ptx.prefetch.global_.L2(b.ptr_to([row, first * 16 * chunks + off])))
                T.evaluate(T.ptx.prefetch.global_.L2(self.S.ptr_to([row, first * self.steps])))

    def prologue(self) -> None:
        """The ring's barriers set up (``ring`` 1) and its first ``ahead`` slots issued."""
        T, h = self.T, self.h
        if h.ring:  # every thread arrives on both barriers of every slot use (tma: :meth:`_counts`)
            with T.If(self.tx == 0):
                with T.Then():
                    for i, e in itertools.product(range(h.stages), range(2)):
                        addr = smem_addr(T, self.ring, self._bar(i, e))
                        T.evaluate(T.ptx.mbarrier.init.shared.b64(addr, u32(self._counts()[e])))
            T.evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))
        for s in range(0 if h.prod == 2 else self.ahead):
            with self._refiller():
                if not h.sk and s < self.iters:
                    self.issue(s, s)
                elif h.sk:
                    with T.If(s < self.iters):
                        with T.Then():
                            self.issue(s, s)
                if h.ring:
                    self._arrive_full(s)
                else:
                    T.evaluate(T.ptx["cp.async.commit_group"]())

    @contextlib.contextmanager
    def _refiller(self):
        """The statements within run in the threads that refill the ring (``prod``: warp 0)."""
        if not self.h.prod:
            yield
            return
        with self.T.If(self.tx < 32), self.T.Then():
            yield

    def loop(self, iters) -> None:
        """The K loop over ``iters`` iterations from ring count :attr:`c0`, folded or not as the block
        voted; stream-K: the last slot released (the next tile's loop runs on)."""
        T, h = self.T, self.h
        at = (lambda i: i) if h.sk == 0 else (lambda i: self.c0 + i)  # noqa: E731
        with T.If(tirx.BufferLoad(self.fast, [0]) != 0):
            with T.Then():
                if h.double:  # two iterations a trip: the fragment sets stay static registers
                    with T.serial(0, iters // 2) as it2:
                        for b in range(2):
                            self.iteration(at(2 * it2 + b), b)
                else:
                    with T.serial(0, iters) as it:
                        self.iteration(at(it), 0)
                T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))
                if h.sk and h.double:
                    self.release(at(iters - 1))
            with T.Else():
                if not h.sk:
                    self.tmp = T.alloc_buffer((self.part // 2,), "float32", scope="local")
                for a in range(self.frag if h.sk else 0):  # (folded, a tile's first wgmma zeroes them)
                    buf, at_ = self.sums(a)
                    T.buffer_store(buf, tirx.const(0.0, "float32"), at_)
                with T.serial(0, iters) as it:
                    self.plain_iteration(at(it))

    def epilogue(self) -> None:
        """The tile's sums brought to scale: to Y (with the bias), to split ``z``'s workspace, or
        (stream-K) to Y where the block ran the tile whole, else to its slot of the workspace."""
        if self.part_of is not None:
            g, slot, whole = self.part_of
            with self.T.If(whole):
                with self.T.Then():
                    self._store(self._to_y)
                with self.T.Else():
                    ws = lambda row, col, val: self.T.buffer_store(  # noqa: E731
                        self.ws, val, [g, slot, row - self.m0, col - self.n0]
                    )
                    self._store(ws)
            return
        if self.h.cluster:  # into this block's ring, once every warpgroup's wgmmas are done with it
            bar_sync(self.T, 2, 128 * self.h.wg)
            base, stride = smem_addr(self.T, self.ring, 0), 64 * self.h.wg + PAD

            def put(row, col, val):
                at = (tirx.Cast("int32", row - self.m0) * stride + (col - self.n0)) * 4
                st_shared(self.T, base + tirx.Cast("uint32", at), val)

            self._store(put)
        elif self.ws is None:
            self._store(self._to_y)
        else:
            self._store(lambda row, col, val: self.T.buffer_store(self.ws, val, [self.z, row, col]))

    def _to_y(self, row, col, val) -> None:
        """Y's element at ``row, col`` = ``val`` plus the bias (if any)."""
        if self.bias:
            val = val + tirx.Cast("float32", tirx.BufferLoad(self.Bias, [col]))
        self.T.buffer_store(self.Y, tirx.Cast(self.out_dtype, val), [row, col])

    def _store(self, put) -> None:
        """``put(row, col, value)`` of each of the thread's sums (within M), brought to scale: by
        ``ldexpf`` (about 14 instructions an output), or (``lean`` 2) where both of the thread's rows'
        exponents are those of normal fp32 numbers, by one multiply by ``2^e`` made once a row (the
        same bits: a product by a power of two rounds once, as ``ldexpf``)."""
        exp = [tirx.BufferLoad(self.out_exp, [i]) for i in range(2)]
        ldexp = lambda val, i: tirx.ldexp(val, exp[i])  # noqa: E731
        if self.h.lean < 2:
            self._store_scaled(put, ldexp)
            return
        normal = tirx.And(*(tirx.And(e >= -126, e <= 127) for e in exp))
        two = [tirx.reinterpret("float32", tirx.Cast("uint32", e + 127) << u32(23)) for e in exp]
        with self.T.If(normal):
            with self.T.Then():
                self._store_scaled(put, lambda val, i: val * two[i])
            with self.T.Else():
                self._store_scaled(put, ldexp)

    def _store_scaled(self, put, scaled) -> None:
        """:meth:`_store` with ``scaled(value, i)`` bringing row ``i``'s value to scale."""
        T = self.T
        for jn, i, c in itertools.product(range(self.m_tile // 8), range(2), range(2)):
            col = self.n0 + self.row(i)
            row = self.m0 + 8 * jn + 2 * self.j + c
            a = 4 * jn + 2 * i + c
            val = tirx.BufferLoad(self.acc, [a])
            if self.h.sk:  # an unfolded tile's sums are in the workspace
                val = tirx.Select(self.fast[0] != 0, val, tirx.BufferLoad(*self.sums(a)))
            with T.If(row < self.m):
                with T.Then():
                    put(row, col, scaled(val, i))

    def cluster_reduce(self) -> None:
        """``cluster``: this block's share of the tile's rows (``mt / splits`` from ``z mt / splits``), 4
        outputs a thread at a time: the splits' sums read from their blocks' shared memory and added
        in split order, the bias added, Y written; between two cluster barriers (every block's sums
        written before, every block's reads done after)."""
        T, h = self.T, self.h
        cols, rows, threads = 64 * h.wg, h.mt // h.splits, 128 * h.wg
        units = rows * cols // 4
        base = smem_addr(T, self.ring, 0)
        acc = T.alloc_buffer((4,), "float32", scope="local")
        part = T.alloc_buffer((4,), "float32", scope="local")
        cluster_sync(T)
        with T.If(self.tx < threads), T.Then():  # (not the producer: its registers went to the others)
            with T.serial(0, -(-units // threads)) as r:
                u = self.tx + threads * r
                row, c4 = self.z * rows + u // (cols // 4), u % (cols // 4)
                in_y = self.m0 + tirx.Cast("int64", row) < self.m
                with T.If(tirx.And(u < units, in_y) if units % threads else in_y), T.Then():
                    addr = base + tirx.Cast("uint32", (row * (cols + PAD) + 4 * c4) * 4)
                    dsmem_ld4(T, [acc[e] for e in range(4)], addr, u32(0))
                    for s in range(1, h.splits):  # in split order
                        dsmem_ld4(T, [part[e] for e in range(4)], addr, u32(s))
                        for e in range(4):
                            T.buffer_store(acc, acc[e] + part[e], [e])
                    for e in range(4):
                        self._to_y(self.m0 + tirx.Cast("int64", row), self.n0 + 4 * c4 + e, acc[e])
        cluster_sync(T)

    def add_splits(self) -> None:
        """The second kernel of a split K: Y = the splits' partial sums added in split order, plus the
        bias (an output a thread)."""
        T, m, n = self.T, self.m, self.n
        bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
        total = m * n
        with T.launch_thread(bx, tirx.Cast("int32", (total + 255) // 256)), T.launch_thread(tx, 256):
            if self.h.pdl:  # (launched early too: the partial sums are the first kernel's)
                T.evaluate(T.ptx.griddepcontrol.wait())
            i = tirx.Cast("int64", bx) * 256 + tx
            with T.If(i < total):
                with T.Then():
                    row, col = i // n, i % n
                    val = tirx.BufferLoad(self.ws, [0, row, col])
                    for z in range(1, self.h.splits):
                        val = val + tirx.BufferLoad(self.ws, [z, row, col])
                    if self.bias:
                        val = val + tirx.Cast("float32", tirx.BufferLoad(self.Bias, [col]))
                    T.buffer_store(self.Y, tirx.Cast(self.out_dtype, val), [row, col])
