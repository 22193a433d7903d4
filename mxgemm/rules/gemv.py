"""GPU rule for M=1 (GEMV): each thread streams 16 bytes of packed weight codes per step.

Per output row ``n`` a warp walks K in steps of 32 threads × ``VEC`` elements, ``VEC`` chosen so one
thread's codes are one 16-byte load (fp4: 32 elements; 8-bit: 16); codes land in registers, are
decoded there and multiplied with A; per-thread fp32 partial sums (``rfactor``) are reduced across the
warp with shuffles. ``ROWS`` rows (warps) share a thread block.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx

TX = 32  # threads along K (one warp)
ROWS = 4  # rows of W (warps) per thread block
LOAD_BYTES = 16


def apply(func: tirx.PrimFunc, target: dict[str, Any]) -> s_tir.Schedule | None:
    """Schedule for a static M=1 prim_func, or None when the shape does not fit the tiling
    (K a multiple of 32 × VEC, N a multiple of ROWS)."""
    sch = s_tir.Schedule(func)
    try:
        dec, mm, epi = (sch.get_sblock(n) for n in ("decode", "matmul", "epilogue"))
    except Exception:  # noqa: BLE001 (a missing block: not our prim_func)
        return None
    i, j, k = sch.get_loops(mm)
    m_ext, n_ext, k_ext = (int(sch.get(x).extent) for x in (i, j, k))
    if m_ext != 1 or n_ext % ROWS:
        return None
    sch.compute_inline(dec)
    plane0 = sch.get(mm).reads[1].source  # reads: A, the code planes, S (buffers)
    vec = LOAD_BYTES if int(plane0.shape[1]) == k_ext else 32  # 16 bytes of the widest plane
    if k_ext % (TX * vec):
        return None
    ko, tx, kv = sch.split(k, [None, TX, vec])
    jo, ty = sch.split(j, [None, ROWS])
    sch.reorder(i, jo, ty, tx, ko, kv)
    rf = sch.rfactor(tx, 0)
    sch.set_scope(rf, 0, "local")
    sch.set_scope(mm, 0, "local")
    i, jo, ty, tx, ko, kv = sch.get_loops(rf)
    sch.bind(jo, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    n_reads = len(sch.get(rf).reads)
    for idx in range(1, n_reads - 1):  # the packed planes (after A, before S): one vector load each
        cache = sch.cache_read(rf, idx, "local")
        sch.compute_at(cache, ko, preserve_unit_loops=True)
        sch.vectorize(sch.fuse(*sch.get_loops(cache)[6:]))
    a_cache = sch.cache_read(rf, 0, "local")
    sch.compute_at(a_cache, ko, preserve_unit_loops=True)
    a_loop = sch.fuse(*sch.get_loops(a_cache)[6:])
    _, a_vec = sch.split(a_loop, [None, 8])
    sch.vectorize(a_vec)
    sch.unroll(kv)
    sch.decompose_reduction(rf, ko)
    sch.reverse_compute_at(mm, ty)
    sch.bind(sch.get_loops(mm)[-1], "threadIdx.x")
    sch.reverse_compute_at(epi, ty)
    return sch
