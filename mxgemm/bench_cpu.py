"""`mxgemm bench --device cpu`: the CPU kernels against torch in one process, as users call them.

Per layer shape and M: torch ``F.linear`` in fp32 and in bf16, torch's own int4 CPU kernel
(``torch._weight_int4pack_mm_for_cpu``, bf16 activations, group 32: what torchao's int4 weight-only
runs on CPU), and ``mxgemm.linear`` with bf16 activations per format (its eager path, the kernels
`ops.plan` picks: the fused GEMV at M=1, the decode + torch GEMM from 2 rows). Each method cycles
through enough copies of its weights to overflow the last-level cache (as a model's layers do);
cells are the median wall time of single calls. Results: JSON and markdown under
``<out>/<cpu name>_<LLVM cpu>/``, and a plot where matplotlib is installed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SHAPES = ((4096, 4096), (14336, 4096))
MS = (1, 4, 16, 64, 256)
FORMATS = ("mxfp4", "mxfp8_e4m3")
BUDGET_S = 0.4  # wall time per cell after warm-up (at least MIN_CALLS calls)
MIN_CALLS = 5
BASELINE = "torch_bf16"
MAX_COPIES = 64


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llc_bytes() -> int:
    """Size of the last-level cache (sysfs), 32 MiB where it cannot be read."""
    sizes = []
    for p in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = p.read_text().strip()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * mult)
    return max(sizes, default=32 << 20)


def _copies(nbytes: int) -> int:
    """Weight copies to cycle through so that one pass reads twice the last-level cache."""
    return min(MAX_COPIES, max(1, math.ceil(2 * llc_bytes() / max(nbytes, 1))))


def _time(calls: list) -> float:
    """Median ms of one call, cycling ``calls`` (each a closure over one weight copy), each called
    once first (a first call builds or looks up the kernel and derives the weight's kernel layout)."""
    for c in calls:
        c()
    times, start, i = [], time.perf_counter(), 0
    while time.perf_counter() - start < BUDGET_S or len(times) < MIN_CALLS:
        t = time.perf_counter()
        calls[i % len(calls)]()
        times.append(time.perf_counter() - t)
        i += 1
    return statistics.median(times) * 1e3


def int4_weight(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU int4 layout of fp32 ``w [n, k]`` (asymmetric, ``group`` per scale): the packed
    weight and the bf16 scales-and-zeros ``[k/group, n, 2]`` of ``_weight_int4pack_mm_for_cpu``."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp_min(1e-8)
    q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = lo + 8 * scale  # w ≈ (q - 8) * scale + zero
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack([scale.reshape(n, -1), zero.reshape(n, -1)], -1).transpose(0, 1)
    return packed, sz.contiguous().to(torch.bfloat16)


def _methods(w: torch.Tensor, fmts: tuple[str, ...]) -> dict[str, Any]:
    """name -> (weight bytes, a function of one weight copy and x giving the call, a copy maker)."""
    import mxgemm

    def mx(fmt):
        q = mxgemm.quantize(w, fmt)
        return (
            lambda: dataclasses.replace(q, blocks=q.blocks.clone(), scales=q.scales.clone()),
            lambda qc, x: lambda: mxgemm.linear(x, qc),
            lambda qc: qc.nbytes,
        )

    w16, (p4, sz4) = w.bfloat16(), int4_weight(w)
    out = {
        "torch_fp32": (w.clone, lambda wc, x: lambda: F.linear(x.float(), wc), lambda wc: wc.nbytes),
        "torch_bf16": (w16.clone, lambda wc, x: lambda: F.linear(x, wc), lambda wc: wc.nbytes),
        "torch_int4": (
            lambda: (p4.clone(), sz4.clone()),
            lambda p, x: lambda: torch._weight_int4pack_mm_for_cpu(x, p[0], 32, p[1]),
            lambda p: p[0].nbytes + p[1].nbytes,
        ),
    }
    return {**out, **{f"mxgemm_{fmt}": mx(fmt) for fmt in fmts}}


def run(
    shapes=SHAPES, ms=MS, fmts=FORMATS, out_dir: str | Path | None = "benchmarks/results"
) -> dict[str, Any]:
    """Time every method at every shape and M (see the module docstring); print a progress line per
    cell and the markdown table; write ``bench-cpu-<commit>.json/.md`` (and ``.png``) under
    ``out_dir/<cpu name>_<LLVM cpu>/`` unless ``out_dir`` is None. Returns the result dict."""
    from mxgemm.bench import _commit

    rows = []
    for n, k in shapes:
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
        for name, (make, call, size) in _methods(w, fmts).items():
            first = make()
            copies = [first, *(make() for _ in range(_copies(size(first)) - 1))]
            for m in ms:
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
                ms_ = _time([call(c, x) for c in copies])
                rows.append({"n": n, "k": k, "m": m, "method": name, "ms": ms_, "weight_bytes": size(first)})
                print(f"{n}x{k} M={m} {name}: {ms_:.3f} ms", flush=True)
            del copies, first
    for r in rows:
        base = next(
            b for b in rows if (b["n"], b["k"], b["m"], b["method"]) == (r["n"], r["k"], r["m"], BASELINE)
        )
        fp32 = next(
            b for b in rows if (b["n"], b["k"], b["m"], b["method"]) == (r["n"], r["k"], r["m"], "torch_fp32")
        )
        r["vs_bf16"], r["vs_fp32"] = base["ms"] / r["ms"], fp32["ms"] / r["ms"]
    from mxgemm.codegen import target as targets

    result = {
        "cpu": cpu_name(),
        "mcpu": targets.cpu()["mcpu"],  # what the kernels were built for: one model name spans generations
        "threads": torch.get_num_threads(),
        "llc_mb": llc_bytes() / (1 << 20),
        "torch": torch.__version__,
        "date": date.today().isoformat(),
        "commit": _commit(),
        "rows": rows,
    }
    text = markdown(result)
    print(text)
    if out_dir is not None:
        folder = Path(out_dir) / f"{result['cpu']}_{result['mcpu']}".replace(" ", "_").replace("/", "_")
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / f"bench-cpu-{result['commit'] or 'local'}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
        stem.with_suffix(".md").write_text(text)
        try:
            plot(result, stem.with_suffix(".png"))
        except ImportError:
            print("matplotlib missing: no plot")
        print(f"wrote {stem}.json/.md")
    return result


def markdown(result: dict[str, Any]) -> str:
    """One table per shape: ms per call and the speedup vs torch bf16 (and vs fp32) per M."""
    rows = result["rows"]
    lines = [
        f"# mxgemm bench, CPU — {result['cpu']} ({result.get('mcpu', '?')}), {result['threads']} threads, "
        f"{result['date']}, "
        f"commit {result['commit']}",
        "",
        f"torch {result['torch']}; activations bf16 (torch_fp32: fp32); cells: ms per call (x speedup vs "
        f"torch bf16 F.linear / vs torch fp32); weights cycled through copies of 2x the "
        f"{result['llc_mb']:.0f} MiB last-level cache; medians of eager calls.",
        "",
    ]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for n, k in dict.fromkeys((r["n"], r["k"]) for r in rows):
        ms = sorted({r["m"] for r in rows if (r["n"], r["k"]) == (n, k)})
        lines += [f"## N={n}, K={k}", "", "| method | " + " | ".join(f"M={m}" for m in ms) + " |"]
        lines.append("|---|" + "---|" * len(ms))
        for meth in methods:
            cells = []
            for m in ms:
                r = next(r for r in rows if (r["n"], r["k"], r["m"], r["method"]) == (n, k, m, meth))
                cells.append(f"{r['ms']:.3g} ({r['vs_bf16']:.2f}x / {r['vs_fp32']:.2f}x)")
            lines.append(f"| {meth} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Speedup vs torch bf16 over M, one panel per shape, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mxgemm.bench import speedup_axes

    rows = result["rows"]
    shapes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.6 * len(shapes), 3.8), squeeze=False)
    for ax, (n, k) in zip(axes[0], shapes, strict=True):
        for meth in dict.fromkeys(r["method"] for r in rows):
            pts = sorted(
                (r["m"], r["vs_bf16"]) for r in rows if (r["n"], r["k"], r["method"]) == (n, k, meth)
            )
            ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=meth)
        speedup_axes(ax, n, k)
    axes[0][0].set_ylabel("speedup vs torch bf16 F.linear")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(
        f"mxgemm on {result['cpu']} ({result['threads']} threads, {result['date']}, {result['commit']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
