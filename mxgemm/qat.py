"""Quantization-aware training: `prepare_qat_` swaps Linears for `FakeQuantLinear`, `convert_qat_`
turns the trained layers into `MxLinear`.

A `FakeQuantLinear` keeps the full-precision master weight (an ordinary Parameter, so any optimizer
trains it) and computes in forward what the converted MxLinear computes: the weight fake-quantized
to the config's format, the input fake-quantized (``config.activations``) or rounded to ``a_dtype``,
the bias in ``a_dtype``, the product accumulated in fp32 and the output rounded to ``a_dtype``.
Gradients pass the roundings straight through (:mod:`mxgemm.fake_quant`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mxgemm.config import MxConfig
from mxgemm.fake_quant import fake_quantize
from mxgemm.module import MxLinear, _set_submodule


class FakeQuantLinear(nn.Linear):
    """``nn.Linear`` whose forward sees its weight (and input) through MX fake quantization.

    Attributes:
        weight: float ``[out_features, in_features]``, the master weight.
        bias: float ``[out_features]`` or None.
        config: the :class:`~mxgemm.config.MxConfig` the layer trains for (and converts to).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        config: MxConfig,
        device=None,
        dtype=None,
    ):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        for what, bs in (("weight", config.block_size), ("activations", _act_block(config))):
            if bs and in_features % bs:
                raise ValueError(
                    f"FakeQuantLinear: in_features={in_features} is not a multiple of the {what}' "
                    f"block_size={bs}"
                )
        self.config = config

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: MxConfig) -> FakeQuantLinear:
        """A FakeQuantLinear sharing ``linear``'s weight and bias Parameters."""
        w = linear.weight
        m = cls(linear.in_features, linear.out_features, False, config=config, device=w.device, dtype=w.dtype)
        m.weight = linear.weight
        m.bias = linear.bias
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        a = c.torch_a_dtype
        w = fake_quantize(
            self.weight,
            c.fmt,
            block_size=c.block_size,
            scale_mode=c.scale_mode,
            rounding=c.rounding,
            generator=c.generator("qat"),
        )
        if c.activations is not None:
            x = fake_quantize(x, c.activations.fmt, **c.activations.kwargs())
        xa = x.to(a).float()
        b = None if self.bias is None else self.bias.to(a).float()
        y = F.linear(xa, w.float(), b)
        return y.to(a).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, config={self.config}"


def _act_block(config: MxConfig) -> int | None:
    return None if config.activations is None else config.activations.block_size


def prepare_qat_(model: nn.Module, config: MxConfig | None = None) -> list[str]:
    """Replace, in place, each ``nn.Linear`` of ``model`` by a :class:`FakeQuantLinear` sharing its
    Parameters (so an optimizer built before or after keeps training them). Layers named in
    ``config.modules_to_not_convert`` or whose in_features is not a multiple of the block sizes are
    kept. Returns the names of the swapped layers."""
    config = config or MxConfig()
    swapped = []
    for name, mod in list(model.named_modules()):
        if type(mod) is not nn.Linear or config.skips(name):
            continue
        if any(bs and mod.in_features % bs for bs in (config.block_size, _act_block(config))):
            continue
        _set_submodule(model, name, FakeQuantLinear.from_linear(mod, config))
        swapped.append(name)
    return swapped


def convert_qat_(model: nn.Module) -> list[str]:
    """Replace, in place, each :class:`FakeQuantLinear` of ``model`` by an :class:`MxLinear` that
    holds its weight quantized with the layer's config; its forward gives the fake-quant layer's
    output (up to the order of the fp32 sums). Returns the names of the converted layers."""
    converted = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, FakeQuantLinear):
            continue
        c = mod.config
        with torch.no_grad():
            plain = nn.Linear(
                mod.in_features,
                mod.out_features,
                mod.bias is not None,
                device=mod.weight.device,
                dtype=mod.weight.dtype,
            )
            plain.weight.copy_(mod.weight)
            if mod.bias is not None:
                plain.bias.copy_(mod.bias)
        new = MxLinear.from_linear(
            plain,
            c.fmt,
            block_size=c.block_size,
            a_dtype=c.a_dtype,
            scale_mode=c.scale_mode,
            rounding=c.rounding,
            activations=c.activations,
            generator=c.generator("qat"),
        )
        _set_submodule(model, name, new)
        converted.append(name)
    return converted
