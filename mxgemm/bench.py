"""`mxgemm bench`: mxgemm kernels vs cuBLAS (torch F.linear) and the emulated path, on one GPU.

Method: every candidate runs inside a CUDA graph of ``CALLS`` launches that
rotate through enough weight copies to defeat L2; graph replays are timed with CUDA events and the
median replay / CALLS is reported. The same run measures device-to-device copy bandwidth (bytes read +
written per second) and cuBLAS fp16 and bf16, so ratios (against cuBLAS of the activations' dtype)
compare like with like. Results go to ``benchmarks/results/<gpu>/bench.{json,md,png}``.

Kernels are built ahead of time (``--build-only``, any machine with nvcc) into ``$MXGEMM_CACHE_DIR`` so
the GPU box needs only the TVM runtime.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = ((4096, 4096), (11008, 4096), (8192, 8192), (28672, 8192), (8192, 28672))
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)
FORMATS = ("mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mxint8", "bfp8")
L2_DEFEAT_BYTES = 256 << 20  # rotate weight copies until this many bytes are in flight
CALLS = 20  # launches per graph
DECODE_ROWS_FROM = 32  # from this M, also time decode + cuBLAS (mxgemm_decode) wherever a fused kernel runs
REPLAYS = 7
PEERS = ("tinygemm_int4", "gemlite")  # methods of the peers' rows (--peers)
SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def other_dtype(a_dtype: str) -> str:
    """The other activation dtype (the ``twin`` rows of :func:`run`)."""
    return "bfloat16" if a_dtype == "float16" else "float16"


def twin_method(a_dtype: str) -> str:
    """The method of a run's ``twin`` rows: the other dtype's kernels (``mxgemm_bf16`` in a float16 run)."""
    return f"mxgemm_{SHORT[other_dtype(a_dtype)]}"


def build_specs(shapes, ms, fmts, a_dtype: str, arch: str, tuned: bool = True) -> list[dict[str, Any]]:
    """The `mxgemm.build` arguments of every kernel a run needs (what `mxgemm.linear` picks per M, and
    where it splits the rows, what the ``mxgemm_unsplit`` rows run); ``tuned=False``: what it picks
    with the rules' defaults (the ``mxgemm_default`` rows), whose route may differ (no record: the
    ``mma`` kernel where a record says decode + cuBLAS)."""
    from mxgemm.ops import build_args, build_args_all

    decoded = (DECODE_ROWS_FROM,) if max(ms) >= DECODE_ROWS_FROM else ()  # the mxgemm_decode rows' kernel
    layers = [dict(fmt=f, n=n, k=k, a_dtype=a_dtype, target=arch) for f in fmts for n, k in shapes]
    with _tuned(tuned):
        specs = [
            spec
            for layer in layers
            for m in (*ms, *(max(ms + (4096,)),) * bool(decoded))
            for spec in (build_args(m, **layer), *build_args_all(m, **layer))  # unsplit, and as split
        ]
    return list({json.dumps(s, sort_keys=True): s for s in specs}.values())


def build_only(
    specs: list[dict[str, Any]], jobs: int = 2, defaults: list[dict[str, Any]] | None = None
) -> None:
    """Build ``specs`` (tuned hints from the tune logs) and ``defaults`` (:func:`build_specs` with
    ``tuned=False``, built with the rules' default hints) into the kernel cache."""
    from concurrent.futures import ProcessPoolExecutor

    import mxgemm

    t0 = time.perf_counter()
    for tuned, todo in ((True, specs), (False, defaults or [])):
        if not todo:
            continue
        with _tuned(tuned), ProcessPoolExecutor(jobs) as pool:  # workers inherit the setting
            for i, k in enumerate(pool.map(_build_repr, todo)):
                print(f"[{i + 1}/{len(todo)}] {k}", flush=True)
    where = mxgemm.codegen.cache.cache_dir()
    n = len(specs) + len(defaults or [])
    print(f"built {n} kernels in {time.perf_counter() - t0:.0f} s into {where}")


def _tuned(on: bool):
    """Kernels built inside use the tune logs' hints (``on``) or the rules' defaults."""
    return _env("MXGEMM_TUNED", "1" if on else "0")


@contextlib.contextmanager
def _env(name: str, value: str):
    """``$name`` set to ``value`` inside; the per-process kernel and plan memo of `mxgemm.linear` is
    cleared on the way in and out."""
    from mxgemm import ops

    old = os.environ.get(name)
    os.environ[name] = value
    ops.clear_kernels()
    try:
        yield
    finally:
        ops.clear_kernels()
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _build_repr(kw: dict[str, Any]) -> str:
    import mxgemm

    t0 = time.perf_counter()
    try:
        return f"{mxgemm.build(**kw)!r} {time.perf_counter() - t0:.1f}s"
    except Exception as e:  # noqa: BLE001 (report and go on: one failing kernel must not stop the rest)
        return f"FAILED {kw}: {str(e).strip().splitlines()[-1]}"


def _time_graph(calls: list) -> float:
    """Median µs per call of ``calls`` (closures) captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in dict.fromkeys(calls):
            c()  # warm up every distinct call (kernel load, per-weight checks) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    del g
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:  # let the clocks ramp up from idle first
        dst.copy_(src)
        torch.cuda.synchronize()
    us = min(_time_graph([lambda: dst.copy_(src)] * 4) for _ in range(3))
    return 2 * src.numel() / us / 1e6


def _copies(nbytes: int) -> int:
    return max(1, min(64, -(-L2_DEFEAT_BYTES // nbytes)))


def run(
    shapes=SHAPES,
    ms=MS,
    fmts=FORMATS,
    a_dtype: str = "float16",
    out_dir: str | Path = "benchmarks/results",
    emulated: bool = True,
    compare_default: bool = False,
    peers: bool = False,
    twin: bool = False,
) -> dict[str, Any]:
    """Measure everything; write JSON + markdown (+ PNG if matplotlib is there); return the results.
    ``compare_default`` adds ``mxgemm_default`` rows: the same kernels with the rules' default hints
    instead of the tune logs' (the tuned-vs-default gain). ``peers`` adds the peers' rows
    (:func:`_peer_layers`: torch's int4 tinygemm in bf16 runs, GemLite's MX layers where installed).
    ``twin`` adds ``mxgemm_bf16`` (or ``_fp16``) rows: the other activation dtype's kernels, timed
    beside this dtype's on the same weights (after them, or before them every other cell), each row
    against cuBLAS of its own dtype (the markdown's last table: one dtype's time over the other's,
    cell by cell, drift between runs excluded)."""
    import mxgemm
    from mxgemm import ops
    from mxgemm.codegen import target as targets

    dev = torch.device("cuda")
    adt = getattr(torch, a_dtype)
    arch = targets.device_arch()
    copy_tbs = copy_bandwidth()
    rows: list[dict[str, Any]] = []
    partial = Path(out_dir) / "bench.partial.json"  # survives a run cut short
    flips = itertools.count()  # (twin: which dtype goes first)
    for n, k in shapes:
        g = torch.Generator(device="cpu").manual_seed(n + k)
        w = (torch.randn(n, k, generator=g) * 0.02).to(dev)
        dense = {dt: w.to(dt) for dt in (torch.float16, torch.bfloat16)}
        qs = {f: mxgemm.quantize(w, f) for f in fmts}
        others = _peer_layers(dense[adt], fmts, _copies(n * k // 2)) if peers else {}
        for m in ms:
            x = {dt: torch.randn(m, k, device=dev).to(dt) for dt in (torch.float16, torch.bfloat16)}

            def add(method, fmt, us, wbytes, m=m, n=n, k=k):
                rows.append(
                    dict(
                        weight_bytes=wbytes,
                        n=n,
                        k=k,
                        m=m,
                        method=method,
                        fmt=fmt,
                        us=us,
                        tflops=2 * m * n * k / us / 1e6,
                        weight_tbs=wbytes / us / 1e6,
                        pct_copy=100 * wbytes / us / 1e6 / copy_tbs,
                    )
                )

            for dt, name in ((torch.float16, "cublas_fp16"), (torch.bfloat16, "cublas_bf16")):
                ws = [dense[dt]] + [dense[dt].clone() for _ in range(_copies(n * k * 2) - 1)]
                calls = [(lambda wi=wi, xi=x[dt]: torch.nn.functional.linear(xi, wi)) for wi in ws]
                add(name, "fp16" if dt == torch.float16 else "bf16", _time_graph(_cycle(calls)), n * k * 2)
            for f, q in qs.items():
                nbytes = q.nbytes
                cps = [q] + [
                    mxgemm.MxWeight(q.blocks.clone(), q.scales.clone(), q.fmt, q.block_size, q.shape)
                    for _ in range(_copies(nbytes) - 1)
                ]
                calls = [(lambda qi=qi, xi=x[adt]: mxgemm.linear(xi, qi)) for qi in cps]
                timed = [("mxgemm", calls)]
                if twin:  # every other cell the twin first: a drift within the run favours neither dtype
                    odt = getattr(torch, other_dtype(a_dtype))
                    twins = [(lambda qi=qi, xi=x[odt]: mxgemm.linear(xi, qi)) for qi in cps]
                    timed.insert(next(flips) % 2, (twin_method(a_dtype), twins))
                for method, cs in timed:
                    add(method, f, _time_graph(_cycle(cs)), nbytes)
                if len(ops._parts(m, arch, f, n, k, a_dtype, None)) > 1:  # as linear split them: unsplit
                    with _env(ops.SPLIT_ENV, "0"):
                        add("mxgemm_unsplit", f, _time_graph(_cycle(calls)), nbytes)
                if m >= DECODE_ROWS_FROM:
                    add("mxgemm_decode", f, _time_graph(_cycle(_decoded_calls(cps, x[adt]))), nbytes)
                if compare_default:
                    with _tuned(False):
                        add("mxgemm_default", f, _time_graph(_cycle(calls)), nbytes)
                if emulated:  # a few calls only: each materializes the whole dequantized weight
                    calls = [
                        (lambda qi=qi, xi=x[adt]: torch.nn.functional.linear(xi, mxgemm.dequantize(qi, adt)))
                        for qi in cps[:2] * 2
                    ]
                    add("emulated", f, _time_graph(calls), nbytes)
            for (method, label, nbytes), layers in others.items():
                calls = [(lambda layer=layer, xi=x[adt]: layer(xi)) for layer in layers]
                add(method, label, _time_graph(_cycle(calls)), nbytes)
            print(_progress_line(rows, n, k, m), flush=True)
            del x
        del dense, qs, w, others
        torch.cuda.empty_cache()
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"copy_tbs": copy_tbs, "rows": rows}))
    return _write(rows, a_dtype, copy_tbs, out_dir)


def speedups(rows: list[dict[str, Any]], a_dtype: str) -> None:
    """Set each row's ``vs_cublas``: cuBLAS's time of the same shape and M in ``a_dtype`` over the
    row's (a ``twin`` row of :func:`run`: cuBLAS of the other dtype's)."""
    same, other, twin = (
        f"cublas_{SHORT[a_dtype]}",
        f"cublas_{SHORT[other_dtype(a_dtype)]}",
        twin_method(a_dtype),
    )
    base = {(r["method"], r["n"], r["k"], r["m"]): r["us"] for r in rows if r["method"].startswith("cublas")}
    for r in rows:
        vs = other if r["method"] == twin else same
        r["vs_cublas"] = base[(vs, r["n"], r["k"], r["m"])] / r["us"]


def _write(rows: list[dict[str, Any]], a_dtype: str, copy_tbs: float, out_dir: str | Path) -> dict[str, Any]:
    """The run's result (each row's speedup over cuBLAS of the activations' dtype), written as JSON,
    markdown and (with matplotlib) a plot under ``out_dir/<gpu>/``."""
    import mxgemm

    speedups(rows, a_dtype)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "a_dtype": a_dtype,
        "copy_tbs": copy_tbs,
        "torch": torch.__version__,
        "mxgemm": mxgemm.__version__,
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    out = Path(out_dir) / re.sub(r"[^A-Za-z0-9]+", "_", result["gpu"]).strip("_")
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    (out / "bench.md").write_text(markdown(result))
    try:
        plot(result, out / "bench.png")
    except ImportError:
        print("matplotlib missing: no plot (python -m mxgemm.bench --plot bench.json on another machine)")
    print(markdown(result))
    return result


def _peer_layers(w: torch.Tensor, fmts, copies: int) -> dict[tuple[str, str, int], list]:
    """The peers of a ``[n, k]`` fp16/bf16 weight ``w``, each as ``copies`` layers (rotated past L2 like
    the others), keyed (method, format label, weight bytes): torch's int4 tinygemm (group 32, bf16
    only: what torchao's int4 weight-only runs) and, where ``gemlite`` is installed (the ``peers``
    extra), GemLite's MX layer of each format that has one (mxfp4, mxfp8_e4m3). A peer that fails to
    build here is reported and left out."""
    from torch import nn

    from mxgemm import formats, peers

    n, k = w.shape
    lin = nn.Linear(k, n, bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    out: dict[tuple[str, str, int], list] = {}
    if w.dtype == torch.bfloat16:
        try:
            out["tinygemm_int4", "int4 g32", n * k // 2 + n * k // 32 * 4] = [
                peers.Tinygemm(lin) for _ in range(copies)
            ]
        except (RuntimeError, NotImplementedError) as e:
            print(f"tinygemm skipped: {e}")
    for f in fmts:
        if f not in peers.GEMLITE:
            continue
        try:
            layers = peers.gemlite([lin] * copies, f)
        except Exception as e:  # noqa: BLE001 (a peer that fails here is reported, not fatal)
            print(f"gemlite {f} skipped: {type(e).__name__}: {str(e).strip()[-300:]}")
            continue
        if layers is not None:
            nbytes = n * k * formats.get(f).bits // 8 + n * k // 32
            out["gemlite", peers.GEMLITE[f], nbytes] = layers
    return out


def _decoded_calls(qs: list, x: torch.Tensor) -> list:
    """Calls of decode + cuBLAS (``x`` ``[m, k]`` fp16/bf16 @ each weight of ``qs``), what runs where no
    fused kernel does: the alternative to the fused kernels at mid M."""
    from mxgemm import formats, ops

    bits = formats.get(qs[0].fmt).bits
    planes = [ops._planes(q.blocks, bits) for q in qs]
    n, k = qs[0].shape
    return [
        (lambda p=p, q=q: ops._decode_then_cublas(x, p, q.scales, None, q.fmt, q.block_size, n, k))
        for p, q in zip(planes, qs, strict=True)
    ]


def _cycle(calls: list) -> list:
    return [calls[i % len(calls)] for i in range(max(CALLS, len(calls)))]


def _progress_line(rows, n, k, m) -> str:
    cur = [r for r in rows if (r["n"], r["k"], r["m"]) == (n, k, m)]
    return f"{n}x{k} M={m}: " + ", ".join(f"{r['method']}:{r['fmt']} {r['us']:.1f}us" for r in cur)


def _commit() -> str | None:
    """The mxgemm commit: ``$MXGEMM_COMMIT`` (a GPU box gets the tree without .git), else git's HEAD."""
    import os
    import subprocess

    if os.environ.get("MXGEMM_COMMIT"):
        return os.environ["MXGEMM_COMMIT"]

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip() or None
    except OSError:
        return None


