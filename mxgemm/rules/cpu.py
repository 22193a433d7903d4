"""CPU rule: parallel over N tiles, decode each tile once, vectorized along N (static or dynamic M).

Per N tile (parallel): decode ``W[tile, :]`` once into a ``[k, tile]`` buffer whose N index is
innermost, then for each row of A accumulate ``C[i, tile] += A[i, k] * Wt[k, :]`` with the N loop
vectorized (A broadcast), then run the epilogue for that row and tile.
"""

from __future__ import annotations

from tvm import s_tir, tirx

N_TILES = (16, 8, 4, 2, 1)  # by default the first that divides N is used


def candidates(n: int) -> list[dict[str, int]]:
    """The hint space the tuner searches: every N tile that divides ``n``."""
    return [{"n_tile": t} for t in N_TILES if n % t == 0]


def apply(
    func: tirx.PrimFunc, hints: dict[str, int] | None = None
) -> tuple[tirx.PrimFunc, dict[str, int]] | None:
    """(scheduled copy of a :func:`mxgemm.codegen.prim_func.prim_func`, hints used), or ``None`` if it
    does not fit. hints: ``{"n_tile": t}``, the N columns decoded and accumulated per parallel task."""
    sch = s_tir.Schedule(func)
    try:
        mm, dec, epi = (sch.get_sblock(name) for name in ("matmul", "decode", "epilogue"))
    except Exception:  # noqa: BLE001 (TVM raises its own error types for a missing block)
        return None
    i, j, k = sch.get_loops(mm)
    n = int(sch.get(j).extent)
    nt = hints.get("n_tile") if hints else next(t for t in N_TILES if n % t == 0)
    if nt not in N_TILES or n % nt:
        return None
    jo, ji = sch.split(j, [None, nt])
    sch.reorder(jo, i, k, ji)
    sch.parallel(jo)
    sch.transform_layout(dec, ("write", 0), lambda a, b: (a // nt, b, a % nt))
    sch.compute_at(dec, jo)
    di, dk = sch.get_loops(dec)[-2:]
    sch.reorder(dk, di)
    sch.vectorize(di)
    sch.reverse_compute_at(epi, i)
    sch.vectorize(sch.get_loops(epi)[-1])
    sch.vectorize(ji)  # before decompose_reduction, which would leave no complete block to vectorize
    sch.decompose_reduction(mm, k)
    return sch.mod["main"], {"n_tile": nt}
