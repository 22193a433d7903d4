"""The numerics matrix of `mxgemm.linear`, shared by the CPU/GPU tests and the GPU prebuild script."""

import mxgemm

FORMATS = mxgemm.formats.names()
DTYPES = ("float16", "bfloat16")
MS = (1, 3, 17, 64)
N, K = 40, 96  # not multiples of typical tiles; K a multiple of the block (32)
BLOCK_CASES = (("mxfp4", 8, 24, 64), ("bfp5", 256, 24, 512), ("mxfp6_e2m3", 64, 8, 192))  # fmt, block, n, k
GEMV_N, GEMV_K = 64, 2048  # shapes the M=1 `gemv` rule tiles (K % 1024 == 0, N % 4 == 0)