def _ratio(row: dict[str, Any]) -> float:
    """A row's speedup over cuBLAS of the run's activation dtype (runs before 2026-11-25: over fp16)."""
    return row["vs_cublas"] if "vs_cublas" in row else row["vs_cublas_fp16"]


def read_roofline(rows: list[dict[str, Any]]) -> float:
    """The run's read roofline (TB/s): the best weight bytes per second of a cuBLAS row (cuBLAS at M=1
    streams its weights faster than the device-to-device copy's figure, which flatters)."""
    return max(r["weight_tbs"] for r in rows if r["method"].startswith("cublas"))


COMPUTE_BOUND_M = 1024  # rows from which cuBLAS runs at its compute roofline on the bench's shapes


def compute_roofline(rows: list[dict[str, Any]]) -> float | None:
    """The run's compute roofline (TFLOP/s): the best of a cuBLAS row at :data:`COMPUTE_BOUND_M` rows
    or more; None if the run has none (its smaller rows stream weights and say nothing of it)."""
    big = [r["tflops"] for r in rows if r["method"].startswith("cublas") and r["m"] >= COMPUTE_BOUND_M]
    return max(big) if big else None


def bound_us(row: dict[str, Any], roof_tbs: float, peak_tflops: float | None) -> float:
    """The time of ``row``'s GEMM at the best rates cuBLAS reaches in the run: its weight bytes at the
    read roofline or (where known) its FLOPs at the compute roofline, whichever takes longer
    (activations and outputs not counted)."""
    flops = 2 * row["m"] * row["n"] * row["k"]
    return max(row["weight_bytes"] / roof_tbs, flops / peak_tflops if peak_tflops else 0.0) / 1e6


