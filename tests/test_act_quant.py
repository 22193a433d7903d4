"""The generated activation quantize kernel (`mxgemm.codegen.act_quant`): bit for bit what the torch
reference `mxgemm.fake_quantize` computes (itself bit-exact against ml_dtypes), on CPU and CUDA, and
what MxLinear runs on its inputs where it applies."""

import pytest
import torch

import mxgemm
from mxgemm.codegen import act_quant

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _inputs(dtype, k=256, rows=6, device="cpu"):
    """Rows spanning 12 decades, with an all-zero block, NaN, ±inf, -0.0 and subnormals."""
    g = torch.Generator().manual_seed(k + rows)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-6, 6, k)
    x = x.to(dtype)
    x[0, :32] = 0
    x[1, 5] = float("nan")
    x[2, 40] = float("-inf")
    x[3, 70] = -0.0
    x[4, 64:96] = torch.finfo(dtype).tiny / 4  # subnormal (fp16/bf16/fp32)
    return x.to(device)


def _same(a, b):
    """Equal bit patterns, NaN payloads aside."""
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    nan = a.isnan() & b.isnan()
    return torch.equal(a.isnan(), b.isnan()) and bool(((a.view(iv) == b.view(iv)) | nan).all())


def _check(fmt, dtype, rounding, block, device):
    x = _inputs(dtype, device=device)
    want = mxgemm.fake_quantize(x, fmt, block_size=block, rounding=rounding)
    got = act_quant.fake_quantize(x, fmt, block, rounding)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert _same(got, want), (fmt, dtype, rounding, block)


@pytest.mark.parametrize("rounding", act_quant.ROUNDINGS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", mxgemm.formats.names())
def test_kernel_is_the_reference_bit_for_bit(fmt, dtype, rounding):
    _check(fmt, dtype, rounding, 32, "cpu")


@pytest.mark.parametrize("block", [8, 64, 256])
def test_other_block_sizes(block):
    for fmt in ("mxfp4", "mxfp8_e5m2", "bfp5"):
        _check(fmt, torch.bfloat16, "even", block, "cpu")


def test_where_it_applies():
    assert act_quant.applies("mxfp4", "floor", "even", torch.bfloat16)
    assert not act_quant.applies("mxfp4", "rceil", "even", torch.bfloat16)  # other scale rules
    assert not act_quant.applies("mxfp4", "floor", "up", torch.bfloat16)  # directed roundings
    assert not act_quant.applies("mxfp4", "floor", "even", torch.float64)


def test_mxlinear_runs_it_on_its_inputs():
    """An MxLinear with quantized activations computes linear(dequant(q(x))) with the kernel's
    values, eager and with autograd recording (the reference path) alike."""
    torch.manual_seed(0)
    act = mxgemm.MxActConfig("mxfp8_e4m3")
    layer = mxgemm.MxLinear.from_linear(torch.nn.Linear(256, 64), "mxfp4", activations=act)
    x = torch.randn(3, 256)
    with torch.no_grad():
        fast = layer(x)
        xq = act_quant.fake_quantize(x, "mxfp8_e4m3", 32, "even").to(layer.a_dtype)
        want = mxgemm.linear(xq, layer.weight, layer.bias.to(layer.a_dtype)).to(x.dtype)
    assert torch.equal(fast, want)
    assert torch.equal(layer(x.requires_grad_()).detach(), fast)


def test_compiled_mxlinear_traces_the_kernel_as_one_op():
    """Under torch.compile(fullgraph=True) an MxLinear with quantized activations runs the kernel
    through its custom op (one node in the graph) and gives the eager call's bits."""
    torch.manual_seed(0)
    act = mxgemm.MxActConfig("mxfp4")
    layer = mxgemm.MxLinear.from_linear(torch.nn.Linear(128, 32), "mxfp8_e4m3", activations=act)
    graphs = []

    def backend(gm, inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    x = torch.randn(5, 128)
    with torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, fullgraph=True, backend=backend)(x)
    assert torch.equal(compiled, eager)
    assert len(graphs) == 1 and graphs[0].count("mxgemm.act_quant") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_kernel_is_the_reference_bit_for_bit(dtype):
    for fmt in mxgemm.formats.names():
        for rounding in act_quant.ROUNDINGS:
            _check(fmt, dtype, rounding, 32, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("rounding", ["even", "zero", "up", "down", "away"])
def test_gpu_reference_is_the_cpu_reference(rounding):
    """The torch reference quantizes the same on CUDA as on CPU, on values at exact ties and on the
    grid (CUDA's ldexp/pow are not exact: an inexact 2**-4 had moved them)."""
    for fmt in ("mxfp4", "mxfp8_e4m3", "mxint8", "bfp5"):
        x = _inputs(torch.bfloat16)
        grid = mxgemm.fake_quantize(x, fmt)  # on the grid: every rounding must keep these
        ties = (grid + mxgemm.fake_quantize(x * 1.03, fmt)) / 2  # midpoints, where representable
        for t in (x, grid, ties):
            cpu = mxgemm.quantize(t, fmt, rounding=rounding)
            gpu = mxgemm.quantize(t.cuda(), fmt, rounding=rounding).to("cpu")
            assert torch.equal(cpu.blocks, gpu.blocks) and torch.equal(cpu.scales, gpu.scales), fmt
