"""`mxgemm.ops` dispatch: eager calls skip the custom op's dispatch; traced, faked and autograd calls go
through it; both give the same bits."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mxgemm
from mxgemm import ops

N, K = 64, 128


def _layer(fmt="mxfp4", bias=True):
    torch.manual_seed(0)
    lin = torch.nn.Linear(K, N, bias=bias)
    return mxgemm.MxLinear.from_linear(lin, fmt, a_dtype=torch.bfloat16)


def _ops_called(fn) -> list[str]:
    """Names of the ``mxgemm::`` ops that torch's profiler saw while ``fn()`` ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("mxgemm::")]


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e3m2"])
def test_eager_call_skips_the_custom_op_with_the_same_bits(fmt):
    layer = _layer(fmt)
    x = torch.randn(3, 5, K, dtype=torch.bfloat16)
    with torch.no_grad():
        assert _ops_called(lambda: layer(x)) == []
        y = layer(x)
        args = (x, layer.planes, layer.weight_scales, layer.bias, layer.fmt, layer.block_size, N, K)
        y_op = torch.ops.mxgemm.linear(*args)
        assert _ops_called(lambda: torch.ops.mxgemm.linear(*args)) == ["mxgemm::linear"]
    assert y.shape == (3, 5, N)
    assert torch.equal(y, y_op)
    q = layer.weight
    assert _ops_called(lambda: mxgemm.linear(x, q, layer.bias)) == []
    assert torch.equal(mxgemm.linear(x, q, layer.bias), y_op)


def test_calls_that_torch_traces_or_records_go_through_the_op():
    x = torch.randn(2, K, dtype=torch.bfloat16)
    assert ops._eager(x)
    assert not ops._eager(x.clone().requires_grad_())
    with torch.no_grad():
        assert ops._eager(x.clone().requires_grad_())
    with FakeTensorMode() as mode:
        assert not ops._eager(mode.from_tensor(x))
    layer = _layer()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        y = layer(mode.from_tensor(x))  # the fake kernel: shape and dtype only
    assert y.shape == (2, N) and y.dtype == torch.bfloat16


def test_compiled_equals_eager_bit_for_bit():
    layer = _layer()
    x = torch.randn(4, K, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = torch.compile(layer, fullgraph=True)
        assert torch.equal(compiled(x), layer(x))
