"""Hugging Face loading: ``quant_method: "mxgemm"`` registered with transformers.

After ``import mxgemm``, ``transformers.AutoModelFor*.from_pretrained(packed_dir)`` (a directory written
by ``mxgemm pack`` or :func:`mxgemm.save_quantized`) gives a model whose quantized Linears are
:class:`~mxgemm.module.MxLinear`, through transformers' public registration API
(``register_quantization_config``, ``register_quantizer``). Importing transformers' quantizers takes
seconds, so ``import mxgemm`` does not: :mod:`mxgemm.hf_hook` calls :func:`register` at once if
transformers has loaded them already, else right after it does.

Loading goes in two steps: before the weights, each Linear that :func:`mxgemm.quantize_` would convert
becomes a :class:`_Slot` holding the checkpoint's tensors as they are stored (``weight_blocks`` uint8
``[N, K*bits/8]``, ``weight_scales`` uint8 ``[N, K/block]``, ``bias``); after them, each slot becomes
an MxLinear (its kernel layout derived from the loaded blocks).
"""

from __future__ import annotations

import torch
from torch import nn

from mxgemm import packing
from mxgemm.config import QUANT_METHOD, MxConfig


class _Slot(nn.Module):
    """A quantized Linear's checkpoint tensors while transformers loads them."""

    def __init__(self, linear: nn.Linear, config: MxConfig):
        super().__init__()
        from mxgemm import formats

        n, k = linear.out_features, linear.in_features
        bits = formats.get(config.fmt).bits
        dev = linear.weight.device
        self.register_buffer(
            "weight_blocks", torch.empty(n, packing.packed_len(k, bits), dtype=torch.uint8, device=dev)
        )
        self.register_buffer(
            "weight_scales", torch.empty(n, k // config.block_size, dtype=torch.uint8, device=dev)
        )
        self.bias = (
            None if linear.bias is None else nn.Parameter(torch.empty_like(linear.bias), requires_grad=False)
        )
        self.in_features, self.out_features = k, n


def _linears(model: nn.Module, config: MxConfig, kind: type) -> list[tuple[str, nn.Module]]:
    """The modules of type ``kind`` that :func:`mxgemm.quantize_` converts under ``config``."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if type(mod) is kind and not config.skips(name) and mod.in_features % config.block_size == 0
    ]


def _define():
    """The config and quantizer classes (transformers is imported by then)."""
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin

    from mxgemm.module import MxLinear, _set_submodule

    class MxgemmConfig(QuantizationConfigMixin):
        """``quantization_config`` of an mxgemm-packed model (:meth:`mxgemm.MxConfig.to_dict`)."""

        def __init__(self, **kwargs):
            self.quant_method = QUANT_METHOD
            self.entries = {**kwargs, "quant_method": QUANT_METHOD}
            self.mx = MxConfig.from_dict(self.entries)  # a clear ValueError on a bad entry

        def to_dict(self):
            return dict(self.entries)

    class MxgemmQuantizer(HfQuantizer):
        """Loads mxgemm-packed checkpoints (pre-quantized only: pack with ``mxgemm pack``)."""

        requires_calibration = True

        def _process_model_before_weight_loading(self, model, **kwargs):
            cfg = self.quantization_config.mx
            for name, mod in _linears(model, cfg, nn.Linear):
                _set_submodule(model, name, _Slot(mod, cfg))
            return model

        def _process_model_after_weight_loading(self, model, **kwargs):
            cfg = self.quantization_config.mx
            slots = _linears(model, cfg, _Slot)
            missing = [  # transformers fills a missing tensor with whatever memory held, and says so in a log
                f"{name}.{key}"
                for name, slot in slots
                for key, t in (*slot.named_buffers(), *slot.named_parameters())
                if not getattr(t, "_is_hf_initialized", False)
            ]
            if missing:
                from mxgemm.checkpoint import CheckpointError

                raise CheckpointError(
                    f"the checkpoint lacks tensor(s) {', '.join(missing[:10])}"
                    + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
                )
            for name, slot in slots:
                dev = slot.weight_scales.device
                new = MxLinear(
                    slot.in_features, slot.out_features, slot.bias is not None, fmt=cfg.fmt,
                    block_size=cfg.block_size, a_dtype=cfg.a_dtype, scale_mode=cfg.scale_mode,
                    rounding=cfg.rounding, activations=cfg.activations,
                ).to(dev)  # fmt: skip
                with torch.no_grad():
                    new.load_blocks(slot.weight_blocks)
                    new.weight_scales.copy_(slot.weight_scales)
                    if slot.bias is not None:
                        new.bias.copy_(slot.bias)
                _set_submodule(model, name, new.eval())
            return model

        def is_serializable(self, safe_serialization=None):
            return True  # MxLinear's state dict is the portable layout the checkpoint holds

        @property
        def is_trainable(self):
            return False

    return MxgemmConfig, MxgemmQuantizer


def register() -> None:
    """Register ``quant_method: "mxgemm"`` with transformers (imports its quantizers; idempotent)."""
    from transformers.quantizers import auto

    if QUANT_METHOD in auto.AUTO_QUANTIZER_MAPPING:
        return
    config_cls, quantizer_cls = _define()
    auto.register_quantization_config(QUANT_METHOD)(config_cls)
    auto.register_quantizer(QUANT_METHOD)(quantizer_cls)
