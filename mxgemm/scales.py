"""The shared E8M0 block scale: choosing it (scale modes) and turning codes into factors.

An E8M0 code ``c`` is the power of two ``2**(c - 127)`` for ``c`` in 0..254 and NaN for 255
(ml_dtypes ``float8_e8m0fnu``). Shared exponents are clamped to [-127, 127].
"""

from __future__ import annotations

import torch

from mxgemm import options
from mxgemm.formats import Format

SCALE_MODES = options.SCALE_MODES
E8M0_BIAS = 127
E8M0_NAN = 255
MIN_EXP, MAX_EXP = -127, 127


def check_scale_mode(scale_mode: str) -> str:
    """``scale_mode`` validated."""
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {scale_mode!r}")
    return scale_mode


def shared_exponents(amax: torch.Tensor, fmt: Format, scale_mode: str) -> torch.Tensor:
    """Per-block shared exponents (int32, clamped to [-127, 127]) from block maxima.

    Args:
        amax: float64 tensor of per-block max |x|, finite and ≥ 0 (non-finite blocks are handled
            by the caller); all-zero blocks get -127.
        fmt: element format.
        scale_mode: ``"floor"``: ``floor(log2(amax)) - emax`` (OCP MX v1.0 §6.3, microxcaling);
            ``"rceil"``: ``ceil(log2(amax / max_normal))``, the smallest power of two that keeps
            every element within max normal (NVIDIA), evaluated exactly; ``"even"``: floor's rule on
            amax first rounded (ties away) to the element's mantissa width, so a block whose maximum
            would round up to the next binade takes the next scale (torchao EVEN, compressed-tensors);
            ``"ceil"``: ``ceil(log2(amax)) - emax`` (torchao CEIL). ``"mse"`` starts from floor (the
            choice among neighbours is :func:`mxgemm.reference.quantize`'s, which sees the data).
    """
    mant, e2 = torch.frexp(amax)  # amax = mant * 2**e2, mant in [0.5, 1)
    if scale_mode in ("floor", "mse"):
        exp = e2 - 1 - fmt.emax
    elif scale_mode == "even":  # mantissa 2 mant in [1, 2) rounds up to 2 at 2 - 2**-(width + 1)
        exp = e2 - 1 - fmt.emax + (mant >= 1 - 2.0 ** -(_mantissa_width(fmt) + 2)).to(e2.dtype)
    elif scale_mode == "ceil":
        exp = e2 - 1 - fmt.emax + (mant > 0.5).to(e2.dtype)
    else:
        # smallest s with amax <= max_normal * 2**s; both sides exact in float64.
        mmax, emx = torch.frexp(torch.tensor(fmt.max_normal, dtype=torch.float64))
        exp = e2 - int(emx) + (mant > mmax).to(e2.dtype)
    exp = torch.where(amax == 0, torch.full_like(exp, MIN_EXP), exp)
    return exp.clamp(MIN_EXP, MAX_EXP).to(torch.int32)


def _mantissa_width(fmt: Format) -> int:
    """Fraction bits of the element grid's top binade: a float's mantissa bits; an integer's
    ``bits - 2`` (its values are ``q * 2**-(bits-2)``, below 2)."""
    return fmt.mbits if fmt.kind == "float" else fmt.bits - 2


def scale_factors(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 codes (any shape) → float32 factors ``2**(c-127)`` (exact; 255 → NaN).

    The code is shifted into the float32 exponent field; code 0 (2**-127, a float32 subnormal)
    and code 255 are special-cased.
    """
    c = codes.to(torch.int32)
    bits = torch.where(c == 0, 0x00400000, torch.where(c == E8M0_NAN, 0x7FC00000, c << 23))
    return bits.view(torch.float32)