def markdown(result: dict[str, Any]) -> str:
    """One table per shape: µs and speedup vs cuBLAS of the activations' dtype per M, and the M=1
    weight stream as % of copy bandwidth and of the read roofline (:func:`read_roofline`); a
    ``bound`` row a format: :func:`bound_us` and the speedup it would be (a kernel of the format
    beats it only by outrunning cuBLAS's best rates)."""
    rows = result["rows"]
    roof, peak = read_roofline(rows), compute_roofline(rows)
    other, twin = other_dtype(result["a_dtype"]), twin_method(result["a_dtype"])
    twins = any(r["method"] == twin for r in rows)
    lines = [
        f"# mxgemm bench — {result['gpu']}, {result['date']}, commit {result['commit']}",
        "",
        f"a_dtype {result['a_dtype']}; d2d copy {result['copy_tbs']:.2f} TB/s (read+write); read roofline "
        f"{roof:.2f} TB/s (cuBLAS's best weight bytes per second in this run); "
        + (f"compute roofline {peak:.0f} TFLOP/s (cuBLAS's best); " if peak else "")
        + f"cells: µs (x speedup vs cuBLAS {result['a_dtype']}"
        + (f"; {twin} rows: the {other} kernels, vs cuBLAS {other}" if twins else "")
        + "); mxgemm_decode: decode + cuBLAS; "
        "mxgemm_unsplit: where mxgemm splits the rows between two kernels, all of them on one; bound: "
        "the format's weight bytes at the read roofline or its FLOPs at the compute roofline, whichever "
        "takes longer (cuBLAS's best rates in the run"
        + ("" if peak else f"; no compute roofline: no cuBLAS row of {COMPUTE_BOUND_M}+ rows")
        + "); L2 defeated by rotating weight copies; CUDA-graph medians.",
        "",
    ]
    methods = sorted({(r["method"], r["fmt"]) for r in rows}, key=lambda t: (t[0] != "cublas_fp16", t))
    for n, k in sorted(
        {(r["n"], r["k"]) for r in rows},
        key=lambda s: rows.index(next(r for r in rows if (r["n"], r["k"]) == s)),
    ):
        ms = sorted({r["m"] for r in rows if (r["n"], r["k"]) == (n, k)})
        lines += [
            f"## N={n}, K={k}",
            "",
            "| method | " + " | ".join(f"M={m}" for m in ms) + " | M=1 % copy BW | M=1 % read roofline |",
            "|---|" + "---|" * (len(ms) + 2),
        ]
        for meth, fmt in methods:
            cells, bounds, pct, pct_roof = [], [], "", ""
            for m in ms:
                r = next(
                    (
                        r
                        for r in rows
                        if (r["n"], r["k"], r["m"], r["method"], r["fmt"]) == (n, k, m, meth, fmt)
                    ),
                    None,
                )
                cells.append("–" if r is None else f"{r['us']:.1f} ({_ratio(r):.2f}x)")
                if meth == "mxgemm" and r is None:
                    bounds.append("–")
                elif meth == "mxgemm":  # the bound: µs and its speedup over the row's cuBLAS
                    us = bound_us(r, roof, peak)
                    bounds.append(f"{us:.1f} ({r['us'] * _ratio(r) / us:.2f}x)")
                if r is not None and m == 1:
                    pct, pct_roof = f"{r['pct_copy']:.0f}%", f"{100 * r['weight_tbs'] / roof:.0f}%"
            lines.append(f"| {meth} {fmt} | " + " | ".join(cells) + f" | {pct} | {pct_roof} |")
            if meth == "mxgemm":
                lines.append(f"| bound {fmt} | " + " | ".join(bounds) + " | | |")
        lines.append("")
    return "\n".join(lines + dtype_table(result))


