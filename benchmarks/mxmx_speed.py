"""MXFP8 × MXFP8 on Hopper's fp8 tensor cores (:mod:`mxgemm.codegen.wgmma_mx`): build here, check and
time on the GPU box.

    python benchmarks/mxmx_speed.py build DIR            # here: TVM + nvcc, no GPU
    python benchmarks/mxmx_speed.py measure DIR [--out F] # there: runtime-only TVM + torch

``measure`` checks every built kernel against the emulation (both operands dequantized, float64
matmul) on a ragged shape, then times the large shapes at M = 1024, 4096 and 16384 against cuBLAS
bf16 (``torch.mm``), cuBLASLt fp8 with one scale per tensor (``torch._scaled_mm``, the fp8 tensor
cores' rate without MX block scales) and the float32 product of the dequantized operands (what
``MxTensor @ MxTensor`` ran before), in one process, CUDA events, medians of 20 (5 for float32).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import gpu_script  # benchmarks/, beside this script
import torch

from mxgemm import reference
from mxgemm.codegen import wgmma_mx

SHAPES = [(8192, 8192), (28672, 8192), (8192, 28672)]  # (N, K)
CHECK = (256, 1024, 300)  # N, K, M: M not a multiple of the block rows
HINTS = [
    wgmma_mx.Hints(2, 128, 4, 1),
    wgmma_mx.Hints(2, 128, 4, 2),
    wgmma_mx.Hints(1, 128, 4, 2),
    wgmma_mx.Hints(2, 64, 4, 4),
    wgmma_mx.Hints(2, 64, 4, 2),
    wgmma_mx.Hints(3, 64, 4, 2),
]


def _name(n, k, h, out_dtype, bias):
    return f"n{n}_k{k}_wg{h.wg}_bn{h.bn}_s{h.stages}_b{h.batch}_{out_dtype}{'_bias' if bias else ''}"


def build(out: Path) -> None:
    import tvm

    from mxgemm.codegen import build as kbuild

    out.mkdir(parents=True, exist_ok=True)
    from mxgemm.codegen.wgmma import TARGET as target

    jobs = [(CHECK[0], CHECK[1], h, od, True) for h in HINTS for od in ("float32", "bfloat16")]
    jobs += [(n, k, h, "bfloat16", False) for (n, k), h in itertools.product(SHAPES, HINTS)]
    for n, k, h, od, bias in jobs:
        name = _name(n, k, h, od, bias)
        f = wgmma_mx.kernel(n=n, k=k, out_dtype=od, bias=bias, hints=h)
        t = time.time()
        kbuild.compile_export(tvm.IRModule({"main": f}), target, out / f"{name}.so")
        print(f"built {name} in {time.time() - t:.1f} s", flush=True)


def _operands(m, n, k, gen, dev):
    x = torch.randn(m, k, generator=gen, device=dev) * torch.rand(m, 1, generator=gen, device=dev) * 4
    w = torch.randn(n, k, generator=gen, device=dev) * 0.02
    xq, wq = reference.quantize(x, "mxfp8_e4m3"), reference.quantize(w, "mxfp8_e4m3")
    return xq, wq


def check(func, n, k, m, out_dtype, dev) -> dict:
    gen = torch.Generator(dev).manual_seed(n + k + m)
    xq, wq = _operands(m, n, k, gen, dev)
    xs = xq.scales.clone()
    xs[7, 3] = 255  # a NaN block scale: row 7 all NaN
    bias = torch.randn(n, generator=gen, device=dev).to(getattr(torch, out_dtype))
    y = torch.empty(m, n, dtype=getattr(torch, out_dtype), device=dev)
    func(xq.blocks, xs, wq.blocks, wgmma_mx.weight_scales(wq.scales), bias, y)
    torch.cuda.synchronize()
    xd = reference.dequantize(xq, torch.float64)
    wd = reference.dequantize(wq, torch.float64)
    ref = xd @ wd.T + bias.double()
    mag = xd.abs() @ wd.abs().T + bias.double().abs()
    nan_row = bool(torch.isnan(y[7]).all())
    keep = torch.ones(m, dtype=torch.bool, device=dev)
    keep[7] = False
    err = ((y.double() - ref).abs() / mag)[keep]
    finite = bool(torch.isfinite(y[keep]).all())
    return {"max_err_over_abs_sum": float(err.max()), "nan_row": nan_row, "finite_rest": finite}


def _time_fp32(xq, wq) -> float:
    """The float32 product of the dequantized operands (what the emulation multiplies)."""
    xd, wd = reference.dequantize(xq), reference.dequantize(wq)
    return gpu_script.median_us(lambda _: torch.mm(xd, wd.T), reps=5)


def time_shape(d: Path, n: int, k: int, m: int, dev: str) -> list[dict]:
    """Every built kernel of ``[m, k] @ [n, k]^T`` against cuBLAS bf16 and fp8 in this process."""
    gen = torch.Generator(dev).manual_seed(1)
    xq, wq = _operands(m, n, k, gen, dev)
    ws = wgmma_mx.weight_scales(wq.scales)
    xb = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    wb = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    x8, w8 = xb.to(torch.float8_e4m3fn), wb.to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    flops = 2 * m * n * k
    t_bf16 = gpu_script.median_us(lambda _: torch.mm(xb, wb.T))
    t_fp8 = gpu_script.median_us(lambda _: torch._scaled_mm(x8, w8.T, one, one, out_dtype=torch.bfloat16))
    t_f32 = _time_fp32(xq, wq)
    base = {
        "n": n,
        "k": k,
        "m": m,
        "cublas_bf16_us": t_bf16,
        "scaled_mm_fp8_us": t_fp8,
        "emulation_fp32_us": t_f32,
    }
    base["cublas_bf16_tflops"] = flops / t_bf16 / 1e6
    base["scaled_mm_fp8_tflops"] = flops / t_fp8 / 1e6
    rows = []
    y = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    for h in HINTS:
        path = d / f"{_name(n, k, h, 'bfloat16', False)}.so"
        if path.exists():
            func = gpu_script.load(path)
            t = gpu_script.median_us(lambda _, func=func: func(xq.blocks, xq.scales, wq.blocks, ws, y))
            row = {"kind": "time", "hints": h.__dict__, **base, "mxmx_us": t, "mxmx_tflops": flops / t / 1e6}
            rows.append({**row, "vs_cublas_bf16": t_bf16 / t})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def measure(d: Path, out: Path | None) -> None:
    dev = "cuda"
    rows = []
    for h in HINTS:
        for od in ("float32", "bfloat16"):
            path = d / f"{_name(CHECK[0], CHECK[1], h, od, True)}.so"
            if path.exists():
                r = check(gpu_script.load(path), CHECK[0], CHECK[1], CHECK[2], od, dev)
                rows.append({"kind": "check", "hints": h.__dict__, "out": od, **r})
                print(json.dumps(rows[-1]), flush=True)
    for (n, k), m in itertools.product(SHAPES, (1024, 4096, 16384)):
        rows += time_shape(d, n, k, m, dev)
    gpu_script.write_rows(rows, out)


if __name__ == "__main__":
    gpu_script.cli(__doc__, build, measure)
