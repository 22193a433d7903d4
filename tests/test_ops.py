"""`mxgemm.ops` dispatch: eager calls skip the custom op's dispatch; traced, faked and autograd calls go
through it; both give the same bits."""

import copy
import io

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


def test_eager_calls_between_compiled_ones_do_not_recompile():
    """A layer's hot paths (learnt by eager calls) are no guard of its compiled graph."""
    layer = _layer()
    x = torch.randn(4, K, dtype=torch.bfloat16)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True)
        want = compiled(x)
        for m in (1, 2, 3, 5):
            layer(torch.randn(m, K, dtype=torch.bfloat16))
            layer(torch.randn(m, K, dtype=torch.bfloat16))
        assert torch.equal(compiled(x), want)


GPU_M = 3  # rows of the GPU dispatch test (its kernels are prebuilt by tests.prebuild_gpu, set "ops")
GPU_CASES = [("mxfp4", torch.float16), ("mxfp4", torch.bfloat16), ("mxfp6_e2m3", torch.float16)]


@pytest.mark.gpu
@pytest.mark.parametrize(("fmt", "dtype"), GPU_CASES)
def test_gpu_eager_op_compiled_and_graph_give_the_same_bits(fmt, dtype):
    torch.manual_seed(0)
    layer = mxgemm.MxLinear.from_linear(torch.nn.Linear(K, N), fmt, a_dtype=dtype).cuda()
    x = torch.randn(GPU_M, K, device="cuda", dtype=dtype)
    with torch.no_grad():
        eager = layer(x)
        assert x.shape in layer._hot  # the next calls of this shape take the hot path
        hot, again = layer(x), layer(x)  # each a fresh contiguous output (empty_like of a template)
        assert torch.equal(hot, eager) and torch.equal(again, eager) and hot.data_ptr() != again.data_ptr()
        assert again.is_contiguous() and again.shape == eager.shape and again.dtype == eager.dtype
        args = (x, layer.planes, layer.weight_scales, layer.bias, layer.fmt, layer.block_size, N, K)
        assert torch.equal(eager, torch.ops.mxgemm.linear(*args))
        assert torch.equal(torch.compile(layer, fullgraph=True)(x), eager)
        side = torch.cuda.Stream()  # eager calls on a side stream run there (tvm-ffi takes torch's stream)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = layer(x)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(on_side, eager)
        static_x = x.clone()
        g = torch.cuda.CUDAGraph()
        fresh = copy.deepcopy(layer)  # (its first call captured: no hot path learnt there)
        with torch.cuda.graph(g):
            static_y = layer(static_x)
            fresh(static_x)
        assert fresh._hot == {}
        x2 = torch.randn(GPU_M, K, device="cuda", dtype=dtype)
        static_x.copy_(x2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, layer(x2))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "bfp5"])
def test_emulated_backend_runs_no_generated_kernel(fmt, device, monkeypatch):
    """``$MXGEMM_BACKEND=emulated``: no kernel is built or run; the result is the reference's
    (fp32 dequantize, fp32 product, one rounding) bit for bit, on the eager path and the custom op;
    any other value is one error naming the choices."""
    layer = _layer(fmt).to(device)
    x = torch.randn(5, K, dtype=torch.bfloat16, device=device)
    w = mxgemm.dequantize(layer.weight)
    want = torch.nn.functional.linear(x.float(), w, layer.bias.float()).to(torch.bfloat16)

    def no_build(*args, **kwargs):
        raise AssertionError("a kernel was built")

    monkeypatch.setenv(ops.BACKEND_ENV, "emulated")
    monkeypatch.setattr(ops, "_kernel", no_build)
    with torch.no_grad():
        assert torch.equal(layer(x), want)
        args = (x, layer.planes, layer.weight_scales, layer.bias, layer.fmt, layer.block_size, N, K)
        assert torch.equal(torch.ops.mxgemm.linear(*args), want)
        monkeypatch.setenv(ops.BACKEND_ENV, "fast")
        with pytest.raises(ValueError, match=r"MXGEMM_BACKEND must be one of kernels, emulated, got 'fast'"):
            layer(x)


