"""Decode speed of the main job's model (`mxgemm demo`): greedy tokens/s at batch 1, the model's Linears
as ``nn.Linear`` (the reference) and as ``MxLinear`` per format, in two modes:

- eager: ``model.generate`` with the dynamic KV cache, as the CPU table of :mod:`mxgemm.demo_llm`;
- graph (CUDA only): transformers' static KV cache, the decode step compiled by ``generate`` itself with
  ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (inductor, replayed as a CUDA graph; the
  prefill runs eagerly). One ``StaticCache`` is reset and reused across calls, so its tensors keep their
  addresses and the step is compiled and recorded once. MxLinear traces through its custom op
  ``mxgemm::linear``. A model whose compiled mode fails gets the error's first line instead of a speed.

Timing as the CPU table: the time of ``new_tokens`` tokens less that of the first (which holds the
prefill), after a warm-up that loads the kernels (and compiles and records the graph). On CUDA the
reference and the MxLinear layers run in fp16 (``a_dtype="float16"``); on CPU the model is fp32 and
MxLinear computes in bf16, as in the CPU table.

``mxgemm demo --speed-only`` (:func:`speed_only`) needs neither the GGUF file nor a tokenizer:
SmolLM2-135M-Instruct's architecture comes from ``mxgemm/data/smollm2-135m-config.json`` (the values of
the GGUF's config), with seeded random weights (transformers' init), and the prompt is
:data:`PROMPT_TOKENS` fixed token ids, so the kernels a GPU run needs are known beforehand and can be
built on a machine with nvcc and no GPU (:func:`build_specs`, ``--build-only``).
"""

from __future__ import annotations

import copy
import importlib.resources
import inspect
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from mxgemm.demo import NEW_TOKENS, build_kernels, say

CONFIG_FILE = "smollm2-135m-config.json"  # in mxgemm/data
SPEED_FORMATS = ("mxfp4", "mxfp8_e4m3")  # --speed-only's default
PROMPT_TOKENS = 16  # --speed-only's prompt: fixed token ids, so the prefill's M bucket is known
SEED = 0
GPU_A_DTYPE = "float16"


@dataclass
class SpeedRow:
    """One model's decode speed: ``model`` (the reference, "fp16" or "fp32", or a format), greedy
    tokens/s in eager mode, and in a CUDA graph (None where not run: on CPU, or failed, then
    ``graph_error`` holds the exception's first line)."""

    model: str
    eager: float
    graph: float | None = None
    graph_error: str | None = None


def config(num_layers: int | None = None):
    """SmolLM2-135M-Instruct's ``LlamaConfig`` (package data; ``num_layers`` overrides the 30 layers)."""
    import transformers

    d = json.loads(importlib.resources.files("mxgemm.data").joinpath(CONFIG_FILE).read_text())
    if num_layers is not None:
        d["num_hidden_layers"] = num_layers
    return transformers.AutoConfig.for_model(d.pop("model_type"), **d)


def random_model(num_layers: int | None = None, seed: int = SEED) -> nn.Module:
    """SmolLM2-135M-Instruct's architecture (LlamaForCausalLM, tied embeddings) with random fp32 weights
    from transformers' init (normal, std 0.02; norms 1), seeded: speed only, not a language model."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config(num_layers), dtype=torch.float32)
    return model.eval()


def prompt_ids(vocab_size: int, tokens: int = PROMPT_TOKENS, seed: int = SEED) -> torch.Tensor:
    """Fixed prompt token ids: int64 ``[1, tokens]``, seeded, past the special ids 0–2."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (1, tokens), generator=gen)


def linear_shapes(model: nn.Module) -> set[tuple[int, int]]:
    """``(out_features, in_features)`` of every ``nn.Linear`` that :func:`mxgemm.quantize_` converts
    (all but ``lm_head``)."""
    from mxgemm.config import MxConfig

    skip = MxConfig()
    return {
        (m.out_features, m.in_features)
        for name, m in model.named_modules()
        if type(m) is nn.Linear and not skip.skips(name)
    }


