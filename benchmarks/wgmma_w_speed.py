"""The decode-fused wgmma GEMM (:mod:`mxgemm.codegen.wgmma_w`) at mid and large M: build here, check and
time on the GPU box.

    python benchmarks/wgmma_w_speed.py build DIR             # here: TVM + nvcc, no GPU
    python benchmarks/wgmma_w_speed.py measure DIR [--out F]  # there: runtime-only TVM + torch

``measure`` checks every built kernel against a float64 product of the dequantized weights on a
ragged shape (also with rows whose scales do not fold: the unfolded path), then times mxfp4 fp16
against cuBLAS fp16 (``torch.mm``, same process, CUDA events, medians of 20, weights and activations
rotated so L2 holds no operand of the timed call).

Probes (timed, not checked; their outputs are garbage) bound what the decode costs: ``nodecode`` feeds
the wgmmas the gathered code words as they are (no decode, no folded scale), ``nomma`` decodes and
issues no wgmma (the fragments summed into the accumulator, so the decode stays live).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import gpu_script  # benchmarks/, beside this script
import torch
from tvm import tirx

from mxgemm import formats, reference
from mxgemm.codegen import wgmma_w

SHAPES = [(28672, 8192), (8192, 8192), (4096, 14336), (4096, 4096)]  # (N, K)
MS = (64, 128, 256, 512, 1024, 4096)
CHECK = (256, 512, 200)  # N, K, M
VARIANTS = [
    wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2),
    wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2),
    wgmma_w.Hints(2, 3, 0, mt=256, ring=1, tma=2),
    wgmma_w.Hints(1, 3, 1, mt=256, ring=1, tma=2),
]
CHECK_FORMATS = [
    ("mxfp4", "float16"),
    ("mxfp4", "bfloat16"),
    ("mxfp8_e4m3", "float16"),
    ("mxint8", "bfloat16"),
]


PROBE_SHAPES = [(28672, 8192)]
PROBE_HINTS = [wgmma_w.Hints(1, 3, 1, mt=64), wgmma_w.Hints(2, 4, 1, mt=128), wgmma_w.Hints(4, 4, 1, mt=64)]


class _NoDecode(wgmma_w._Kernel):
    def decode(self, slot, buf: int, fold: bool, steps=None, it=None) -> None:
        from mxgemm.codegen.decode import u32

        steps = self.each(steps)
        words = self.T.alloc_buffer((self.steps, 2, 2), "uint32", scope="local")
        for r, u in itertools.product(range(2), steps):
            self.lane_words(slot, self.row(r), u, words, r)
        for u, g, q in itertools.product(steps, range(2), range(4)):
            word = tirx.BufferLoad(words, [u, q % 2, g]) & u32(0x3F7F3F7F)  # finite halves
            self.T.buffer_store(self.afr, word, [buf, u, g, q])


class _NoMma(wgmma_w._Kernel):
    def mma(self, slot, buf: int, steps=None, into=None, part: int = 0, fresh=None) -> None:
        steps = self.each(steps)
        for n_, (u, g, q) in enumerate(itertools.product(steps, range(2), range(4))):
            i = n_ % self.frag
            bits = tirx.reinterpret("float32", tirx.BufferLoad(self.afr, [buf, u, g, q]))
            self.T.buffer_store(self.acc, tirx.BufferLoad(self.acc, [i]) + bits, [i])
        self.T.evaluate(self.T.ptx.wgmma.commit_group.sync.aligned())


PROBES = {"nodecode": _NoDecode, "nomma": _NoMma}


def _probe(cls, n, k, h):
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder() as ib:
        with T.prim_func():
            cls(T, formats.get("mxfp4"), n, k, "float16", False, "float16", h).emit()
    return ib.get()


def _name(fmt, n, k, h, dt, bias):
    extra = (f"_z{h.splits}" if h.splits > 1 else "") + ("_ring" if h.ring else "")
    extra += f"_tma{h.tma}" if h.tma else ""
    return f"{fmt}_n{n}_k{k}_wg{h.wg}_s{h.stages}_d{h.double}_mt{h.mt}{extra}_{dt}{'_bias' if bias else ''}"


def build(out: Path) -> None:
    import tvm

    from mxgemm.codegen import build as kbuild
    from mxgemm.codegen.wgmma import TARGET

    out.mkdir(parents=True, exist_ok=True)
    jobs = [(f, CHECK[0], CHECK[1], h, dt, True) for h, (f, dt) in itertools.product(VARIANTS, CHECK_FORMATS)]
    jobs += [("mxfp4", n, k, h, "float16", False) for (n, k), h in itertools.product(SHAPES, VARIANTS)]
    for fmt, n, k, h, dt, bias in jobs:
        if wgmma_w.applies(formats.get(fmt), n, k, dt, h):
            continue
        name = _name(fmt, n, k, h, dt, bias)
        f = wgmma_w.kernel(formats.get(fmt), n=n, k=k, out_dtype=dt, bias=bias, a_dtype=dt, hints=h)
        t = time.time()
        kbuild.compile_export(tvm.IRModule({"main": f}), TARGET, out / f"{name}.so")
        print(f"built {name} in {time.time() - t:.1f} s", flush=True)
    build_probes(out)


def build_probes(out: Path) -> None:
    """The probes and their plain kernels (:data:`PROBE_SHAPES` × :data:`PROBE_HINTS`)."""
    import tvm

    from mxgemm.codegen import build as kbuild
    from mxgemm.codegen.wgmma import TARGET

    out.mkdir(parents=True, exist_ok=True)
    for probe, (n, k), h in itertools.product(("", *PROBES), PROBE_SHAPES, PROBE_HINTS):
        name = f"{probe}{'_' if probe else ''}{_name('mxfp4', n, k, h, 'float16', False)}"
        if not (out / f"{name}.so").exists():
            cls = PROBES.get(probe, wgmma_w._Kernel)
            kbuild.compile_export(tvm.IRModule({"main": _probe(cls, n, k, h)}), TARGET, out / f"{name}.so")
            print(f"built {name}", flush=True)


def _weights(fmt, n, k, gen, dev, spread: bool = False):
    """A quantized random weight; ``spread``: rows whose block scales span 40 binades (no fp16 fold)."""
    w = torch.randn(n, k, generator=gen, device=dev) * 0.02
    if spread:
        w = w * torch.exp2(torch.linspace(-36, 4, k // 32, device=dev)).repeat_interleave(32)
    return reference.quantize(w, fmt)


def check(func, fmt, n, k, m, dt, dev, spread: bool = False) -> dict:
    gen = torch.Generator(dev).manual_seed(n + k + m)
    q = _weights(fmt, n, k, gen, dev, spread)
    dtype = getattr(torch, dt)
    x = (torch.randn(m, k, generator=gen, device=dev) * 2).to(dtype)
    bias = torch.randn(n, generator=gen, device=dev).to(dtype)
    y = torch.empty(m, n, dtype=dtype, device=dev)
    func(x, q.blocks, q.scales, bias, y)
    torch.cuda.synchronize()
    wd = reference.dequantize(q, torch.float64)
    ref = x.double() @ wd.T + bias.double()
    mag = x.double().abs() @ wd.abs().T + bias.double().abs()
    ulp = 2.0 ** -(11 if dt == "float16" else 8)
    err = ((y.double() - ref).abs() - ref.abs() * ulp).clamp_min(0) / mag  # beyond one output rounding
    return {"max_err_over_abs_sum": float(err.max()), "finite": bool(torch.isfinite(y).all())}


def time_shape(d: Path, n: int, k: int, m: int, dev: str) -> list[dict]:
    gen = torch.Generator(dev).manual_seed(1)
    copies = max(2, -(-256 * 2**20 // (n * k * 2)))  # weights rotated past L2 (fp16 copies)
    w16 = [torch.randn(n, k, device=dev, dtype=torch.float16) * 0.02 for _ in range(copies)]
    packed = [_weights("mxfp4", n, k, gen, dev) for _ in range(copies)]
    xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(copies)]
    y = torch.empty(m, n, dtype=torch.float16, device=dev)
    t_cublas = gpu_script.median_us(lambda i: torch.mm(xs[i % copies], w16[i % copies].T, out=y))
    rows = []
    for probe, h in itertools.product(("", *PROBES), dict.fromkeys(VARIANTS + PROBE_HINTS)):
        path = d / f"{probe}{'_' if probe else ''}{_name('mxfp4', n, k, h, 'float16', False)}.so"
        if not path.exists():
            continue
        func = gpu_script.load(path)

        def run(i, func=func):
            q = packed[i % copies]
            func(xs[i % copies], q.blocks, q.scales, y)

        t = gpu_script.median_us(run)
        row = {"n": n, "k": k, "m": m, "hints": h.to_dict(), "us": t, "cublas_fp16_us": t_cublas}
        row = {**row, "probe": probe} if probe else row
        rows.append({**row, "vs_cublas": t_cublas / t, "tflops": 2 * m * n * k / t / 1e6})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def measure(d: Path, out: Path | None) -> None:
    dev = "cuda"
    rows = []
    for h, (fmt, dt) in itertools.product(VARIANTS, CHECK_FORMATS):
        path = d / f"{_name(fmt, CHECK[0], CHECK[1], h, dt, True)}.so"
        if path.exists():
            for spread in (False, True):
                r = check(gpu_script.load(path), fmt, CHECK[0], CHECK[1], CHECK[2], dt, dev, spread)
                row = {"kind": "check", "fmt": fmt, "dtype": dt, "hints": h.to_dict()}
                rows.append({**row, "unfolded": spread, **r})
                print(json.dumps(rows[-1]), flush=True)
    for (n, k), m in itertools.product(SHAPES, MS):
        rows += time_shape(d, n, k, m, dev)
    gpu_script.write_rows(rows, out)


if __name__ == "__main__":
    gpu_script.cli(__doc__, build, measure)
