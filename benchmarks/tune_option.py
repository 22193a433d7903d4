"""Build an A/B round of one new ``wgmma_w`` option against the log's records: per task whose record
names ``wgmma_w``, the record's hints as they are and with ``--option NAME=VALUE`` (where the rule offers
that), so ``mxgemm tune --measure DIR`` times the two in one run and ``mxgemm tune --merge DIR --replace``
keeps the faster (decode + cuBLAS beside them where the bucket decides between it and a fused kernel).

    python benchmarks/tune_option.py DIR --option pdl=1 [--formats mxfp4 --dtypes float16 --m 32,64
        --shapes 4096,4096]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from mxgemm import tune
from mxgemm.rules import wgmma_w

SHAPES = (
    (4096, 4096),
    (14336, 4096),
    (4096, 14336),
    (8192, 8192),
    (28672, 8192),
    (8192, 28672),
    (1024, 4096),
)


def pair(task: tune.Task, option: dict[str, int]) -> list[tuple[str, dict]]:
    """The log's ``wgmma_w`` record for ``task`` and it with ``option``, as the rule offers them (none
    where the record is another rule's)."""
    recorded = tune._recorded(task, wgmma_w.RULE)  # noqa: SLF001
    if recorded is None:
        return []
    offered = set(wgmma_w.RULE.candidates(task.spec()))
    hints = [h for h in dict.fromkeys([recorded, dataclasses.replace(recorded, **option)]) if h in offered]
    return [("wgmma_w", h.to_dict()) for h in hints]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--option", required=True, help="NAME=VALUE, a field of wgmma_w's Hints")
    ap.add_argument("--formats", default="mxfp4")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--m", default="32,64,128,256")
    ap.add_argument("--shapes", nargs="*", default=[f"{n},{k}" for n, k in SHAPES], help="N,K pairs")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    name, value = a.option.split("=")
    option = {name: int(value)}
    todo = []
    for dtype in a.dtypes.split(","):
        shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes]
        t, _ = tune.tasks(shapes, a.formats.split(","), [int(m) for m in a.m.split(",")], dtype, "sm_90")
        todo += [task for task in t if len(pair(task, option)) == 2]
    tune.candidates = lambda task, budget: pair(task, option)  # the round's candidates
    print(
        f"{len(todo)} tasks, {2 * len(todo)} wgmma_w kernels (+ decode + cuBLAS where it competes)",
        flush=True,
    )
    done = []
    tune.build(todo, 0, a.dir, jobs=a.jobs, progress=lambda e: done.append(e) or print(len(done), flush=True))


if __name__ == "__main__":
    main()
