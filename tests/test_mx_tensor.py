"""`mxgemm.MxTensor`: values against the independent quantize-dequantize (`fake_quantize`, float64 grid
rounding), products against the emulation (dequantize both, float32 sums), views that move no data,
the kernel path for `F.linear`, and the same results under `torch.compile(fullgraph=True)`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mxgemm
from mxgemm import MxTensor, formats
from mxgemm.fake_quant import fake_quantize
from mxgemm.reference import dequantize, quantize

FORMATS = sorted(formats.names())


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * torch.rand(*shape, generator=g).exp2()).to(dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_to_mx_holds_the_quantized_values_along_its_axis(fmt, axis):
    x = _randn(64, 96, 32, seed=FORMATS.index(fmt))
    m = MxTensor.to_mx(x, fmt, axis=axis, scale_mode="even")
    assert m.shape == x.shape and m.dtype == x.dtype and m.axis == axis % 3
    want = fake_quantize(x, fmt, axis=axis, scale_mode="even")
    torch.testing.assert_close(m.dequantize(), want, rtol=0, atol=0, equal_nan=True)
    # the stored layout is the MxWeight of the axis moved last
    q = quantize(x.movedim(axis, -1).contiguous(), fmt, scale_mode="even")
    assert torch.equal(m.q.blocks, q.blocks) and torch.equal(m.q.scales, q.scales)
    assert torch.equal(m.dequantize(torch.float32).movedim(axis, -1), dequantize(q))


def test_views_move_no_data_and_keep_the_block_axis():
    x = _randn(2, 64, 32)
    m = MxTensor.to_mx(x, "mxfp4", axis=1)
    d = m.dequantize()
    for view, ref, axis, shared in (
        (m.transpose(0, 2), d.transpose(0, 2), 1, True),
        (m.permute(1, 2, 0), d.permute(1, 2, 0), 0, True),
        (m.mT, d.mT, 2, True),
        (m.detach(), d, 1, True),
        (m.clone(), d, 1, False),
    ):
        assert isinstance(view, MxTensor) and view.axis == axis
        assert (view.q.blocks.data_ptr() == m.q.blocks.data_ptr()) == shared
        assert torch.equal(view.dequantize(), ref)
    w = MxTensor.to_mx(_randn(48, 64), "mxfp8_e4m3")
    assert w.t().shape == (64, 48) and w.t().axis == 0 and w.t().t().axis == 1
    h = w.to(torch.bfloat16)
    assert isinstance(h, MxTensor) and h.dtype == torch.bfloat16 and h.q is w.q
    assert torch.equal(h.dequantize(), w.dequantize().to(torch.bfloat16))


def test_other_ops_see_the_dequantized_tensor():
    m = MxTensor.to_mx(_randn(8, 64, dtype=torch.bfloat16), "mxfp6_e3m2")
    d = m.dequantize()
    for got, want in ((m + 1, d + 1), (m.sum(0), d.sum(0)), (torch.relu(m), torch.relu(d)), (m[2:5], d[2:5])):
        assert type(got) is torch.Tensor and torch.equal(got, want)


def _emulate(a, b, out_dtype):
    dense = [t.dequantize(torch.float32) if isinstance(t, MxTensor) else t.float() for t in (a, b)]
    return torch.matmul(*dense).to(out_dtype)


@pytest.mark.parametrize(
    ("fa", "fb"), [(None, "mxfp4"), ("mxfp8_e4m3", "mxfp4"), ("mxfp6_e2m3", "mxint8"), ("bfp8", None)]
)
def test_products_equal_the_emulation(fa, fb):
    """2-D (mm), batched 3-D (bmm) and 4-D (attention-like) products, each operand quantized along K."""
    for sa, sb in (((16, 64), (64, 24)), ((3, 16, 64), (3, 64, 24)), ((2, 4, 16, 64), (2, 4, 64, 24))):
        a, b = _randn(*sa, seed=1), _randn(*sb, seed=2)
        qa = a if fa is None else MxTensor.to_mx(a, fa, axis=-1)
        qb = b if fb is None else MxTensor.to_mx(b, fb, axis=-2)
        got = qa @ qb
        assert type(got) is torch.Tensor and got.shape == (*sa[:-1], sb[-1])
        assert torch.equal(got, _emulate(qa, qb, torch.float32)), (fa, fb, sa)
    # addmm and F.linear with a float32 input: the emulation too (the kernels take fp16/bf16)
    x, w, bias = _randn(5, 64), _randn(24, 64, seed=3), _randn(24, seed=4)
    qw = MxTensor.to_mx(w, fb or "mxfp4")
    want = (x @ qw.dequantize().T + bias).float()
    torch.testing.assert_close(F.linear(x, qw, bias), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp6_e3m2"])
def test_linear_with_an_mx_weight_runs_the_kernels(fmt, dtype):
    x = _randn(7, 256, dtype=dtype, seed=5) / 4
    w, bias = _randn(96, 256, seed=6), _randn(96, seed=7).to(dtype)
    qw = MxTensor.to_mx(w, fmt)
    mw = mxgemm.quantize(w, fmt)
    for got, want in (
        (F.linear(x, qw), mxgemm.linear(x, mw)),
        (F.linear(x, qw, bias), mxgemm.linear(x, mw, bias)),
        (x @ qw.t(), mxgemm.linear(x, mw)),
        (F.linear(x[None], qw), mxgemm.linear(x[None], mw)),
    ):
        assert got.dtype == dtype and torch.equal(got, want)
    emu = _emulate(x, qw.t(), dtype)
    torch.testing.assert_close(F.linear(x, qw), emu, rtol=2**-7, atol=1e-3)


def test_compiled_fullgraph_matches_eager():
    x = _randn(6, 128, dtype=torch.bfloat16, seed=8) / 4
    lin = torch.nn.Linear(128, 64).to(torch.bfloat16)
    with torch.no_grad():
        eager_plain = lin(x)
    lin.weight = torch.nn.Parameter(MxTensor.to_mx(lin.weight.detach(), "mxfp4"), requires_grad=False)
    with torch.no_grad():
        eager = lin(x)
        compiled = torch.compile(lin, fullgraph=True)(x)
    assert torch.equal(compiled, eager)
    assert (eager.float() - eager_plain.float()).abs().max() < 0.25 * eager_plain.float().abs().max()
    a = MxTensor.to_mx(_randn(2, 4, 8, 64, seed=9), "mxfp8_e5m2")
    b = MxTensor.to_mx(_randn(2, 4, 64, 8, seed=10), "mxfp8_e5m2", axis=-2)
    scores, probs = torch.compile(lambda a, b: ((s := a @ b), torch.softmax(s, -1)), fullgraph=True)(a, b)
    assert torch.equal(scores, a @ b)  # the product exactly; inductor's softmax to float32 rounding
    torch.testing.assert_close(probs, torch.softmax(a @ b, -1))


def test_bad_input_is_one_clear_error():
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        MxTensor.to_mx(torch.ones(4, 32, dtype=torch.int32), "mxfp4")
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        MxTensor.to_mx(torch.ones(4, 32), "mxfp4", axis=2)
    with pytest.raises(ValueError, match="multiple of"):
        MxTensor.to_mx(torch.ones(4, 30), "mxfp4")
    with pytest.raises(ValueError, match="unknown format|fp9"):
        MxTensor.to_mx(torch.ones(4, 32), "fp9")
