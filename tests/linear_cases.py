"""The numerics matrix of `mxgemm.linear`, shared by the CPU/GPU tests and the GPU prebuild script."""

import mxgemm

FORMATS = mxgemm.formats.names()
DTYPES = ("float16", "bfloat16")
MS = (1, 3, 17, 64)
N, K = 40, 96  # not multiples of typical tiles; K a multiple of the block (32)
BLOCK_CASES = (("mxfp4", 8, 24, 64), ("bfp5", 256, 24, 512), ("mxfp6_e2m3", 64, 8, 192))  # fmt, block, n, k
GEMV_N, GEMV_K = 64, 2048  # a shape the small-M `gemv` rule tiles for every format (K % 2048 == 0)
GEMV_MS = (1, 3)  # the M buckets `linear` runs it for: 1 and 4 (3 rows: one padded)
CHUNK_FORMATS = ("mxfp4", "mxfp6_e3m2", "mxfp8_e5m2", "mxint8", "bfp3")  # the chunked decode + cuBLAS path
TC_N, TC_K = 256, 2048  # a shape the tensor-core rule tiles for every format (N % 128, K % (32 × 16))
TC_MS = (5, 16, 17, 64)  # its M buckets 16 and 64, padded and full
