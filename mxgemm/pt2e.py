"""PT2E: :class:`MxQuantizer` for torchao's ``prepare_pt2e`` / ``convert_pt2e`` (the ``[pt2e]`` extra).

The flow on a model captured with ``torch.export.export(model, args).module()``:

- ``prepare_pt2e(gm, MxQuantizer(config))`` annotates every ``aten.linear`` whose weight is a 2-D
  parameter with K a multiple of the block size (and not in ``config.modules_to_not_convert``): its
  weight, and its input when ``config.activations`` is set, each get an observer;
- MX needs no calibration (the scales come from each block's values), so the observers record nothing;
- ``convert_pt2e`` replaces each annotated linear by a call of an :class:`~mxgemm.module.MxLinear`
  made from its weight and bias with ``config`` (the activation observer gives way: MxLinear quantizes
  its input itself), so the converted graph runs the mxgemm op with MxLinear's numerics, bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.observer import ObserverBase
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer

from mxgemm.config import MxConfig

_ANNOTATION = "quantization_annotation"


def _fetch(gm: GraphModule, target: str) -> torch.Tensor:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class _MxObserver(ObserverBase):
    """An observer that only marks a node for :meth:`convert` (MX scales are per block, from the values:
    nothing to observe or calibrate)."""

    def __init__(self, config: MxConfig, dtype=torch.uint8, **spec):  # spec: the QuantizationSpec's fields
        super().__init__(dtype)
        self.config = config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self):
        raise NotImplementedError("MX quantization has no per-tensor qparams")


class MxWeightObserver(_MxObserver):
    """Marks a linear's weight; at convert, turns the linear into an MxLinear."""

    def convert(self, gm: GraphModule, observer: Node) -> None:
        from mxgemm.module import MxLinear

        cfg = self.config
        weight = observer.args[0]
        for lin in list(observer.users):
            x, _, *rest = lin.args
            bias = rest[0] if rest else None
            w = _fetch(gm, weight.target).detach()
            plain = nn.Linear(w.shape[1], w.shape[0], bias is not None, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                plain.weight.copy_(w)
                if bias is not None:
                    plain.bias.copy_(_fetch(gm, bias.target))
            layer = MxLinear.from_linear(
                plain, cfg.fmt, block_size=cfg.block_size, a_dtype=cfg.a_dtype, scale_mode=cfg.scale_mode,
                rounding=cfg.rounding, activations=cfg.activations, generator=cfg.generator(weight.target),
            )  # fmt: skip
            name = weight.target.rpartition(".")[0].replace(".", "_") + "_mx"
            gm.add_submodule(name, layer)
            with gm.graph.inserting_before(lin):
                call = gm.graph.call_module(name, (x,))
            call.meta = dict(lin.meta)
            lin.replace_all_uses_with(call)
            gm.graph.erase_node(lin)
        gm.graph.erase_node(observer)
        for node in (weight, *([] if bias is None else [bias])):
            if not node.users:  # the float weight and bias: now held by the MxLinear only
                gm.graph.erase_node(node)
        gm.delete_all_unused_submodules()
        gm.recompile()


class MxActivationObserver(_MxObserver):
    """Marks a linear's input for quantization; at convert, gives way to the MxLinear that quantizes it."""

    def convert(self, gm: GraphModule, observer: Node) -> None:
        observer.replace_all_uses_with(observer.args[0])
        gm.graph.erase_node(observer)
        gm.recompile()


class MxQuantizer(Quantizer):
    """Annotates linears for MX weights (and activations when ``config.activations`` is set).

    Args:
        config: the :class:`~mxgemm.config.MxConfig` the converted layers get (format, block size,
            scale mode, rounding, activation dtype, activations, modules left in full precision).
    """

    def __init__(self, config: MxConfig):
        super().__init__()
        self.config = config

    def _spec(self, observer: type[ObserverBase]) -> QuantizationSpec:
        return QuantizationSpec(
            dtype=torch.uint8, observer_or_fake_quant_ctr=observer.with_args(config=self.config)
        )

    def annotate(self, model: GraphModule) -> GraphModule:
        cfg = self.config
        for node in model.graph.nodes:
            if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
                continue
            x, w = node.args[:2]
            if not isinstance(w, Node) or w.op != "get_attr" or _ANNOTATION in node.meta:
                continue
            weight = _fetch(model, w.target)
            module = w.target.rpartition(".")[0]
            if weight.dim() != 2 or weight.shape[1] % cfg.block_size or cfg.skips(module):
                continue
            specs = {w: self._spec(MxWeightObserver)}
            if cfg.activations is not None:
                specs[x] = self._spec(MxActivationObserver)
            node.meta[_ANNOTATION] = QuantizationAnnotation(input_qspec_map=specs, _annotated=True)
        return model

    def validate(self, model: GraphModule) -> None:
        pass
