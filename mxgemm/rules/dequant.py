"""GPU rule for the standalone decode (``decode_func``): the large-M path writes W once in 16 bits and
hands it to cuBLAS.

Each thread turns one wide load (16 bytes where K allows) of the widest code plane into ``vec`` weights
(32 fp4 or 16 fp8) and stores them as 16-byte vectors; up to 128 threads per block.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx

LOAD_BYTES = (16, 8, 4, 2, 1)  # the widest that divides a row is used
STORE = 8  # 16-bit elements per 16-byte store
THREADS = (128, 64, 32, 16, 8, 4, 2, 1)  # per block: the largest that divides the work exactly


def apply(func: tirx.PrimFunc, target: dict[str, Any]) -> s_tir.Schedule | None:
    """Schedule for :func:`mxgemm.codegen.prim_func.decode_func`, or None when K does not split into
    whole loads."""
    del target
    sch = s_tir.Schedule(func)
    dec = sch.get_sblock("decode")
    planes = [r.source for r in sch.get(dec).reads][:-1]
    i, j = sch.get_loops(dec)
    k_ext = int(sch.get(j).extent)
    bits0 = int(planes[0].shape[1]) * 8 // k_ext  # width of the widest plane
    vec = next((b * 8 // bits0 for b in LOAD_BYTES if k_ext % (b * 8 // bits0) == 0 and b * 8 >= bits0), 0)
    if not vec or vec % STORE:
        return None
    jo, jv = sch.split(j, [None, vec])
    t = sch.fuse(i, jo)
    # an exact split: a partial last block would need a guard that the cached vector store loses
    threads = next(n for n in THREADS if int(sch.get(t).extent) % n == 0)
    bx, tx = sch.split(t, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    out = sch.cache_write(dec, 0, "local")
    sch.reverse_compute_at(out, tx)
    for idx in range(len(planes)):
        cache = sch.cache_read(dec, idx, "local")
        sch.compute_at(cache, tx)
        sch.vectorize(sch.fuse(*sch.get_loops(cache)[2:]))
    sch.unroll(jv)
    store = sch.fuse(*sch.get_loops(out)[2:])
    _, sv = sch.split(store, [None, STORE])
    sch.vectorize(sv)
    return sch
