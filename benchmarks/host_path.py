"""The eager host path of `MxLinear` on a GPU, part by part (`host-probe-*.json`) and per layer of
the stack (`layer-probe-*.jsonl`). Run where the kernels are cached (``mxgemm bench --stack
--build-only`` builds them): ``MXGEMM_CACHE_DIR=DIR python benchmarks/host_path.py OUT_DIR [--m 1,16]
[--layers-only]``.

Parts: best of 7 rounds of 300 back-to-back calls, wall µs a call, on an mxfp4 1024×4096 layer at
one row (the GPU keeps up, so this is host time). Layers: best of 5 rounds of 200 calls with a sync
at the end (wall), and one call captured in a CUDA graph and replayed (GPU)."""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

import mxgemm
from mxgemm import ops
from mxgemm.codegen import build as builder

STACK = ((4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096))  # (in, out) of the stack's layers


def per_call(fn, n: int = 300, rounds: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return round(best, 2)


def parts(dt: torch.dtype, n: int = 1024, k: int = 4096) -> dict[str, float]:
    dev = torch.device("cuda")
    lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=dt)
    mx = mxgemm.MxLinear.from_linear(lin, "mxfp4", a_dtype=dt)
    x = torch.randn(1, k, device=dev, dtype=dt)
    mx(x)
    key = (1, x.device, dt, "mxfp4", n, k, False, 32, None)
    kernel, planes, scales = ops._routes[key], mx.planes, mx.weight_scales
    out = torch.empty(1, n, dtype=dt, device=dev)
    args = [x, *planes, scales, out]
    r = {
        "nn.Linear": per_call(lambda: lin(x)),
        "F.linear": per_call(lambda: F.linear(x, lin.weight)),
        "torch.empty": per_call(lambda: torch.empty(1, n, dtype=dt, device=dev)),
        "kernel(args)": per_call(lambda: kernel(*args)),
        "builder.launch": per_call(lambda: builder.launch(kernel, args)),
        "launcher": per_call(lambda: ops._launchers[key](x, planes, scales, None)),
        "_forward": per_call(lambda: ops._forward(x, planes, scales, None, "mxfp4", 32, n, k)),
        "dispatch": per_call(lambda: ops.dispatch(x, planes, scales, None, "mxfp4", 32, n, k)),
        "MxLinear.forward": per_call(lambda: mx.forward(x)),
        "MxLinear": per_call(lambda: mx(x)),
        "_eager(x)": per_call(lambda: ops._eager(x)),
        "check_fp16_once": per_call(lambda: ops._check_fp16_once(planes, scales, "mxfp4", 32, n, k)),
        "os.environ.get": per_call(lambda: os.environ.get(ops.BACKEND_ENV)),
        "is_current_stream_capturing": per_call(torch.cuda.is_current_stream_capturing),
        "out[:1]": per_call(lambda: out[:1]),
    }
    if hasattr(kernel, "loaded"):  # (the launcher's own parts: the library function, a fresh output)
        fn = kernel.loaded()
        r["loaded(args)"] = per_call(lambda: fn(*args))
        r["loaded(args, new out)"] = per_call(
            lambda: fn(*args[:-1], torch.empty((1, n), dtype=dt, device=dev))
        )
        r["_cuda_getDevice"] = per_call(torch._C._cuda_getDevice)

        def alloc_only():
            torch.empty((1, n), dtype=dt, device=dev)
            fn(*args)

        r["torch.empty, then loaded(args)"] = per_call(alloc_only)
        r["torch: out.zero_()"] = per_call(out.zero_)  # (what torch's own ops pay for the same)
        r["torch: torch.empty().zero_()"] = per_call(
            lambda: torch.empty((1, n), dtype=dt, device=dev).zero_()
        )
    if hasattr(mx, "_hot"):  # (the layer's hot path, `ops.hot_path`: what a repeated eager call runs)
        hot, bufs = mx._hot[x.shape], mx._buffers
        r["hot path"] = per_call(lambda: hot(x, bufs))
    return r


def graph_us(fn, n: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    torch.cuda.synchronize()
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    b.synchronize()
    return round(a.elapsed_time(b) * 1e3 / n, 1)


def layers(dt: torch.dtype, ms=(1, 16)):
    dev = torch.device("cuda")
    for k, n in STACK:
        lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=dt)
        mx = mxgemm.MxLinear.from_linear(lin, "mxfp4", a_dtype=dt)
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=dt)
            run_mx, run_lin = (lambda mx=mx, x=x: mx(x)), (lambda lin=lin, x=x: lin(x))
            run_mx()
            route = ops._routes[(m, x.device, dt, "mxfp4", n, k, False, 32, None)]
            yield dict(
                dt=str(dt).removeprefix("torch."),
                n=n,
                k=k,
                m=m,
                rule=getattr(route, "rule", str(route)),
                pdl=getattr(route, "info", {}).get("hints", {}).get("pdl"),
                hints=getattr(route, "info", {}).get("hints"),
                mx_wall=per_call(run_mx, 200, 5),
                lin_wall=per_call(run_lin, 200, 5),
                mx_gpu=graph_us(run_mx),
                lin_gpu=graph_us(run_lin),
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--m", default="1,16", help="comma list of the layer probe's rows")
    ap.add_argument("--layers-only", action="store_true", help="skip the host-path parts")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dts = (torch.float16, torch.bfloat16)
    if not args.layers_only:
        probe = {str(dt).removeprefix("torch."): parts(dt) for dt in dts}
        (out / "host-probe.json").write_text(json.dumps(probe, indent=1))
        print(json.dumps(probe, indent=1))
    with (out / "layer-probe.jsonl").open("w") as f:
        for dt in dts:
            for row in layers(dt, [int(m) for m in args.m.split(",")]):
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
