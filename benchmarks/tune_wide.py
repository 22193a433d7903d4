"""Build a re-tune of the wide buckets (384 ... 1024 rows) with the ``wgmma_w`` options that came after
their last round (two splits added in a cluster, ``lean`` 2, ``early``): per task the log's record, and
256- and 128-row tiles unsplit and split in a cluster of 2 (where the rule offers it), the ring refilled
by a producer warpgroup (0.89-0.94x the time of every thread refilling it), and 128-row tiles on stream-K
(256-row ones took 1.3-1.9x the time there); decode + cuBLAS beside them. The tuner's own pick
(``mxgemm tune``) spends its budget on the default's twins, which differ in flags only; this round
wants the tiles and splits. Measure and merge with ``mxgemm tune --measure DIR`` / ``--merge DIR``.

    python benchmarks/tune_wide.py DIR [--formats mxfp4 --dtypes bfloat16 --m 384,512 --shapes 1024,4096]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from mxgemm import tune
from mxgemm.codegen.wgmma_w import Hints
from mxgemm.rules import wgmma_w

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (8192, 28672))
BASE = Hints(wg=2, stages=3, double=1, mt=256, splits=1, ring=1, tma=2, prod=2, lean=2, early=1)


def grid() -> list[Hints]:
    """The hint sets tried at every task (those the rule does not offer for it are dropped)."""
    out = []
    for mt, stages in ((256, 3), (128, 4)):
        h = dataclasses.replace(BASE, mt=mt, stages=stages)
        out += [h, dataclasses.replace(h, splits=2, cluster=1)]
    return [*out, dataclasses.replace(BASE, mt=128, stages=4, prod=1, sk=1, early=0)]


def candidates(task: tune.Task, budget: int) -> list[tuple[str, dict]]:
    """The log's ``wgmma_w`` record for ``task`` (if any) and :func:`grid`, as the rule offers them."""
    del budget
    spec = task.spec()
    offered = set(wgmma_w.RULE.candidates(spec))
    recorded = tune._recorded(task, wgmma_w.RULE)  # noqa: SLF001
    hints = [h for h in dict.fromkeys([*([recorded] if recorded else []), *grid()]) if h in offered]
    return [("wgmma_w", h.to_dict()) for h in hints]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--formats", default="mxfp4")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--m", default="384,512,640,768,896,1024")
    ap.add_argument("--shapes", nargs="*", default=[f"{n},{k}" for n, k in SHAPES], help="N,K pairs")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    todo = []
    for dtype in a.dtypes.split(","):
        shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes]
        t, _ = tune.tasks(shapes, a.formats.split(","), [int(m) for m in a.m.split(",")], dtype, "sm_90")
        todo += t
    tune.candidates = candidates  # the round's candidates (see the module docstring)
    n = sum(len(candidates(t, 0)) for t in todo)
    print(f"{len(todo)} tasks, {n} wgmma_w kernels (+ decode + cuBLAS each)", flush=True)
    done = []
    tune.build(todo, 0, a.dir, jobs=a.jobs, progress=lambda e: done.append(e) or print(len(done), flush=True))


if __name__ == "__main__":
    main()
