"""`torch.export` of MxLinear models: the ExportedProgram holds the `mxgemm::linear` op (the packed
weights as buffers), round-trips through `torch.export.save`/`load`, and computes what the eager model
computes, bit for bit, at batch sizes other than the traced one."""

from __future__ import annotations

import io

import pytest
import torch

import mxgemm
from mxgemm import MxActConfig, MxConfig


def _model(activations=None) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.GELU(), torch.nn.Linear(128, 64, bias=False))
    m = m.to(torch.bfloat16)
    mxgemm.quantize_(m, MxConfig("mxfp4", activations=activations))
    return m


@pytest.mark.parametrize("activations", [None, MxActConfig("mxfp8_e4m3")], ids=["weights", "weights+acts"])
def test_export_save_load_matches_eager(activations):
    m = _model(activations)
    batch = torch.export.Dim("batch", min=1, max=1024)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        ep = torch.export.export(m, (x,), dynamic_shapes=({0: batch},))
    ops = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.mxgemm.linear.default) == 2, ops
    names = {name for name, _ in ep.named_buffers()}
    assert {"0.weight_blocks", "0.weight_scales", "2.weight_blocks", "2.weight_scales"} <= names
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf).module()
    for rows in (5, 1, 33):
        x = torch.randn(rows, 256, dtype=torch.bfloat16)
        with torch.no_grad():
            want = m(x)
            got = loaded(x)
        assert torch.equal(got, want), (rows, (got.float() - want.float()).abs().max())
    # and against the independent emulation: dequantized weights (and activations), fp32 sums
    from mxgemm.fake_quant import fake_quantize
    from mxgemm.reference import dequantize

    def emulate(x):
        for layer in (m[0], m[2]):
            if activations is not None:
                x = fake_quantize(x, activations.fmt, **activations.kwargs())
            b = None if layer.bias is None else layer.bias.float()
            x = torch.nn.functional.linear(x.float(), dequantize(layer.weight), b).to(torch.bfloat16)
            if layer is m[0]:
                x = torch.nn.functional.gelu(x)
        return x

    x = torch.randn(7, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        err = (loaded(x).float() - emulate(x).float()).abs().max()
    assert err <= 2**-6 * emulate(x).float().abs().max(), err  # summation order, bf16 outputs