def build_specs(formats: tuple[str, ...], arch: str, prompt_tokens: int = PROMPT_TOKENS) -> list[dict]:
    """The `mxgemm.build` arguments of every CUDA kernel a ``--speed-only`` run on ``arch`` needs: each
    Linear shape but ``lm_head``'s × each format (``"fmt"`` or ``"fmt:scale_mode"``) × the M that
    ``generate`` runs at batch 1 (the prefill's ``prompt_tokens`` rows, then 1 row a token), with
    :data:`GPU_A_DTYPE` activations."""
    import transformers

    from mxgemm.ops import build_args_all

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config())
    lins = [m for m in model.modules() if isinstance(m, nn.Linear)]
    biased = {(m.out_features, m.in_features): m.bias is not None for m in lins}
    specs = [
        spec
        for fmt in formats
        for n, k in sorted(linear_shapes(model))
        for m in (1, prompt_tokens)
        for spec in build_args_all(
            m, fmt=fmt.partition(":")[0], n=n, k=k, a_dtype=GPU_A_DTYPE, bias=biased[n, k], target=arch
        )
    ]
    return list({json.dumps(s, sort_keys=True, default=str): s for s in specs}.values())


def quantized(base: nn.Module, fmt: str, a_dtype: str) -> nn.Module:
    """A copy of ``base`` with every Linear but ``lm_head`` an ``MxLinear`` of ``fmt`` (``"fmt"`` or
    ``"fmt:scale_mode"``) computing in ``a_dtype``, quantized from ``base``'s weights on their device."""
    from mxgemm.config import MxConfig
    from mxgemm.module import quantize_

    model = copy.deepcopy(base)
    name, _, scale_mode = fmt.partition(":")
    quantize_(model, MxConfig(name, scale_mode=scale_mode or "floor", a_dtype=a_dtype))
    return model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _static_cache_kwargs(model: nn.Module, max_len: int) -> dict:
    """``generate`` keyword arguments for the graph mode: one ``StaticCache`` of ``max_len`` positions
    (under the name this transformers gives it: ``cache``, or ``past_key_values`` before 5.2x) and the
    compile settings of transformers' automatic compile of a static-cache generation."""
    import transformers

    cache = transformers.StaticCache(config=model.config, max_cache_len=max_len)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    compile_config = transformers.CompileConfig(fullgraph=True, dynamic=False, mode="reduce-overhead")
    if model.device.type != "cuda":  # transformers compiles on CUDA only unless told (tests, CPU checks)
        compile_config._compile_all_devices = True
    return {name: cache, "compile_config": compile_config}


