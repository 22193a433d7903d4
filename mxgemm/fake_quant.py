"""`fake_quantize`: MX/BFP quantize-dequantize, differentiable with a straight-through estimator.

Forward: exactly ``dequantize(quantize(x, ...), x.dtype)`` (:mod:`mxgemm.reference` semantics).
Backward: the gradient passes unchanged where ``|x| <= max_normal * 2**s`` (``s`` the block's shared
exponent: the values the format can hold, rounding included) and is zero where the element saturated
to ±max normal, as a clamp's gradient is. The scale itself gets no gradient (it is a function of the
block maximum, and STE treats the rounding as identity). This is the estimator of QAT libraries
(torchao's MX fake-quant, Brevitas) and keeps the saturated elements from being pushed further out.
"""

from __future__ import annotations

import torch

from mxgemm import formats
from mxgemm.reference import fake_quantize_values


class _FakeQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fmt, block_size, scale_mode, rounding, generator):
        values, clamped = fake_quantize_values(
            x, fmt, block_size=block_size, scale_mode=scale_mode, rounding=rounding, generator=generator
        )
        ctx.save_for_backward(clamped)
        return values

    @staticmethod
    def backward(ctx, grad):
        (clamped,) = ctx.saved_tensors
        return grad.masked_fill(clamped, 0), None, None, None, None, None


def fake_quantize(
    x: torch.Tensor,
    fmt: str | formats.Format,
    *,
    block_size: int | None = None,
    scale_mode: str = "floor",
    rounding: str = "even",
    axis: int = -1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Quantize ``x`` to ``fmt`` in blocks along ``axis`` and back (module docstring: the gradient).

    Args:
        x: float32/float16/bfloat16/float64 tensor, any device; ``x.shape[axis]`` a multiple of
            ``block_size``.
        fmt, block_size, scale_mode, rounding, generator: as in :func:`mxgemm.quantize`.
        axis: the dimension the blocks run along (default the last, K of an activation or a
            ``[N, K]`` weight).

    Returns:
        a tensor of ``x``'s shape and dtype holding the dequantized values.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fake_quantize: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("fake_quantize: x must have at least one dimension")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"fake_quantize: axis={axis} is out of range for x of shape {list(x.shape)}")
    moved = x.movedim(axis, -1)
    y = _FakeQuantize.apply(moved, fmt, block_size, scale_mode, rounding, generator)
    return y.movedim(-1, axis)
