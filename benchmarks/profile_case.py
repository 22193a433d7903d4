"""Run one `mxgemm.linear` case a few times, for a profiler (ncu) on the GPU box:
``ncu -k regex:main_kernel -c 1 python3 benchmarks/profile_case.py FMT N K M`` (kernels from
$MXGEMM_CACHE_DIR, built beforehand with ``mxgemm bench --build-only``)."""

import sys

import torch

import mxgemm

fmt, n, k, m = sys.argv[1], *map(int, sys.argv[2:5])
q = mxgemm.quantize(torch.randn(n, k, device="cuda") * 0.02, fmt)
x = torch.randn(m, k, device="cuda", dtype=torch.float16)
for _ in range(3):
    y = mxgemm.linear(x, q)
torch.cuda.synchronize()
print(fmt, n, k, m, "ok", float(y.float().abs().mean()))
