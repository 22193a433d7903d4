"""Eager µs per call of the activation quantize kernel (`mxgemm.codegen.act_quant`) against the torch
reference (`mxgemm.fake_quantize`) on a GPU, bf16 ``[M, 4096]`` to mxfp8_e4m3: build its kernel where
nvcc is with ``MXGEMM_CACHE_DIR=DIR python benchmarks/act_quant_speed.py --build-only sm_90``, run
``MXGEMM_CACHE_DIR=DIR python3 benchmarks/act_quant_speed.py`` on the GPU box."""

import sys

import torch

import mxgemm
from mxgemm.codegen import act_quant
from mxgemm.codegen import target as targets

K, FMT, MS = 4096, "mxfp8_e4m3", (1, 16, 256, 4096)


def _time(f, calls: int = 50) -> float:
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        f()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / calls * 1e3


if __name__ == "__main__":
    if "--build-only" in sys.argv:
        act_quant.kernel(FMT, K, 32, "bfloat16", "even", targets.resolve(sys.argv[-1]))
        sys.exit(0)
    for m in MS:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        k = _time(lambda x=x: act_quant.fake_quantize(x, FMT, 32, "even"))
        r = _time(lambda x=x: mxgemm.fake_quantize(x, FMT), 10)
        print(f"M={m} K={K} bf16 {FMT}: kernel {k:.1f} us, torch reference {r:.1f} us ({r / k:.1f}x)")
