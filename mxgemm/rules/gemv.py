"""GPU rule for small M (GEMV / low batch, M buckets 1..16): wide weight loads, decode once per thread
step in registers, shared by every row of A.

Per output row ``n`` a warp walks K in steps of 32 threads × ``vec`` elements, ``vec`` chosen so one
thread's codes are one ``load_bytes`` load of the widest bit plane (16 bytes: 32 fp4 or 16 fp8 codes).
The codes are decoded into float32 registers (the decode block, computed at the step), then every row
of the M tile multiplies them with ``a_vec``-wide loads of A (fp32 partial sums, ``rfactor``), and a
warp-shuffle all-reduce sums the 32 threads. ``rows`` output rows (warps) share a thread block; the M
tile is the bucket, padded (rows beyond M read zeros and are not stored).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from tvm import s_tir

from mxgemm import formats
from mxgemm.codegen import target as targets
from mxgemm.layout import plane_widths
from mxgemm.rules.base import Rule, Scheduled, cuda_linear

TX = 32  # threads along K (one warp)
M_TILES = (1, 4, 16)  # M buckets this rule serves


@dataclass(frozen=True)
class Hints:
    """Tunable knobs. rows: output rows (warps) per thread block; load_bytes: bytes of the widest code
    plane each thread loads per step (4, 8, 16); a_vec: activations per vector load of A (2, 4, 8);
    a_shared: stage each step's A tile in shared memory, read once per block instead of once per warp
    (pays off when several rows of A are read)."""

    rows: int = 4
    load_bytes: int = 16
    a_vec: int = 8
    a_shared: bool = False

    def __post_init__(self) -> None:
        if (
            self.rows not in (1, 2, 4, 8, 16)
            or self.load_bytes not in (4, 8, 16)
            or self.a_vec not in (2, 4, 8)
        ):
            raise ValueError(f"gemv hints out of range: {self}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def fits(h: Hints, n: int, k: int, fmt: formats.Format) -> bool:
    """Whether ``h`` tiles an ``[n, k]`` weight of ``fmt`` (32 threads × one load of its widest plane)."""
    vec = h.load_bytes * 8 // plane_widths(fmt.bits)[0]
    return vec > 0 and k % (TX * vec) == 0 and n % h.rows == 0 and vec % h.a_vec == 0


class Gemv(Rule):
    """Any activation dtype, buckets 1, 4, 16 (:data:`M_TILES`), a shape the default hints tile."""

    name = "gemv"
    Hints = Hints

    @staticmethod
    def _serves(spec: Any) -> bool:
        return cuda_linear(spec, M_TILES)

    def candidates(self, spec: Any) -> list[Hints]:
        """Every combination that tiles the shape (deterministic order)."""
        if not self._serves(spec):
            return []
        f = formats.get(spec.fmt)
        space = itertools.product((1, 2, 4, 8), (4, 8, 16), (4, 8), (False, True))
        return [h for h in (Hints(*p) for p in space) if fits(h, spec.n, spec.k, f)]

    def cost(self, spec: Any, h: Hints) -> float:
        """The weight stream needs ≈ 24 KB of loads in flight per SM (Little's law at HBM3 latency);
        narrower loads and A vectors cost a few percent of issue slots each; staging A in shared
        memory costs barriers."""
        sms = targets.sm_count(spec.target["arch"])
        warps = min(spec.n // h.rows, sms * 64 // h.rows) * h.rows  # resident warps, ≤ 64 per SM
        inflight = warps * TX * h.load_bytes
        starved = max(1.0, sms * 24 * 1024 / inflight)
        narrow = (1 + 0.05 * (16 // h.load_bytes - 1)) * (1 + 0.02 * (8 // h.a_vec - 1))
        return starved * narrow * (1.15 if h.a_shared else 1.0)  # two barriers per step

    def default_hints(self, spec: Any) -> Hints | None:
        """From the hardware and the shape: the widest load (16 bytes) that tiles K (32 threads × the
        load's codes of the format's widest plane); 8-wide A loads; A read straight from global memory
        (L1 hits; measured faster than staging it in shared memory at every M tile); 4 warps per block
        at M=1 and 2 above (more rows of A per warp need fewer warps to share an SM), fewer when N is
        too small to give every SM 4 blocks. None when they do not tile the shape."""
        if not self._serves(spec):
            return None
        fmt, n, k = formats.get(spec.fmt), spec.n, spec.k
        plane_bits = plane_widths(fmt.bits)[0]
        sms = targets.sm_count(spec.target["arch"])
        load = next((b for b in (16, 8, 4) if k % (TX * b * 8 // plane_bits) == 0), 16)
        top = 4 if spec.m_bucket == 1 else 2
        rows = next((r for r in (4, 2) if r <= top and n % r == 0 and n // r >= 4 * sms), 1)
        h = Hints(rows=rows, load_bytes=load, a_vec=8 if load * 8 // plane_bits % 8 == 0 else 4)
        return h if fits(h, n, k, fmt) else None

    def apply(self, spec: Any, make: Any, hints: Hints | None = None) -> Scheduled | None:
        """Schedules ``make("float32")`` (the decode in float32; static M=1 for the bucket 1, dynamic M
        otherwise) serving M up to the bucket; None when the hints do not tile the shape (K a multiple
        of 32 × vec, N of ``hints.rows``)."""
        h = hints if hints is not None else self.default_hints(spec)
        fmt = formats.get(spec.fmt)
        if h is None or not self._serves(spec) or not fits(h, spec.n, spec.k, fmt):
            return None
        sch = s_tir.Schedule(make("float32"))
        try:
            dec, mm, epi = (sch.get_sblock(n) for n in ("decode", "matmul", "epilogue"))
        except Exception:  # noqa: BLE001 (a missing block: not our prim_func)
            return None
        _schedule(sch, dec, mm, epi, h, spec.m_bucket, h.load_bytes * 8 // plane_widths(fmt.bits)[0])
        return Scheduled(self.name, sch.mod, h)


RULE = Gemv()


def _schedule(sch: s_tir.Schedule, dec: Any, mm: Any, epi: Any, h: Hints, m_tile: int, vec: int) -> None:
    """The schedule of the module docstring, for ``vec`` codes per thread step."""
    planes = [r.source for r in sch.get(dec).reads][:-1]  # the code planes, then S
    if m_tile > 1:
        sch.pad_einsum(mm, [m_tile, 1, 1])  # A_pad / matmul_pad: the M tile is whole
        sch.compute_inline(sch.get_sblock("matmul_pad"))
    i, j, k = sch.get_loops(mm)
    ko, tx, kv = sch.split(k, [None, TX, vec])
    jo, ty = sch.split(j, [None, h.rows])
    io, ii = sch.split(i, [None, m_tile])
    kvo, kvi = sch.split(kv, [None, h.a_vec])
    sch.reorder(io, jo, ty, tx, ko, kvo, ii, kvi)
    rf = sch.rfactor(tx, 0)
    sch.set_scope(rf, 0, "local")
    sch.set_scope(mm, 0, "local")
    io, jo, ty, tx, ko, kvo, ii, kvi = sch.get_loops(rf)
    sch.bind(io, "blockIdx.y")
    sch.bind(jo, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    _decode_in_registers(sch, dec, ko, len(planes))
    if h.a_shared:
        _a_through_shared(sch, rf, ko, h.rows, m_tile)
    a_cache = sch.cache_read(rf, 0, "local")
    sch.compute_at(a_cache, kvo, preserve_unit_loops=True)
    if m_tile > 1 and not h.a_shared:
        sch.compute_inline(sch.get_sblock("A_pad"))  # padded rows read as zeros
    a_rows, a_vec = sch.get_loops(a_cache)[-2:]
    sch.vectorize(a_vec)
    sch.unroll(a_rows)
    for loop in (kvo, ii, kvi):
        sch.unroll(loop)
    sch.decompose_reduction(rf, ko)
    _all_reduce(sch, mm, ty)
    sch.reverse_compute_at(epi, ty)


def _decode_in_registers(sch: s_tir.Schedule, dec: Any, ko: Any, n_planes: int) -> None:
    """The decode block at the thread step ``ko``: one vector load per code plane into registers, then
    ``vec`` float32 weights (unrolled) in registers."""
    sch.compute_at(dec, ko, preserve_unit_loops=True)
    sch.set_scope(dec, 0, "local")
    for idx in range(n_planes):
        cache = sch.cache_read(dec, idx, "local")
        sch.compute_at(cache, ko, preserve_unit_loops=True)
        sch.vectorize(sch.fuse(*sch.get_loops(cache)[-2:]))
    sch.unroll(sch.get_loops(dec)[-1])


def _a_through_shared(sch: s_tir.Schedule, rf: Any, ko: Any, rows: int, m_tile: int) -> None:
    """Stage each step's A tile ``[m_tile, 32 × vec]`` in shared memory, loaded once per block by all
    its threads in 16-byte pieces (the block's warps then read it instead of each reading A)."""
    a_sh = sch.cache_read(rf, 0, "shared")
    sch.compute_at(a_sh, ko, preserve_unit_loops=True)
    if m_tile > 1:
        sch.compute_inline(sch.get_sblock("A_pad"))  # padded rows read as zeros
    fused = sch.fuse(*sch.get_loops(a_sh)[-2:])
    _, f_ty, f_tx, f_vec = sch.split(fused, [None, rows, TX, 8])
    sch.bind(f_ty, "threadIdx.y")
    sch.bind(f_tx, "threadIdx.x")
    sch.vectorize(f_vec)


def _all_reduce(sch: s_tir.Schedule, mm: Any, ty: Any) -> None:
    """Warp-shuffle all-reduce of the 32 per-thread partial sums, one row of the M tile after another."""
    sch.reverse_compute_at(mm, ty)
    red = sch.get_loops(mm)[3:]  # under (io, jo, ty): the rfactor'd tx loop and the M tile's rows
    red_tx = next(lp for lp in red if int(sch.get(lp).extent) == TX)
    if len(red) == 2:
        sch.reorder(*(lp for lp in red if lp != red_tx), red_tx)
    sch.bind(red_tx, "threadIdx.x")
