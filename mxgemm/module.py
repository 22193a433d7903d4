"""`MxLinear` (a drop-in `nn.Linear` on MX/BFP weights) and `quantize_` (swap a model's Linears)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from mxgemm import formats, layout, ops, packing, system
from mxgemm.codegen import act_quant
from mxgemm.config import MxActConfig, MxConfig
from mxgemm.fake_quant import fake_quantize
from mxgemm.reference import quantize
from mxgemm.weight import MxWeight

HOT_SHAPES = 64  # input shapes a layer keeps a hot path for (`ops.hot_path`); past that it starts over


class MxLinear(nn.Module):
    """``y = x @ W.T + b`` with W stored as MX/BFP codes + E8M0 scales, run by generated kernels.

    ``state_dict`` (what checkpoints hold, HF naming):
        weight_blocks: uint8 ``[out_features, in_features * bits / 8]``, portable packed layout.
        weight_scales: uint8 ``[out_features, in_features / block_size]``, E8M0.
        bias: ``a_dtype [out_features]`` (only with ``bias=True``).
    In memory the codes are held once, in the kernel layout (:func:`mxgemm.layout.to_planes`): for
    8/4/2-bit formats that is the ``weight_blocks`` buffer itself; 3/5/6/7-bit formats hold
    non-persistent ``weight_plane0``, ``weight_plane1``, ... buffers instead, converted from and to the
    portable ``weight_blocks`` when the state dict is loaded or saved.
    ``forward`` accepts any float ``[..., in_features]``, computes in ``a_dtype`` (fp32 accumulation)
    and returns the input's dtype. CPU inputs run the LLVM kernel, CUDA inputs the CUDA kernel.
    With ``activations`` (:class:`~mxgemm.config.MxActConfig`) the input is first quantized per block
    along K and dequantized (:func:`mxgemm.fake_quantize`), so the layer computes
    ``dequant(q(x)) @ dequant(q(W)).T`` with fp32 accumulation; the dequantized activations are exact
    in bfloat16 for every format (in float16 while they stay within its normal range).
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
        activations: MxActConfig | dict | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self._hot: dict[torch.Size, Callable] = {}  # x.shape -> `ops.hot_path`'s function
        device = system.check_device(device)
        a_name = str(a_dtype).removeprefix("torch.")
        cfg = MxConfig(fmt, block_size, scale_mode, rounding, a_name, [], activations=activations)
        self.activations = cfg.activations
        if self.activations is not None and in_features % self.activations.block_size:
            raise ValueError(
                f"MxLinear: in_features={in_features} is not a multiple of the activations' "
                f"block_size={self.activations.block_size}"
            )
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
        self._bits = f.bits
        widths = layout.plane_widths(f.bits)
        if len(widths) == 1:
            self.register_buffer(
                "weight_blocks", torch.zeros(out_features, packing.packed_len(in_features, f.bits), **u8)
            )
            self._plane_names = ["weight_blocks"]
        else:
            self._plane_names = [f"weight_plane{i}" for i in range(len(widths))]
            for name, w in zip(self._plane_names, widths, strict=True):
                shape = (out_features, packing.packed_len(in_features, w))
                self.register_buffer(name, torch.zeros(shape, **u8), persistent=False)
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
        activations: MxActConfig | dict | None = None,
        generator: torch.Generator | None = None,
    ) -> MxLinear:
        """Quantize an ``nn.Linear``'s weight (reference quantization) into a new MxLinear on its device
        (``generator``: the random source of ``rounding="stochastic"``, on that device; ``activations``:
        see the class docstring)."""
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
            activations=activations,
            device=w.device,
        )
        q = quantize(
            w, fmt, block_size=m.block_size, scale_mode=scale_mode, rounding=rounding, generator=generator
        )
        m.load_weight(q)
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
        self.load_blocks(q.blocks)
        self.weight_scales.copy_(q.scales)

    def load_blocks(self, blocks: torch.Tensor) -> None:
        """Copy portable codes (uint8 ``[out_features, in_features * bits / 8]``) into the planes."""
        new = layout.to_planes(blocks.to(self.weight_scales.device), self._bits)
        for plane, src in zip(self.planes, new, strict=True):
            plane.copy_(src)

    @property
    def planes(self) -> list[torch.Tensor]:
        """The code planes the kernels read (uint8 ``[out_features, in_features * w / 8]`` each)."""
        return [self._buffers[name] for name in self._plane_names]

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._plane_names != ["weight_blocks"]:  # the portable layout, as checkpoints hold it
            destination[prefix + "weight_blocks"] = layout.from_planes(self.planes, self._bits)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected, errors
    ):
        key = prefix + "weight_blocks"
        bad = self._code_mismatches(state_dict, prefix)
        if bad:  # torch would cast floats to uint8 and broadcast misshaped codes: refuse instead
            errors.extend(bad.values())
            state_dict = {k: v for k, v in state_dict.items() if k not in bad}
        if self._plane_names != ["weight_blocks"]:
            if key in state_dict:
                self.load_blocks(state_dict[key])
            elif strict:
                missing_keys.append(key)
            state_dict = {k: v for k, v in state_dict.items() if k != key}
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected, errors
        )
        missing_keys[:] = [k for k in missing_keys if k not in bad]  # reported as mismatches

    def _code_mismatches(self, state_dict: dict[str, torch.Tensor], prefix: str) -> dict[str, str]:
        """key → error message, for the uint8 ``weight_blocks`` (portable layout) and ``weight_scales``
        of ``state_dict`` whose dtype or shape this layer cannot hold."""
        want = {
            prefix + "weight_blocks": (self.out_features, packing.packed_len(self.in_features, self._bits)),
            prefix + "weight_scales": tuple(self.weight_scales.shape),
        }
        bad = {}
        for name, shape in want.items():
            t = state_dict.get(name)
            if t is not None and t.dtype != torch.uint8:
                bad[name] = (
                    f"dtype mismatch for {name}: the checkpoint has {t.dtype}, the model holds torch.uint8"
                )
            elif t is not None and tuple(t.shape) != shape:
                bad[name] = (
                    f"size mismatch for {name}: copying a param with shape {tuple(t.shape)} from checkpoint, "
                    f"the shape in current model is {shape}."
                )
        return bad

    @property
    def weight(self) -> MxWeight:
        """The quantized weight as an :class:`MxWeight` (a view of the buffers for 8/4/2-bit formats,
        the portable layout rebuilt from the planes otherwise)."""
        return MxWeight(
            layout.from_planes(self.planes, self._bits),
            self.weight_scales,
            self.fmt,
            self.block_size,
            (self.out_features, self.in_features),
            self.scale_mode,
            self.rounding,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or type(x) is not torch.Tensor:  # (dynamo: no guard on `_hot`)
            return self._forward(x)
        hot = self._hot.get(x.shape)  # an eager call like an earlier one (`ops.hot_path`)
        if hot is not None:
            y = hot(x, self._buffers)
            if y is not None:
                return y
        y = self._forward(x)
        if x.dtype is self.a_dtype and self.activations is None:
            if len(self._hot) >= HOT_SHAPES:
                self._hot.clear()
            bufs, bias = self._buffers, "bias" if "bias" in self._buffers else None
            held = {
                name: bufs[name] for name in [*self._plane_names, "weight_scales", *([bias] if bias else [])]
            }
            hot = ops.hot_path(x, held, self._plane_names, bias, *self._kernel_args())
            if hot is not None:
                self._hot[x.shape] = hot
        return y

    def _kernel_args(self) -> tuple[str, int, int, int]:
        return self.fmt, self.block_size, self.out_features, self.in_features

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forward call without the hot path: checks, input quantization, the cast to
        :attr:`a_dtype`, :func:`mxgemm.ops.dispatch`, the cast back."""
        if not x.is_floating_point():
            raise TypeError(f"MxLinear: expected a floating-point input, got {x.dtype}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"MxLinear: expected input [..., {self.in_features}], got {list(x.shape)}")
        if self.activations is not None:
            x = self._quantize_input(x)
        bufs = self._buffers  # (directly: nn.Module's lookup of a buffer costs more than these checks)
        y = ops.dispatch(
            x if x.dtype is self.a_dtype else x.to(self.a_dtype),
            [bufs[name] for name in self._plane_names],
            bufs["weight_scales"],
            bufs["bias"] if "bias" in bufs else self.bias,
            *self._kernel_args(),
        )
        return y if y.dtype is x.dtype else y.to(x.dtype)

    def __getstate__(self):
        state = super().__getstate__()
        return {**state, "_hot": {}}  # (closures over this layer's tensors: not to be copied or pickled)

    def __setstate__(self, state):
        super().__setstate__({"_hot": {}, **state})

    def _quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """``dequant(q(x))`` per :attr:`activations`: the generated kernel where it applies
        (:mod:`mxgemm.codegen.act_quant`; straight in eager calls, its custom op where torch traces),
        else :func:`mxgemm.fake_quantize` (which also gives the straight-through gradient); the same
        values."""
        a = self.activations
        kernels = not ops.emulated()
        grad = x.requires_grad and torch.is_grad_enabled()
        if kernels and not grad and act_quant.applies(a.fmt, a.scale_mode, a.rounding, x.dtype):
            run = act_quant.fake_quantize if ops._eager(x) else torch.ops.mxgemm.act_quant
            return run(x, a.fmt, a.block_size, a.rounding)
        return fake_quantize(x, a.fmt, **a.kwargs())

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, "
            f"fmt={self.fmt}, block_size={self.block_size}, scale_mode={self.scale_mode}, "
            f"rounding={self.rounding}, a_dtype={str(self.a_dtype).removeprefix('torch.')}"
            + ("" if self.activations is None else f", activations={self.activations}")
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
                    activations=config.activations,
                    generator=config.generator(f"{name}.weight", mod.weight.device),
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