def _full_calls(monkeypatch) -> list[int]:
    """Counts the calls that take the full path (:func:`ops._forward`) from now on."""
    calls, forward = [], ops._forward

    def counted(*args):
        calls.append(1)
        return forward(*args)

    monkeypatch.setattr(ops, "_forward", counted)
    return calls


@pytest.mark.parametrize("shape", [(3, K), (2, 3, K)])
def test_a_repeated_eager_call_takes_the_hot_path_with_the_same_bits(shape, monkeypatch):
    layer = _layer()
    x = torch.randn(*shape, dtype=torch.bfloat16)
    with torch.no_grad():
        first = layer(x)
        calls = _full_calls(monkeypatch)
        again = layer(x.clone())
        assert calls == []  # the hot path ran it
        assert torch.equal(again, first)
        assert torch.equal(layer(x.transpose(0, -1).contiguous().transpose(0, -1)), first)  # (not contiguous)
        assert len(calls) == 1
        args = (x, layer.planes, layer.weight_scales, layer.bias, layer.fmt, layer.block_size, N, K)
        assert torch.equal(torch.ops.mxgemm.linear(*args), first)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_hot_paths_output_template_makes_fresh_contiguous_outputs(dtype):
    """``torch.empty_like`` of :func:`ops._like`'s expanded 1-element tensor: a new contiguous
    ``[m, n]`` tensor of the dtype each time (what a CUDA launcher's hot path allocates its output
    as), the template shared by every shape."""
    like = ops._like(3, 40, dtype, torch.device("cpu"))
    a, b = torch.empty_like(like), torch.empty_like(like)
    assert a.shape == (3, 40) and a.dtype == dtype and a.is_contiguous() and a.stride() == (40, 1)
    assert a.data_ptr() != b.data_ptr() and a.untyped_storage().nbytes() == 3 * 40 * a.element_size()
    other = ops._like(7, 5, dtype, torch.device("cpu"))
    assert other.untyped_storage().data_ptr() == like.untyped_storage().data_ptr()


def test_the_hot_path_gives_way_where_the_weights_the_input_or_the_backend_changed(monkeypatch):
    layer, other = _layer(), _layer()
    other.load_weight(mxgemm.quantize(torch.randn(N, K), "mxfp4"))
    x = torch.randn(4, K, dtype=torch.bfloat16)
    with torch.no_grad():
        want, base = other(x), layer(x)
        calls = _full_calls(monkeypatch)
        layer.load_weight(other.weight)  # the same tensors, written in place
        assert torch.equal(layer(x), want) and not torch.equal(want, base)
        assert len(calls) == 1
        layer.weight_scales = other.weight_scales.clone()  # a buffer replaced
        assert torch.equal(layer(x), want)
        assert len(calls) == 2
        assert torch.equal(layer(x), want) and len(calls) == 2
        assert torch.equal(layer(x.double()), want.double())  # another dtype: the full path's cast
        twin = copy.deepcopy(layer)
        twin.load_weight(_layer().weight)
        assert torch.equal(twin(x), base) and torch.equal(layer(x), want)
        torch.save(layer, io.BytesIO())  # (no closure goes into a pickle)
        monkeypatch.setenv(ops.BACKEND_ENV, "emulated")
        w = mxgemm.dequantize(layer.weight)
        want = torch.nn.functional.linear(x.float(), w, layer.bias.float()).to(torch.bfloat16)
        assert torch.equal(layer(x), want)
    grad_x = x.clone().requires_grad_()
    assert _ops_called(lambda: layer(grad_x)) == ["mxgemm::linear"]  # autograd records the op


def test_the_hot_path_keeps_the_fp16_range_check_of_a_weight_changed_in_place():
    torch.manual_seed(0)
    layer = mxgemm.MxLinear.from_linear(torch.nn.Linear(K, N), "mxfp8_e4m3", a_dtype=torch.float16)
    x = torch.randn(2, K, dtype=torch.float16)
    with torch.no_grad():
        layer(x)
        layer(x)
        layer.weight_scales[0, 0] = 254  # 2^127: past fp16's range
        with pytest.raises(ValueError, match="float16"):
            layer(x)