def dtype_ratios(result: dict[str, Any]) -> dict[tuple[str, int], list[float]]:
    """(format, M) → the bf16 kernels' time over the fp16 ones' on each shape, from a run with
    ``twin`` rows (empty without)."""
    short, twin = SHORT[result["a_dtype"]], twin_method(result["a_dtype"])
    us = {(r["method"], r["fmt"], r["n"], r["k"], r["m"]): r["us"] for r in result["rows"]}
    out: dict[tuple[str, int], list[float]] = {}
    for (meth, fmt, n, k, m), t in us.items():
        if meth == twin and ("mxgemm", fmt, n, k, m) in us:
            ratio = t / us["mxgemm", fmt, n, k, m]
            out.setdefault((fmt, m), []).append(ratio if short == "fp16" else 1 / ratio)
    return out


def dtype_table(result: dict[str, Any]) -> list[str]:
    """Markdown lines: per format and M, the range over shapes of the bf16 time over the fp16 time
    (:func:`dtype_ratios`), and the median and the cells over 1.05x a format."""
    ratios = dtype_ratios(result)
    if not ratios:
        return []
    ms = sorted({m for _, m in ratios})
    lines = [
        "## bf16 kernels' time over fp16's, same run",
        "",
        "Each cell: the range over the shapes; last columns over every cell of the format.",
        "",
        "| format | " + " | ".join(f"M={m}" for m in ms) + " | median | cells > 1.05x |",
        "|---|" + "---|" * (len(ms) + 2),
    ]
    for fmt in sorted({f for f, _ in ratios}):
        cells = [ratios.get((fmt, m), []) for m in ms]
        every = [v for c in cells for v in c]
        text = [f"{min(c):.2f}–{max(c):.2f}" if c else "–" for c in cells]
        over = sum(v > 1.05 for v in every)
        lines.append(
            f"| {fmt} | " + " | ".join(text) + f" | {statistics.median(every):.2f} | {over} of {len(every)} |"
        )
    return [*lines, ""]


