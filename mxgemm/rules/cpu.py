"""CPU rule: parallel over N tiles, decode each tile once, vectorized along N (static or dynamic M).

Per N tile (parallel): decode ``W[tile, :]`` once into a ``[k, tile]`` buffer whose N index is
innermost, then for each row of A accumulate ``C[i, tile] += A[i, k] * Wt[k, :]`` with the N loop
vectorized (A broadcast), then run the epilogue for that row and tile.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tvm import s_tir

from mxgemm.rules.base import Rule, Scheduled

N_TILES = (16, 8, 4, 2, 1)  # by default the first that divides N is used


@dataclass(frozen=True)
class Hints:
    """n_tile: the N columns decoded and accumulated per parallel task (one of :data:`N_TILES`)."""

    n_tile: int = 16

    def __post_init__(self) -> None:
        if self.n_tile not in N_TILES:
            raise ValueError(f"cpu hints out of range: {self}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class Cpu(Rule):
    """Every linear kernel for an LLVM target."""

    name = "cpu"
    Hints = Hints

    def applies(self, spec: Any) -> bool:
        return spec.target["kind"] == "llvm" and spec.op == "linear"

    def candidates(self, spec: Any) -> list[Hints]:
        """Every N tile that divides N (the default first)."""
        return [Hints(t) for t in N_TILES if spec.n % t == 0] if self.applies(spec) else []

    def default_hints(self, spec: Any) -> Hints | None:
        return next(iter(self.candidates(spec)), None)

    def apply(self, spec: Any, make: Any, hints: Hints | None = None) -> Scheduled | None:
        """Schedules ``make("float32")``; None when ``hints.n_tile`` does not divide N."""
        h = hints if hints is not None else self.default_hints(spec)
        if h is None or not self.applies(spec) or spec.n % h.n_tile:
            return None
        sch = s_tir.Schedule(make("float32"))
        try:
            mm, dec, epi = (sch.get_sblock(name) for name in ("matmul", "decode", "epilogue"))
        except Exception:  # noqa: BLE001 (TVM raises its own error types for a missing block)
            return None
        nt = h.n_tile
        i, j, k = sch.get_loops(mm)
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
        return Scheduled(self.name, sch.mod, h)


RULE = Cpu()
