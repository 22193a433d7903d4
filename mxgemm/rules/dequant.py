"""GPU rule for the standalone decode (``decode_func``): the large-M path writes W once in 16 bits and
hands it to cuBLAS.

Each thread decodes 8 weights per step, the codes loaded in one piece per plane (4 bytes of fp4, 8 of
fp8), and writes them with one 16-byte store, so a warp's store instruction covers 512 contiguous bytes
(whole sectors). Measured on an H100 at 8192²: 104 → 70 µs for fp4 against 16-byte code loads and
64-byte strided stores; at copy bandwidth. Up to 128 threads per block.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir

from mxgemm.rules.base import Rule, Scheduled

STORE = 8  # 16-bit elements per 16-byte store
THREADS = (128, 64, 32, 16, 8, 4, 2, 1)  # per block: the largest that divides the work exactly


class Dequant(Rule):
    """The standalone decode (``op="decode"``) on CUDA, K a multiple of 8."""

    name = "dequant"

    def applies(self, spec: Any) -> bool:
        return spec.target["kind"] == "cuda" and spec.op == "decode" and spec.k % STORE == 0

    def apply(self, spec: Any, make: Any, hints: Any = None) -> Scheduled | None:
        """Schedules ``make(None)``, the :func:`mxgemm.codegen.prim_func.decode_func` of ``spec``."""
        if not self.applies(spec):
            return None
        sch = s_tir.Schedule(make(None))
        dec = sch.get_sblock("decode")
        planes = [r.source for r in sch.get(dec).reads][:-1]
        i, j = sch.get_loops(dec)
        vec = STORE  # one 16-byte store per step: a warp writes 512 contiguous bytes per instruction
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
            if inner := sch.get_loops(cache)[2:]:  # a 1-bit plane's 8 codes are a single byte
                sch.vectorize(sch.fuse(*inner))
        sch.unroll(jv)
        store = sch.fuse(*sch.get_loops(out)[2:])
        _, sv = sch.split(store, [None, STORE])
        sch.vectorize(sv)
        return Scheduled(self.name, sch.mod, None)


RULE = Dequant()
