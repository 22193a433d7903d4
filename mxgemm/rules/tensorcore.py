"""GPU rule for medium M (buckets 16 and 64, fp16 activations): tensor cores fed by decoded tiles.

Per thread block an ``mt × nt`` output tile, 4 warps of wmma 16×16×16 fragments, fp32 accumulation.
Each K step loads the A tile (16-byte vectors, padded rows read as zeros) and the packed code tile of W
(one wide load of the widest plane per thread and row chunk, coalesced along K) into shared memory,
decoded once there to fp16, then feeds the fragments. Small M gives few output tiles, so K is split
over ``splits`` blocks (``blockIdx.z``) whose fp32 partial sums a second kernel adds (with the
epilogue). Hints are tunable; tiles whose shared buffers TVM's allocator mis-merges (mt ≤ 32 with
kt = 64) are not offered.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from tvm import s_tir

from mxgemm import formats
from mxgemm.codegen import target as targets
from mxgemm.layout import plane_widths
from mxgemm.rules.base import Rule, Scheduled, cheapest, cuda_linear, preferred

M_TILES = (16, 64)  # M buckets this rule serves
WARPS = 4
LOAD_BYTES = 16


@dataclass(frozen=True)
class Hints:
    """mt, nt, kt: block tile (M rows, N columns, K step); splits: K slices summed afterwards."""

    mt: int = 32
    nt: int = 128
    kt: int = 32
    splits: int = 4

    def __post_init__(self) -> None:
        ok = self.mt in (16, 32, 64, 128) and self.nt in (64, 128) and self.kt in (32, 64)
        if not ok or self.splits not in (1, 2, 4, 8, 16) or (self.mt <= 32 and self.kt == 64):
            raise ValueError(f"tensorcore hints out of range: {self}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _vec(kt: int, fmt: formats.Format) -> int:
    """Codes per thread per row chunk of the W tile: one 16-byte load of the widest plane, ≤ kt."""
    return min(LOAD_BYTES * 8 // plane_widths(fmt.bits)[0], kt)


def fits(h: Hints, n: int, k: int, fmt: formats.Format) -> bool:
    """Whether ``h`` tiles an ``[n, k]`` weight of ``fmt`` exactly."""
    vec = _vec(h.kt, fmt)
    return (
        n % h.nt == 0
        and k % (h.kt * h.splits) == 0
        and (h.mt * h.kt) % (WARPS * 32 * 8) == 0
        and (h.nt * h.kt) % (WARPS * 32 * vec) == 0
        and h.kt % vec == 0
    )


def space(m_tile: int) -> list[Hints]:
    """Every hint set for ``m_tile`` rows (deterministic order; the same for every format and shape)."""
    out = []
    for mt, nt, kt, splits in itertools.product((16, 32, 64, 128), (64, 128), (32, 64), (1, 2, 4, 8, 16)):
        if mt >= min(m_tile, 32) and not (mt <= 32 and kt == 64):
            out.append(Hints(mt, nt, kt, splits))
    return out


class TensorCore(Rule):
    """fp16 activations, buckets 16 and 64 (:data:`M_TILES`), a shape the default hints tile."""

    name = "tensorcore"
    Hints = Hints

    @staticmethod
    def _serves(spec: Any) -> bool:
        return cuda_linear(spec, M_TILES, ("float16",))

    def candidates(self, spec: Any) -> list[Hints]:
        f = formats.get(spec.fmt)
        return [h for h in space(spec.m_bucket) if fits(h, spec.n, spec.k, f)] if self._serves(spec) else []

    def cost(self, spec: Any, h: Hints) -> float:
        """Padded rows of A are wasted work; fewer than 3 blocks per SM leave the memory system idle;
        each K slice adds a partial-sum round trip."""
        sms = targets.sm_count(spec.target["arch"])
        blocks = (spec.n // h.nt) * h.splits
        waste = max(h.mt, spec.m_bucket) / spec.m_bucket
        idle = max(1.0, 3 * sms / blocks)
        return waste * idle * (1 + 0.03 * h.splits) * (1.1 if h.kt == 32 else 1.0)

    def default_hints(self, spec: Any) -> Hints | None:
        """The arch's table row (``schedules/<arch>.json``, by M tile): its tile, K split until the grid
        has ``blocks_per_sm`` blocks per SM (and the split divides K); else the cheapest candidate by
        :meth:`cost`; None when nothing fits."""
        if not self._serves(spec):
            return None
        n, k, arch = spec.n, spec.k, spec.target["arch"]
        row = preferred(self.name, arch, {"m": spec.m_bucket})
        if row is None:
            return cheapest(self, spec)
        sms = targets.sm_count(arch)
        tile = row["prefer"][0]
        for splits in (1, 2, 4, 8, 16):
            if (n // tile["nt"]) * splits >= row["blocks_per_sm"] * sms:
                break
        while splits > 1 and k % (tile["kt"] * splits):
            splits //= 2
        h = Hints(**tile, splits=splits)
        return h if fits(h, n, k, formats.get(spec.fmt)) else None

    def apply(self, spec: Any, make: Any, hints: Hints | None = None) -> Scheduled | None:
        """Schedules ``make(None)`` (the decode in fp16: the tensor cores take it) serving M up to the
        bucket; None when the hints do not tile the shape."""
        h = hints if hints is not None else self.default_hints(spec)
        fmt = formats.get(spec.fmt)
        if h is None or not self._serves(spec) or not fits(h, spec.n, spec.k, fmt):
            return None
        sch = s_tir.Schedule(make(None))
        try:
            dec, mm = sch.get_sblock("decode"), sch.get_sblock("matmul")
        except Exception:  # noqa: BLE001 (a missing block: not our prim_func)
            return None
        if str(sch.get(dec).writes[0].source.dtype) != "float16":
            return None
        planes = [r.source for r in sch.get(dec).reads][:-1]
        _schedule(sch, dec, mm, h, _vec(h.kt, fmt), len(planes))
        return Scheduled(self.name, sch.mod, h)


RULE = TensorCore()


def _schedule(sch: s_tir.Schedule, dec: Any, mm: Any, h: Hints, vec: int, n_planes: int) -> None:
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    sch.pad_einsum(mm, [h.mt, 1, 1])
    sch.compute_inline(sch.get_sblock("matmul_pad"))
    red = None
    if h.splits > 1:  # partial sums per K slice, then a kernel that adds them (and runs the epilogue)
        _, _, k = sch.get_loops(mm)
        ks, _ = sch.split(k, [h.splits, None])
        sch.reorder(ks, *sch.get_loops(mm)[:2])
        red, mm = mm, sch.rfactor(ks, 0)
    loops = sch.get_loops(mm)
    i, j, k = loops[-3:]
    i, ii = sch.split(i, [None, 16])
    j, ji = sch.split(j, [None, 16])
    k, ki = sch.split(k, [None, 16])
    sch.reorder(i, j, k, ii, ji, ki)
    outer = sch.blockize(ii)
    wy = min(2, h.mt // 16)
    i0, i2, i3 = sch.split(i, [None, wy, h.mt // 16 // wy])
    j0, j2, j3 = sch.split(j, [None, WARPS // wy, h.nt // 16 // (WARPS // wy)])
    k0, k1 = sch.split(k, [None, h.kt // 16])
    sch.reorder(i0, j0, i2, j2, k0, k1, i3, j3)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    if red is not None:
        sch.bind(loops[0], "blockIdx.z")
    ty = sch.fuse(i2, j2)
    sch.bind(ty, "threadIdx.y")
    _tiles_to_shared(sch, outer, dec, k0, vec, n_planes)
    _tensorize(sch, outer, mm, ty, k0, k1, get_wmma_intrin_group, auto_inline_consumer_chain, red is None)
    if red is not None:
        rk, ri, rj = sch.get_loops(red)
        sch.reorder(ri, rj, rk)
        bx, rtx = sch.split(sch.fuse(ri, rj), [None, 256])
        sch.bind(bx, "blockIdx.x")
        sch.bind(rtx, "threadIdx.x")
        sch.reverse_compute_at(sch.get_sblock("epilogue"), rtx)


def _tiles_to_shared(sch: s_tir.Schedule, outer: Any, dec: Any, k0: Any, vec: int, n_planes: int) -> None:
    """Per K step: the A tile into shared memory (16-byte vectors; rows past M read as zeros), and the
    W tile decoded into shared memory, each thread one wide load per code plane and row chunk."""
    a_sh = sch.cache_read(outer, 0, "shared.dyn")
    sch.compute_at(a_sh, k0)
    sch.compute_inline(sch.get_sblock("A_pad"))
    _threads(sch, sch.fuse(*sch.get_loops(a_sh)[-2:]), 8)
    sch.vectorize(sch.get_loops(a_sh)[-1])
    sch.storage_align(a_sh, 0, axis=-2, factor=16, offset=8)
    sch.set_scope(dec, 0, "shared.dyn")
    sch.compute_at(dec, k0)
    tx = _threads(sch, sch.fuse(*sch.get_loops(dec)[-2:]), vec)
    for idx in range(n_planes):
        cache = sch.cache_read(dec, idx, "local")
        sch.compute_at(cache, tx)
        inner = _loops_below(sch, cache, tx)
        sch.vectorize(sch.fuse(*inner) if len(inner) > 1 else inner[0])
    sch.unroll(sch.get_loops(dec)[-1])
    sch.storage_align(dec, 0, axis=-2, factor=16, offset=8)


def _threads(sch: s_tir.Schedule, fused: Any, vec: int) -> Any:
    """Split ``fused`` over the block's warps and lanes with ``vec`` innermost; returns the lane loop."""
    _, f_ty, f_tx, _ = sch.split(fused, [None, WARPS, 32, vec])
    sch.bind(f_ty, "threadIdx.y")
    sch.bind(f_tx, "threadIdx.x")
    return f_tx


