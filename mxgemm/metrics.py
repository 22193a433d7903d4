"""Error metrics shared by the CLI, the demo and the tests."""

from __future__ import annotations

import math

import torch


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(|ref|² / |ref - approx|²)`` in dB (inf if exact)."""
    ref, approx = ref.double(), approx.double()
    noise = (ref - approx).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)
