"""What the build-here, measure-there benchmark scripts share: loading a built kernel library on the GPU
box (runtime-only TVM), a median CUDA-event timing, and the ``build DIR`` / ``measure DIR`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def load(path: Path):
    """The ``main`` function of the kernel library at ``path`` (TVM's CUDA runtime loaded first)."""
    import tvm

    from mxgemm.codegen import nvcc

    nvcc.load_cuda_runtime()
    return tvm.runtime.load_module(str(path))["main"]


def median_us(fn: Callable[[int], object], reps: int = 20) -> float:
    """Median of ``reps`` CUDA-event timings of ``fn(i)`` (i = 1..reps; 3 warm-up calls with i = 0), µs."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn(0)
    ts = []
    for i in range(reps):
        start.record()
        fn(i + 1)
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e3)
    return sorted(ts)[len(ts) // 2]


def write_rows(rows: list[dict], out: Path | None) -> None:
    """``rows`` as JSON lines to ``out`` (if given)."""
    import json

    if out:
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def cli(
    doc: str, build: Callable[[Path], None], measure: Callable[[Path, Path | None], None], argv=None
) -> None:
    """``build DIR`` (here: TVM + nvcc) or ``measure DIR [--out F]`` (there: the GPU box)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("what", choices=("build", "measure"))
    p.add_argument("dir", type=Path)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    build(a.dir) if a.what == "build" else measure(a.dir, a.out)