def _loops_below(sch: s_tir.Schedule, block: Any, loop: Any) -> list:
    loops = sch.get_loops(block)
    pos = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(loop)))
    return loops[pos + 1 :]


def _tensorize(sch, outer, inner, ty, k0, k1, intrins, inline_consumers, with_epilogue: bool) -> None:
    """wmma fragments from the shared tiles, accumulators through shared memory to the output."""
    a_mat = sch.cache_read(outer, 0, "wmma.matrix_a")
    b_mat = sch.cache_read(outer, 1, "wmma.matrix_b")
    sch.compute_at(a_mat, k1)
    sch.compute_at(b_mat, k1)
    acc_sh = sch.cache_write(outer, 0, "shared.dyn")
    sch.storage_align(acc_sh, 0, -2, 16, 4)
    store = sch.cache_write(outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, ty)
    sch.reverse_compute_at(acc_sh, ty)
    si, sj = sch.get_loops(store)[-2:]
    si0, si1 = sch.split(si, [None, 16])
    sj0, sj1 = sch.split(sj, [None, 16])
    sch.reorder(si0, sj0, si1, sj1)
    init = sch.get_child_blocks(sch.decompose_reduction(outer, k0))[0]
    g = intrins(
        load_scope="shared.dyn",
        store_scope="shared.dyn",
        in_dtype="float16",
        out_dtype="float32",
        trans_b=True,
    )
    for mat, key in ((a_mat, "load_a"), (b_mat, "load_b")):
        x, y = sch.get_loops(mat)[-2:]
        x0, x1 = sch.split(x, [None, 16])
        y0, y1 = sch.split(y, [None, 16])
        sch.reorder(x0, y0, x1, y1)
        sch.unroll(x0)
        sch.unroll(y0)
        sch.tensorize(x1, g[key])
    sch.tensorize(sch.get_loops(init)[-2], g["init"])
    sch.tensorize(sch.get_loops(store)[-2], g["store"])
    sch.tensorize(sch.get_loops(inner)[-3], g["compute"])
    if with_epilogue:
        inline_consumers(sch, acc_sh)
    _, f1, f2 = sch.split(sch.fuse(*sch.get_loops(acc_sh)[-2:]), [None, 32, 4])
    sch.bind(f1, "threadIdx.x")
    sch.vectorize(f2)
