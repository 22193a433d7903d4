"""A/B of the CPU GEMV's default kernels between two commits, timed interleaved in one process (the
2-core VMs drift by 20% between runs: compare within one run).

    PYTHONPATH=<old tree> MXGEMM_CACHE_DIR=<dir A> python benchmarks/cpu_ab.py build old
    PYTHONPATH=<new tree> MXGEMM_CACHE_DIR=<dir B> python benchmarks/cpu_ab.py build new
    python benchmarks/cpu_ab.py time old new

``build`` saves each case's kernel (the commit's default hints) and its weight in the layout that
kernel reads under /tmp/mxgemm-ab/<tag>/; ``time`` loads every tag's kernels with the TVM runtime
alone, checks each against ``x @ dequantize(W).T``, and times them round by round, every call on the
least recently read of the weight copies that fill 64 MB (as a model's layers come from DRAM).
"""

from __future__ import annotations

import glob
import os
import shutil
import statistics
import sys
import time

import torch

ROOT = "/tmp/mxgemm-ab"
CASES = [(f, n, k, m) for f in ("mxfp4", "mxfp6_e2m3", "mxfp8_e4m3") for n, k in ((4096, 4096), (1536, 576))
         for m in (1, 4)]  # fmt: skip


def build(tag: str) -> None:
    import mxgemm
    from mxgemm import layout
    from mxgemm.codegen import build as builder

    out = f"{ROOT}/{tag}"
    os.makedirs(out, exist_ok=True)
    for fmt, n, k, m in CASES:
        q = mxgemm.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)), fmt)
        kern = builder.build(fmt, n=n, k=k, m_bucket=m, a_dtype="bfloat16")
        name = f"{fmt}_{n}x{k}_m{m}"
        shutil.copy(kern.path, f"{out}/{name}.so")
        planes = layout.transform_weight(q, kern)
        torch.save({"w": planes, "ref": mxgemm.dequantize(q, torch.float32)}, f"{out}/{name}.pt")
        print(tag, name, kern.info["hints"])


def time_tags(tags: list[str]) -> None:
    import tvm

    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    os.environ.setdefault("TVM_NUM_THREADS", str(torch.get_num_threads()))
    for path in sorted(glob.glob(f"{ROOT}/{tags[0]}/*.so")):
        name = os.path.basename(path)[:-3]
        shape, mm = name.split("_")[-2:]
        (n, k), m = map(int, shape.split("x")), int(mm[1:])
        x = torch.randn(m, k).bfloat16()
        runs = {}
        for t in tags:
            f = tvm.runtime.load_module(f"{ROOT}/{t}/{name}.so")["main"]
            d = torch.load(f"{ROOT}/{t}/{name}.pt")
            copies = max(1, (64 << 20) // sum(p.numel() for p in d["w"]))
            ws = [[p.clone() for p in d["w"]] for _ in range(copies)]
            out = torch.empty(m, n, dtype=torch.bfloat16)
            f(x, *ws[0], out)
            ref = x.float() @ d["ref"].T
            assert (out.float() - ref).abs().max() <= 1e-2 * ref.abs().max() + 1e-6, (t, name)
            runs[t] = (f, ws, out)
        times: dict[str, list[float]] = {t: [] for t in tags}
        for r in range(max(30, int(4e8 / (n * k)))):
            for t, (f, ws, out) in runs.items():
                w = ws[r % len(ws)]
                start = time.perf_counter()
                f(x, *w, out)
                times[t].append(time.perf_counter() - start)
        med = {t: statistics.median(v) * 1e6 for t, v in times.items()}
        cells = " ".join(f"{t}:{med[t]:.0f}us" for t in tags)
        print(f"{name} {cells} speedup {med[tags[0]] / med[tags[-1]]:.2f}x")


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    build(*rest) if cmd == "build" else time_tags(rest)
