"""`mxgemm.pt2e.MxQuantizer` in torchao's PT2E flow (export → prepare_pt2e → calibrate → convert_pt2e):
the converted graph calls MxLinear for each annotated linear and computes what `quantize_` gives, bit
for bit, with and without quantized activations; layers left out stay float; it exports again with
the mxgemm op in it."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("torchao", reason="the PT2E flow needs the [pt2e] extra")

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

import mxgemm  # noqa: E402
from mxgemm import MxLinear  # noqa: E402
from mxgemm.pt2e import MxQuantizer  # noqa: E402


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 128)
        self.down = torch.nn.Linear(128, 64, bias=False)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.down(torch.nn.functional.gelu(self.up(x))))


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "bfp8"])
@pytest.mark.parametrize("activations", [None, "mxfp8_e4m3"])
def test_convert_pt2e_equals_quantize_(fmt, activations):
    torch.manual_seed(0)
    net = _Net().eval()
    acts = None if activations is None else mxgemm.MxActConfig(activations)
    cfg = mxgemm.MxConfig(fmt, activations=acts, modules_to_not_convert=["head"])
    want_model = copy.deepcopy(net)
    mxgemm.quantize_(want_model, cfg)
    x = torch.randn(7, 256)
    batch = {"x": {0: torch.export.Dim("batch")}}
    gm = prepare_pt2e(torch.export.export(net, (x,), dynamic_shapes=batch).module(), MxQuantizer(cfg))
    gm(torch.randn(3, 256))  # calibration: nothing to record for MX, but the flow runs it
    gm = convert_pt2e(gm)
    mx = [m for m in gm.modules() if isinstance(m, MxLinear)]
    assert len(mx) == 2 and all(m.fmt == fmt for m in mx)
    linears = [n for n in gm.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert [n.args[1].target for n in linears] == ["head.weight"], "the layer left out stays float"
    with torch.no_grad():
        for rows in (1, 7):
            x = torch.randn(rows, 256)
            assert torch.equal(gm(x), want_model(x))
        ep = torch.export.export(gm, (x,), dynamic_shapes=batch)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.mxgemm.linear.default) == 2
    with torch.no_grad():
        assert torch.equal(ep.module()(x), want_model(x))