def speedup_axes(ax: Any, n: int, k: int) -> None:
    """A panel of speedup over M for the ``[n, k]`` shape: log2 axes and the 1x line."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_title(f"N={n} K={k}")
    ax.set_xlabel("M")


def plot(result: dict[str, Any], path: Path) -> None:
    """Speedup vs cuBLAS (of the activations' dtype) over M, one panel per shape, one line per mxgemm
    format (dashed: the peers'), with the memory roofline of each format (the bytes ratio) where the
    GEMM is memory-bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    shapes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), squeeze=False)
    for ax, (n, k) in zip(axes[0], shapes, strict=True):
        for meth, fmt in sorted(
            {(r["method"], r["fmt"]) for r in rows if r["method"] in ("mxgemm", "cublas_bf16", *PEERS)}
        ):
            pts = sorted(
                (r["m"], _ratio(r))
                for r in rows
                if (r["n"], r["k"], r["method"], r["fmt"]) == (n, k, meth, fmt)
            )
            ls = "--" if meth in PEERS else "-"
            line = ax.plot(*zip(*pts, strict=True), marker="o", ms=3, ls=ls, label=f"{meth} {fmt}")[0]
            if meth == "mxgemm":
                r0 = next(r for r in rows if (r["n"], r["k"], r["method"], r["fmt"]) == (n, k, meth, fmt))
                ax.axhline(n * k * 2 / r0["weight_bytes"], color=line.get_color(), ls=":", lw=0.8)
        speedup_axes(ax, n, k)
    axes[0][0].set_ylabel("speedup vs cuBLAS (dotted: bytes roofline)")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(f"mxgemm {result['a_dtype']} on {result['gpu']} ({result['date']}, {result['commit']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--report":  # redo bench.md and bench.png from bench.json
        p = Path(sys.argv[2])
        res = json.loads(p.read_text())
        p.with_suffix(".md").write_text(markdown(res))
        plot(res, p.with_suffix(".png"))