def decode_speed(
    model: nn.Module, ids: torch.Tensor, new_tokens: int = NEW_TOKENS, graph: bool = False
) -> float:
    """Greedy decode tokens/s of ``model`` on ``ids`` (int64 ``[1, prompt]`` on the model's device): the
    time of ``new_tokens`` tokens less that of the first, eager (dynamic cache) or ``graph`` (static
    cache, compiled decode step), after a warm-up."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be at least 2 (the first token is not timed), got {new_tokens}")
    kwargs = _static_cache_kwargs(model, ids.shape[1] + new_tokens) if graph else {}
    cache = next(iter(kwargs.values()), None)

    def timed(n: int) -> float:
        if cache is not None:
            cache.reset()
        _sync(ids.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                **kwargs,
            )
        _sync(ids.device)
        return time.perf_counter() - t0

    for n in (1, new_tokens, new_tokens) if graph else (1,):  # kernels; compile, record, replay
        timed(n)
    first = timed(1)
    return (new_tokens - 1) / max(timed(new_tokens) - first, 1e-9)


def measure(label: str, model: nn.Module, ids: torch.Tensor, new_tokens: int, graph: bool) -> SpeedRow:
    """A :class:`SpeedRow` for ``model``: eager, then (``graph``) the compiled mode, whose failure is
    recorded in the row rather than raised."""
    say(f"{label}: decode speed, eager")
    row = SpeedRow(label, decode_speed(model, ids, new_tokens))
    if graph:
        say(f"{label}: decode speed, static cache + CUDA graph (compiling)")
        try:
            row.graph = decode_speed(model, ids, new_tokens, graph=True)
        except Exception as e:  # noqa: BLE001 - any compile/capture failure is a result to report
            first = (str(e).strip().splitlines() or [""])[0][:200]
            row.graph_error = f"{type(e).__name__}: {first}"
        finally:
            torch._dynamo.reset()  # drop the compiled step and its graphs with the model
    return row


def speed_table(
    base: nn.Module, ids: torch.Tensor, formats: tuple[str, ...], new_tokens: int = NEW_TOKENS
) -> list[SpeedRow]:
    """Decode speed of ``base`` (fp32 weights, on the device that runs it) as the reference and packed
    in each of ``formats``: fp16 and both modes on CUDA; fp32 (MxLinear in bf16) and eager on CPU."""
    cuda = base.device.type == "cuda"
    dtype, a_dtype = (torch.float16, GPU_A_DTYPE) if cuda else (torch.float32, "bfloat16")
    ids = ids.to(base.device)
    ref = copy.deepcopy(base).to(dtype)
    rows = [measure("fp16" if cuda else "fp32", ref, ids, new_tokens, cuda)]
    del ref
    for i, fmt in enumerate(formats, 1):
        say(f"[{i}/{len(formats)}] {fmt}: quantizing")
        model = quantized(base, fmt, a_dtype)
        model = model.to(dtype) if cuda else model  # CPU: fp32 as is (a bias stays in a_dtype)
        build_kernels(model, (1, ids.shape[1]), fmt)
        rows.append(measure(fmt, model, ids, new_tokens, cuda))
        del model
    return rows


def table(rows: list[SpeedRow], device: torch.device, prompt: int, new_tokens: int, note: str = "") -> str:
    """The rows as text: a header naming the device and the setting, a line per model, the graph
    failures' errors below."""
    cuda = device.type == "cuda"
    where = f"{torch.cuda.get_device_name(device)} (cuda)" if cuda else "cpu"
    dtypes = "fp16 weights and activations" if cuda else "fp32 model, MxLinear in bf16"
    lines = [
        f"SmolLM2-135M-Instruct decode speed on {where}: greedy tokens/s at batch 1, prompt of {prompt} "
        f"tokens, {new_tokens} new tokens (the time of {new_tokens} less that of the first); {dtypes}; "
        "formats: MxLinear in every Linear but lm_head",
        "eager: generate with the dynamic KV cache; graph: static KV cache, decode step under "
        'torch.compile(mode="reduce-overhead", fullgraph=True), replayed as a CUDA graph'
        + ("" if cuda else " (CUDA only: not run here)"),
    ]
    lines += [note] if note else []
    lines.append(f"{'model':<12} {'eager tok/s':>12} {'graph tok/s':>12}")
    for r in rows:
        graph = "failed" if r.graph_error else "–" if r.graph is None else f"{r.graph:.1f}"
        lines.append(f"{r.model:<12} {r.eager:>12.1f} {graph:>12}")
    lines += [f"{r.model} graph failed: {r.graph_error}" for r in rows if r.graph_error]
    return "\n".join(lines)


RANDOM_NOTE = (
    "weights: random (seeded; SmolLM2-135M-Instruct's architecture): speed only, perplexity and answers "
    "need the real weights (mxgemm demo)"
)


def speed_only(
    device: str | None = None,
    formats: tuple[str, ...] = SPEED_FORMATS,
    new_tokens: int = NEW_TOKENS,
    out_dir: Path | None = None,
    num_layers: int | None = None,
) -> list[SpeedRow]:
    """``mxgemm demo --speed-only``: the decode-speed table of SmolLM2-135M-Instruct's architecture with
    random weights (``num_layers`` overrides its 30 layers, for tests), the reference and each of
    ``formats``; prints it, writes it to ``out_dir/demo-speed.{txt,json}`` if given, returns its rows."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda asked for, but torch sees no CUDA GPU")
    say(f"random SmolLM2-135M-Instruct ({CONFIG_FILE}, seed {SEED}) on {dev}")
    base = random_model(num_layers).to(dev)
    ids = prompt_ids(base.config.vocab_size)
    rows = speed_table(base, ids, formats, new_tokens)
    text = table(rows, dev, ids.shape[1], new_tokens, RANDOM_NOTE)
    print(text)
    if out_dir is not None:
        write(out_dir, text, rows, dev)
    return rows


def write(out_dir: Path, text: str, rows: list[SpeedRow], device: torch.device) -> None:
    """``out_dir/demo-speed.txt`` (the table) and ``demo-speed.json`` (rows, device, versions, commit)."""
    import transformers

    from mxgemm.bench import _commit

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "demo-speed.txt").write_text(text + "\n")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = {"device": gpu, "torch": torch.__version__, "transformers": transformers.__version__}
    meta |= {"commit": _commit(), "date": time.strftime("%Y-%m-%d"), "rows": [asdict(r) for r in rows]}
    (out_dir / "demo-speed.json").write_text(json.dumps(meta, indent=1))
    say(f"wrote {out_dir / 'demo-speed.txt'} and {out_dir / 'demo-speed.json'}")
