"""Argument checks shared by the prim_func builders and `mxgemm.build` (clear errors, before TVM)."""

from __future__ import annotations

from typing import Any

from mxgemm.options import A_DTYPE_NAMES

A_DTYPES = tuple(A_DTYPE_NAMES)  # "float16", "bfloat16"
CPU_M_BUCKETS = (1, 4)  # the CPU's static-M kernels (the few-row GEMV); other M: one dynamic-M kernel
# CUDA past 256 rows, decided by the tune log (decode + cuBLAS unless a fused record wins): 257-1024 rows
# in 128-row steps (a fused kernel wins or loses by the part-filled M tile it computes), then 1025-2048
# and 2049-4096 (prefill: the decode's share of decode + cuBLAS shrinks with the rows, a fused kernel's
# part-filled tile too); past 4096 rows decode + cuBLAS
WIDE_M_BUCKETS = (384, 512, 640, 768, 896, 1024, 2048, 4096)


def check_shape(n: int, k: int, block_size: int) -> None:
    """ValueError unless ``n`` and ``k`` are positive ints and ``k`` a multiple of ``block_size``."""
    for name, v in (("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if k % block_size:
        raise ValueError(f"k={k} is not a multiple of block_size={block_size}")


def dtype_name(dt: Any, arg: str, extra: tuple[str, ...] = ()) -> str:
    """``"float16"`` / ``"bfloat16"`` (or one of ``extra``) from that name or the torch dtype;
    ValueError naming ``arg``."""
    name = str(dt).removeprefix("torch.")
    if name not in (*A_DTYPES, *extra):
        raise ValueError(f"{arg} must be one of {(*A_DTYPES, *extra)}, got {dt!r}")
    return name
