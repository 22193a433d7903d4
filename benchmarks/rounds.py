"""What the tuning-round scripts share (``tune_wide.py``, ``tune_option.py``): the arguments that pick
the tasks, and building a round's candidates with the script's own candidate list in place of the
tuner's, for ``mxgemm tune --measure DIR`` / ``--merge DIR``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from mxgemm import tune

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (8192, 28672))


def arguments(doc: str, m: str, shapes=SHAPES) -> argparse.ArgumentParser:
    """The round's parser: DIR, --formats, --dtypes, --m (default ``m``), --shapes, --jobs."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--formats", default="mxfp4")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--m", default=m)
    ap.add_argument("--shapes", nargs="*", default=[f"{n},{k}" for n, k in shapes], help="N,K pairs")
    ap.add_argument("--jobs", type=int, default=2)
    return ap


def build(a: argparse.Namespace, candidates: Callable[[tune.Task], list[tuple[str, dict]]]) -> None:
    """Build ``candidates(task)`` (the tuner's in the round, decode + cuBLAS beside them where the
    bucket decides) of the tasks ``a`` names that have any, into ``a.dir`` (the kernels too, as
    ``mxgemm tune --build-only DIR`` puts them: they travel with the manifest)."""
    os.environ["MXGEMM_CACHE_DIR"] = str(a.dir)
    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes]
    todo = []
    for dtype in a.dtypes.split(","):
        t, _ = tune.tasks(shapes, a.formats.split(","), [int(m) for m in a.m.split(",")], dtype, "sm_90")
        todo += [task for task in t if candidates(task)]
    tune.candidates = lambda task, budget: candidates(task)  # the round's candidates
    n = sum(len(candidates(t)) for t in todo)
    print(f"{len(todo)} tasks, {n} kernels (+ decode + cuBLAS where it competes)", flush=True)
    done = []
    tune.build(todo, 0, a.dir, jobs=a.jobs, progress=lambda e: done.append(e) or print(len(done), flush=True))
