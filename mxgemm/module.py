"""`MxLinear` (a drop-in `nn.Linear` on MX/BFP weights) and `quantize_` (swap a model's Linears)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from mxgemm import formats, ops, packing
from mxgemm.config import MxConfig
from mxgemm.reference import quantize
from mxgemm.weight import MxWeight


class MxLinear(nn.Module):
    """``y = x @ W.T + b`` with W stored as MX/BFP codes + E8M0 scales, run by generated kernels.

    Buffers (what ``state_dict`` and checkpoints hold, HF naming):
        weight_blocks: uint8 ``[out_features, in_features * bits / 8]``, portable packed layout.
        weight_scales: uint8 ``[out_features, in_features / block_size]``, E8M0.
        bias: ``a_dtype [out_features]`` (only with ``bias=True``).
    ``forward`` accepts any float ``[..., in_features]``, computes in ``a_dtype`` (fp32 accumulation)
    and returns the input's dtype. CPU inputs run the LLVM kernel, CUDA inputs the CUDA kernel.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        fmt: str = "mxfp4",
        block_size: int | None = None,
        a_dtype: torch.dtype | str = torch.float16,
        scale_mode: str = "floor",
        rounding: str = "even",
        device: torch.device | str | None = None,
    ):
        super().__init__()
        cfg = MxConfig(fmt, block_size, scale_mode, rounding, str(a_dtype).removeprefix("torch."), [])
        f = formats.get(fmt)
        if in_features % cfg.block_size:
            raise ValueError(
                f"MxLinear: in_features={in_features} is not a multiple of block_size={cfg.block_size}"
            )
        self.in_features, self.out_features = in_features, out_features
        self.fmt, self.block_size = f.name, cfg.block_size
        self.scale_mode, self.rounding = scale_mode, rounding
        self.a_dtype = cfg.torch_a_dtype
        u8 = dict(dtype=torch.uint8, device=device)
        self.register_buffer(
            "weight_blocks", torch.zeros(out_features, packing.packed_len(in_features, f.bits), **u8)
        )
        self.register_buffer("weight_scales", torch.zeros(out_features, in_features // cfg.block_size, **u8))
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=self.a_dtype, device=device))
        else:
            self.bias = None

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        fmt: str = "mxfp4",
        *,
        block_size: int | None = None,
        a_dtype: torch.dtype | str = torch.float16,
        scale_mode: str = "floor",
        rounding: str = "even",
    ) -> MxLinear:
        """Quantize an ``nn.Linear``'s weight (reference quantization) into a new MxLinear on its device."""
        w = linear.weight.detach()
        m = cls(
            linear.in_features,
            linear.out_features,
            linear.bias is not None,
            fmt=fmt,
            block_size=block_size,
            a_dtype=a_dtype,
            scale_mode=scale_mode,
            rounding=rounding,
            device=w.device,
        )
        m.load_weight(quantize(w, fmt, block_size=m.block_size, scale_mode=scale_mode, rounding=rounding))
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach())
        return m

    def load_weight(self, q: MxWeight) -> None:
        """Copy a quantized ``[out_features, in_features]`` weight into the buffers."""
        want = (self.out_features, self.in_features)
        if q.fmt != self.fmt or q.block_size != self.block_size or tuple(q.shape) != want:
            raise ValueError(
                f"MxLinear({self.fmt}, block {self.block_size}, {list(want)}) cannot hold an MxWeight "
                f"({q.fmt}, block {q.block_size}, {list(q.shape)})"
            )
        if self.a_dtype == torch.float16:
            ops.check_fp16_range(q)
        self.weight_blocks.copy_(q.blocks)
        self.weight_scales.copy_(q.scales)

    @property
    def weight(self) -> MxWeight:
        """The quantized weight as an :class:`MxWeight` (a view of the buffers)."""
        return MxWeight(
            self.weight_blocks,
            self.weight_scales,
            self.fmt,
            self.block_size,
            (self.out_features, self.in_features),
            self.scale_mode,
            self.rounding,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"MxLinear: expected input [..., {self.in_features}], got {list(x.shape)}")
        y = torch.ops.mxgemm.linear(
            x.to(self.a_dtype),
            self.weight_blocks,
            self.weight_scales,
            self.bias,
            self.fmt,
            self.block_size,
            self.out_features,
            self.in_features,
        )
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, "
            f"fmt={self.fmt}, block_size={self.block_size}, scale_mode={self.scale_mode}, "
            f"rounding={self.rounding}, a_dtype={str(self.a_dtype).removeprefix('torch.')}"
        )


@dataclass
class QuantizeSummary:
    """What :func:`quantize_` did: converted layer names, and those left alone with the reason."""

    converted: list[str] = field(default_factory=list)
    not_divisible: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"converted {len(self.converted)} Linear layers; left {len(self.excluded)} excluded by config/"
            f"filter and {len(self.not_divisible)} whose in_features is not a multiple of the block"
        )


def quantize_(
    model: nn.Module,
    config: MxConfig | None = None,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> QuantizeSummary:
    """Replace, in place, every ``nn.Linear`` of ``model`` by an :class:`MxLinear` per ``config``.

    Layers named in ``config.modules_to_not_convert`` (default ``["lm_head"]``) or rejected by
    ``filter_fn(module, name)`` are kept; so are layers whose in_features is not a multiple of the
    block size (with one warning listing them).
    """
    config = config or MxConfig()
    summary = QuantizeSummary()
    for name, mod in list(model.named_modules()):
        if type(mod) is not nn.Linear:
            continue
        if config.skips(name) or (filter_fn is not None and not filter_fn(mod, name)):
            summary.excluded.append(name)
        elif mod.in_features % config.block_size:
            summary.not_divisible.append(name)
        else:
            try:
                new = MxLinear.from_linear(
                    mod,
                    config.fmt,
                    block_size=config.block_size,
                    a_dtype=config.a_dtype,
                    scale_mode=config.scale_mode,
                    rounding=config.rounding,
                )
            except ValueError as e:
                raise ValueError(f"quantize_: layer {name!r}: {e}") from None
            _set_submodule(model, name, new)
            summary.converted.append(name)
    if summary.not_divisible:
        warnings.warn(
            f"quantize_: kept {len(summary.not_divisible)} Linear layers in full precision because their "
            f"in_features is not a multiple of block_size={config.block_size}: "
            f"{', '.join(summary.not_divisible)}",
            stacklevel=2,
        )
    return summary


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)
