"""`mxgemm bench --stack`: what a user's model sees — a stack of decoder projections as `MxLinear`
against the same stack as ``nn.Linear``, in eager mode, in a CUDA graph and under
``torch.compile(mode="reduce-overhead")``, fp16 and bf16, over M.

The stack is two decoder layers' seven projections (q, k, v, o, gate, up, down: 14 calls a step) of a
model of :data:`MODELS`: Llama-3-8B by default (436 M weights, 870 MB in 16 bits, so L2 holds none of
it between calls), or Qwen2.5-7B (q, k and v with a bias) or Llama-2-13B, models of other widths
(tuned since 2026-11-30 at 1-256 rows; before, their layers borrowed the nearest tuned shape's
record: :mod:`mxgemm.nearest`). A step
runs them as a model does (:func:`_decoder_step`): one input, the hidden state ``[m, hidden]``, that
q, k, v, gate and up read; o reads q's output (in place of attention's), down ``silu(gate) · up``,
and the next layer reads ``h + o + down``. Every mode runs that one function: eager steps timed back to
back with CUDA events (the host path counts; the methods in turns, as the host's speed drifts), graph
steps as one captured step replayed, and under ``torch.compile`` the whole step one graph whose only
input is the hidden state (a step that fed each layer an input of its own made the compiled rows time
torch's copies of 14 inputs into the graph's, which no model has). Peers, when they run here: torch's
int4 tinygemm (bf16, group 32, what torchao's int4 weight-only uses) and, where ``gemlite`` is installed
(the ``peers`` extra), GemLite's MX layer of the same format (mxfp4: ``A16W4_MXFP``, mxfp8_e4m3:
``A16W8_MXFP``; it autotunes its Triton kernels on each M's first call, in the warm-up). Results go to
``benchmarks/results/<gpu>/stack.{json,md}``.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Model:
    """A decoder's projection widths: ``hidden`` (the model's width), ``inter`` (the MLP's), ``kv``
    (k's and v's outputs: KV heads × head size); ``qkv_bias``: q, k and v add a bias."""

    name: str
    hidden: int
    inter: int
    kv: int
    qkv_bias: bool = False

    def proj(self) -> tuple[tuple[str, int, int, bool], ...]:
        """``(name, in_features, out_features, bias)`` of a layer's seven projections, in call order."""
        h, b = self.hidden, self.qkv_bias
        attn = (("q", h, h, b), ("k", h, self.kv, b), ("v", h, self.kv, b), ("o", h, h, False))
        mlp = (("gate", h, self.inter, False), ("up", h, self.inter, False), ("down", self.inter, h, False))
        return (*attn, *mlp)


MODELS = {
    "llama-3-8b": Model("Llama-3-8B", 4096, 14336, 1024),  # 32 heads, 8 KV heads of 128
    "qwen2.5-7b": Model("Qwen2.5-7B", 3584, 18944, 512, qkv_bias=True),  # 28 heads, 4 KV heads of 128
    "llama-2-13b": Model("Llama-2-13B", 5120, 13824, 5120),  # 40 heads of 128, no GQA
}
PROJECTIONS = 7  # a decoder layer's: q, k, v, o, gate, up, down
HOST_SHAPE = (1024, 4096)  # (n, k) of the layer whose eager calls :func:`host_cost` times
LAYERS = 2
MS = (1, 4, 16, 32, 64, 128, 256, 1024)
DTYPES = ("float16", "bfloat16")
STEPS = 20  # eager steps per timing; graph replays per timing
COMPILED_MS = (1, 16, 256)  # M of the torch.compile(mode="reduce-overhead") rows (each compiles anew)
REPEATS = 5


def model(name: str) -> Model:
    """The :data:`MODELS` entry ``name``; ValueError naming the choices."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    return MODELS[name]


def shapes(model_name: str = "llama-3-8b") -> list[tuple[int, int, bool]]:
    """``(in_features, out_features, bias)`` of every layer of the stack of ``model_name``
    (:data:`MODELS`), in call order."""
    return [(i, o, b) for _ in range(LAYERS) for _, i, o, b in model(model_name).proj()]


def build_specs(
    fmt: str, arch: str, ms=MS, dtypes=DTYPES, model_name: str = "llama-3-8b"
) -> list[dict[str, Any]]:
    """The `mxgemm.build` arguments of every kernel the stack of ``model_name`` runs (for
    ``--build-only``)."""
    from mxgemm.ops import build_args_all

    specs = [
        spec
        for i, o, b in set(shapes(model_name))
        for m in ms
        for dt in dtypes
        for spec in build_args_all(m, fmt=fmt, n=o, k=i, a_dtype=dt, bias=b, target=arch)
    ]
    n, k = HOST_SHAPE  # (:func:`host_cost`'s layer, one row, both dtypes)
    specs += [build_args_all(1, fmt=fmt, n=n, k=k, a_dtype=dt, target=arch)[0] for dt in DTYPES]
    return list({json.dumps(s, sort_keys=True): s for s in specs}.values())


def _time(step, graph: bool) -> float:
    """Median µs per step: eager steps back to back, or one captured step replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()  # loads kernels and runs first-call checks outside any capture
    torch.cuda.current_stream().wait_stream(s)
    run = step
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
    torch.cuda.synchronize()
    return statistics.median(_steps_us(run) for _ in range(REPEATS))


def _time_eager(steps: dict[str, Any]) -> dict[str, float]:
    """Median µs per eager step of each of ``steps`` (name -> step), timed in turns: each of
    ``REPEATS`` rounds times every step once, so a change in the host's speed during the run (eager
    steps are host-bound at few rows) weighs on all of them alike."""
    for step in steps.values():
        for _ in range(3):
            step()  # loads kernels and runs first-call checks
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(REPEATS):
        for name, step in steps.items():
            times[name].append(_steps_us(step))
    return {name: statistics.median(t) for name, t in times.items()}


def _steps_us(run) -> float:
    """µs per call of ``STEPS`` back-to-back ``run()``, timed with CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(STEPS):
        run()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / STEPS


def host_cost(
    fmt: str = "mxfp4", n: int = HOST_SHAPE[0], k: int = HOST_SHAPE[1], calls: int = 200
) -> dict[str, float]:
    """Wall µs per call of ``calls`` back-to-back eager calls at M=1 on an ``[n, k]`` layer (small
    enough that the GPU keeps up, so this is the host path): nn.Linear, `mxgemm.linear`, MxLinear."""
    import mxgemm

    dev = torch.device("cuda")
    out = {}
    for dt in (torch.float16, torch.bfloat16):
        lin = nn.Linear(k, n, bias=False, device=dev, dtype=dt)
        mx = mxgemm.MxLinear.from_linear(lin, fmt, a_dtype=dt)
        x = torch.randn(1, k, device=dev, dtype=dt)
        fns = {
            "nn.Linear": lin,
            "mxgemm.linear": functools.partial(mxgemm.linear, w=mx.weight),
            "MxLinear": mx,
        }
        for name, fn in fns.items():
            out[f"{name} {str(dt).removeprefix('torch.')}"] = _per_call(fn, x, calls)
    return out


def _per_call(fn, x: torch.Tensor, calls: int) -> float:
    """Best of ``REPEATS`` wall µs per call of ``calls`` back-to-back ``fn(x)``, the GPU drained."""
    fn(x)
    best = float("inf")
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def _decoder_step(layers: list[nn.Module], h: torch.Tensor) -> list[torch.Tensor]:
    """One step of the stack as a model runs it. ``layers``: :func:`shapes`' order, 7 a decoder layer
    (q, k, v, o, gate, up, down); ``h``: the hidden state ``[m, hidden]``. Returns the last hidden
    state and each layer's k and v outputs (so no projection is dead code to a compiler)."""
    kv = []
    for i in range(0, len(layers), PROJECTIONS):
        q, k, v, o, gate, up, down = layers[i : i + PROJECTIONS]
        kv += [k(h), v(h)]
        h = h + o(q(h)) + down(nn.functional.silu(gate(h)) * up(h))
    return [h, *kv]


def _step(layers: list[nn.Module], x: torch.Tensor):
    """One eager step of the stack on the hidden state ``x`` (:func:`_decoder_step`)."""
    return lambda: _decoder_step(layers, x)


class _Step(nn.Module):
    """The stack as one module (:func:`_decoder_step`)."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, h: torch.Tensor) -> list[torch.Tensor]:
        return _decoder_step(list(self.layers), h)


def _compiled(layers: list[nn.Module], x: torch.Tensor):
    """A step of the stack under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (inductor
    with CUDA graphs: what users run to cut host time), compiled and recorded before it is timed."""
    step = torch.compile(_Step(layers), mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            step(x)

    def run():
        with torch.no_grad():
            return step(x)

    return run


def run(
    fmt: str = "mxfp4",
    ms=MS,
    dtypes=DTYPES,
    out_dir: str | Path = "benchmarks/results",
    model_name: str = "llama-3-8b",
) -> dict:
    """Measure the stack of ``model_name`` (:data:`MODELS`): nn.Linear, MxLinear (and peers) ×
    eager/graph × dtype × M; write results."""
    import mxgemm
    from mxgemm import peers
    from mxgemm.bench import _commit

    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers_of = model(model_name)  # (an unknown name fails here, before any timing)
    host = host_cost(fmt)
    for name, us in host.items():
        print(f"host cost per call, {name}: {us:.1f} us", flush=True)
    rows = []
    for dt_name in dtypes:
        dt = getattr(torch, dt_name)
        dense = [nn.Linear(i, o, bias=b, device=dev, dtype=dt) for i, o, b in shapes(model_name)]
        stacks = {"nn.Linear": dense}
        stacks["mxgemm"] = [mxgemm.MxLinear.from_linear(lin, fmt, a_dtype=dt) for lin in dense]
        if dt == torch.bfloat16:
            try:
                stacks["tinygemm_int4"] = [peers.Tinygemm(lin) for lin in dense]
            except (RuntimeError, NotImplementedError) as e:
                print(f"tinygemm skipped: {e}")
        try:
            peer = peers.gemlite(dense, fmt)
        except Exception as e:  # noqa: BLE001 (a peer that fails here is reported, not fatal)
            peer = None
            print(f"gemlite skipped: {type(e).__name__}: {str(e).strip()[-300:]}")
        if peer is not None:
            stacks[f"gemlite_{fmt}"] = peer
        for m in ms:
            x = torch.randn(m, layers_of.hidden, device=dev, dtype=dt)
            steps = {name: _step(layers, x) for name, layers in stacks.items()}
            eager = _time_eager(steps)
            base: dict[str, float] = {}
            for name, layers in stacks.items():
                modes = {"eager": None, "graph": None}
                if m in COMPILED_MS and name in ("nn.Linear", "mxgemm"):
                    modes["compiled"] = _compiled(layers, x)
                for mode, compiled in modes.items():
                    us = eager[name] if mode == "eager" else _time(compiled or steps[name], mode == "graph")
                    speedup = base.setdefault(mode, us) / us  # nn.Linear comes first
                    rows.append(dict(method=name, dtype=dt_name, m=m, mode=mode, us=us, speedup=speedup))
                    print(f"{dt_name} M={m} {mode:5} {name:14} {us:9.1f} us  {speedup:5.2f}x", flush=True)
            del x
            partial = Path(out_dir) / "stack.partial.json"  # survives a run cut short
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"host_us": host, "rows": rows}))
        del stacks, dense
        torch.cuda.empty_cache()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "fmt": fmt,
        "layers": f"{LAYERS} {layers_of.name} decoder layers, 7 projections each",
        "torch": torch.__version__,
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d"),
        "host_us": host,
        "rows": rows,
    }
    out = Path(out_dir) / re.sub(r"[^A-Za-z0-9]+", "_", result["gpu"]).strip("_")
    out.mkdir(parents=True, exist_ok=True)
    (out / "stack.json").write_text(json.dumps(result, indent=1))
    (out / "stack.md").write_text(markdown(result))
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    """Speedup over nn.Linear of the same dtype and mode, a row per method × dtype × mode, M across."""
    rows = result["rows"]
    ms = sorted({r["m"] for r in rows})
    head = [
        f"# Stack: {result['layers']}, {result['fmt']} — {result['gpu']}, {result['date']}, "
        f"commit {result['commit']}, torch {result['torch']}",
        "",
        "Speedup over `nn.Linear` in the same dtype and mode (time per step in µs in brackets).",
        "",
        "| method | dtype | mode | " + " | ".join(f"M={m}" for m in ms) + " |",
        "|---|---|---|" + "---|" * len(ms),
    ]
    keys = dict.fromkeys((r["method"], r["dtype"], r["mode"]) for r in rows)
    for key in keys:
        cell = {r["m"]: r for r in rows if (r["method"], r["dtype"], r["mode"]) == key}
        vals = [f"{cell[m]['speedup']:.2f}x ({cell[m]['us']:.0f})" if m in cell else "–" for m in ms]
        head.append("| " + " | ".join(key) + " | " + " | ".join(vals) + " |")
    host = result.get("host_us", {})
    if host:
        head += ["", "Host cost per eager call (200 back-to-back calls, 1024×4096, M=1, µs):", ""]
        head += [f"- {name}: {us:.1f}" for name, us in host.items()]
    return "\n".join(head) + "\n"
