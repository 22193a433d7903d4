"""MXFP8 × MXFP8 on Hopper's fp8 tensor cores (mxgemm.codegen.wgmma_mx).

CPU: argument and hint checks, the weight scales against ml_dtypes' E8M0, and (with nvcc) that ptxas
keeps the wgmmas asynchronous and spills nothing. GPU (Hopper): the kernel against a float64
emulation from the oracle's decode (ml_dtypes), one-hot rows bit for bit, NaN scales, bias, ragged
M, both column tiles; MxTensor ``X @ W.t()`` routed to it, eager and compiled.
"""

import numpy as np
import pytest
import torch

import mxgemm
from mxgemm import reference
from mxgemm.codegen import wgmma_mx
from tests import oracle, ptxas
from tests.hopper import hopper

SPEC = oracle.SPECS["mxfp8_e4m3"]


def _dequant(codes, scales) -> torch.Tensor:
    """float64 values of e4m3 ``codes [r, k]`` with block-32 E8M0 ``scales``, by the oracle (ml_dtypes)."""
    return torch.from_numpy(oracle.dequantize(codes.cpu().numpy(), scales.cpu().numpy(), SPEC))


def _emulation(xa, xs, w, ws, bias=None) -> torch.Tensor:
    """float64 ``dequant(X) @ dequant(W)^T (+ bias)``."""
    y = _dequant(xa, xs) @ _dequant(w, ws).T
    return y if bias is None else y + bias.cpu().double()


def test_weight_scales_are_e8m0():
    codes = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    got = wgmma_mx.weight_scales(codes)
    assert got.shape == (128, 2) and got.dtype == torch.float32
    want = oracle.scale_factors(codes.numpy()).T
    np.testing.assert_array_equal(got.double().numpy(), want)  # NaN where the code is 255


@pytest.mark.parametrize(
    ("hints", "message"),
    [
        (dict(wg=4), "wg 1|2|3"),
        (dict(bn=256), "bn 64|128"),
        (dict(stages=7), "stages 2..6"),
        (dict(batch=3), "batch 1|2|4"),
        (dict(wg=3, bn=128, batch=2), "do not fit 3 warpgroups"),
    ],
)
def test_hints_are_checked(hints, message):
    with pytest.raises(ValueError, match=message):
        wgmma_mx.Hints(**hints)


def test_applies_names_the_shape():
    assert wgmma_mx.applies(8192, 8192) is None
    assert "N=192 is not a multiple of 128" in wgmma_mx.applies(192, 256)
    assert "K=96 is not a multiple of 128" in wgmma_mx.applies(128, 96)


def test_matmul_rejects_bad_arguments():
    x = torch.zeros(4, 256, dtype=torch.uint8)
    s = torch.zeros(4, 8, dtype=torch.uint8)
    w = torch.zeros(128, 256, dtype=torch.uint8)
    ws = torch.zeros(128, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"ws must be uint8 \[128, 8\]"):
        wgmma_mx.matmul(x, s, w, ws[:, :4], torch.bfloat16)
    with pytest.raises(ValueError, match="N=96 is not a multiple of 64"):
        wgmma_mx.matmul(x, s, w[:96], ws[:96], torch.bfloat16)
    with pytest.raises(ValueError, match="K=96 is not a multiple of 128"):
        wgmma_mx.matmul(x[:, :96], s[:, :3], w[:, :96], ws[:, :3], torch.bfloat16)
    with pytest.raises(ValueError, match=r"Hopper \(compute capability 9.0\) GPUs, not cpu"):
        wgmma_mx.matmul(x, s, w, ws, torch.bfloat16)


def test_mx_tensor_on_cpu_keeps_the_emulation():
    x, w = torch.randn(8, 256), torch.randn(128, 256)
    a, b = mxgemm.MxTensor.to_mx(x, "mxfp8_e4m3"), mxgemm.MxTensor.to_mx(w, "mxfp8_e4m3")
    assert torch.equal(a @ b.t(), a.dequantize() @ b.dequantize().t())


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "hints", [wgmma_mx.DEFAULT, wgmma_mx.Hints(2, 64, 4, 4), wgmma_mx.Hints(3, 64, 4, 2)]
)
def test_ptxas_keeps_wgmmas_asynchronous(tmp_path, hints):
    """The source holds the e4m3 wgmma of the hints' N; ptxas neither serializes the wgmmas (C7514:
    a fragment read while a wgmma is in flight) nor spills."""
    import tvm

    from mxgemm.codegen import build as builder
    from mxgemm.codegen.wgmma import TARGET

    f = wgmma_mx.kernel(n=1024, k=1024, out_dtype="bfloat16", bias=True, hints=hints)
    info = builder.compile_export(tvm.IRModule({"main": f}), TARGET, tmp_path / "k.so")
    src = info["source"]
    assert f"wgmma.mma_async.sync.aligned.m64n{hints.bn}k32.f32.e4m3.e4m3" in src
    assert src.count("wgmma.wait_group.sync.aligned") >= hints.batch
    ptxas.assert_wgmmas_async_no_spills(src, tmp_path)


# ---- on a Hopper GPU ----------------------------------------------------------------------------------

GPU_SHAPES = [(300, 256, 1024), (1, 128, 128), (37, 192, 256)]  # (M, N, K): N=192 takes 64-column tiles
OUT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# the kernels of the GPU tests, (N, K, out dtype, bias), for tests.prebuild_gpu
PREBUILD = [(n, k, str(dt).removeprefix("torch."), True) for _, n, k in GPU_SHAPES for dt in OUT_DTYPES]
PREBUILD += [(128, 512, "float32", False), (256, 512, "bfloat16", False), (256, 512, "bfloat16", True)]


def _operands(m, n, k, seed):
    g = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cuda") * torch.rand(m, 1, generator=g, device="cuda") * 8
    w = torch.randn(n, k, generator=g, device="cuda") * 0.02
    return reference.quantize(x, "mxfp8_e4m3"), reference.quantize(w, "mxfp8_e4m3")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("m", "n", "k"), GPU_SHAPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_gpu_matches_the_emulation(m, n, k, out_dtype):
    xq, wq = _operands(m, n, k, m + n + k)
    xs = xq.scales.clone()
    xs[m // 2, -1] = 255  # a NaN block scale: that row is NaN
    bias = torch.randn(n, device="cuda").to(out_dtype)
    y = wgmma_mx.matmul(xq.blocks, xs, wq.blocks, wq.scales, out_dtype, bias).cpu()
    ref = _emulation(xq.blocks, xs, wq.blocks, wq.scales, bias)
    nan_row = torch.zeros(m, dtype=torch.bool)
    nan_row[m // 2] = True
    assert torch.isnan(y[nan_row]).all() and torch.isfinite(y[~nan_row]).all()
    # the float32 sums' error, bounded by |X| |W| (each block's sum is the tensor cores')
    bound = _dequant(xq.blocks, xq.scales).abs() @ _dequant(wq.blocks, wq.scales).abs().T
    bound = (bound + bias.cpu().double().abs())[~nan_row] * 2.0**-14
    err = (y[~nan_row].double() - ref[~nan_row]).abs()
    ulp = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[out_dtype]  # one rounding
    assert (err <= ref[~nan_row].abs() * ulp + bound).all(), float((err / bound).max())


@pytest.mark.gpu
@hopper
def test_gpu_one_hot_rows_are_bit_exact():
    """Each row of X holds one nonzero code: every output is one exact product times two powers of
    two, which the kernel must return exactly (every e4m3 code, scales from 2**-20 to 2**20)."""
    m, n, k = 256, 128, 512
    g = torch.Generator().manual_seed(3)
    xa = torch.zeros(m, k, dtype=torch.uint8)
    cols = torch.randint(0, k, (m,), generator=g)
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # no NaN code
    xa[torch.arange(m), cols] = codes[torch.arange(m) % codes.numel()]
    w = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
    w[(w & 0x7F) == 0x7F] = 0
    xs = torch.randint(107, 148, (m, k // 32), generator=g, dtype=torch.uint8)
    ws = torch.randint(107, 148, (n, k // 32), generator=g, dtype=torch.uint8)
    y = wgmma_mx.matmul(xa.cuda(), xs.cuda(), w.cuda(), ws.cuda(), torch.float32).cpu()
    ref = _emulation(xa, xs, w, ws).float()
    assert torch.equal(y, ref)


@pytest.mark.gpu
@hopper
def test_gpu_mx_tensor_runs_the_kernel_eager_and_compiled():
    m, n, k = 64, 256, 512
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    a, b = mxgemm.MxTensor.to_mx(x, "mxfp8_e4m3"), mxgemm.MxTensor.to_mx(w, "mxfp8_e4m3")
    want = wgmma_mx.matmul(a.q.blocks, a.q.scales, b.q.blocks, b.q.scales, torch.bfloat16)
    assert torch.equal(a @ b.t(), want)
    want_b = wgmma_mx.matmul(a.q.blocks, a.q.scales, b.q.blocks, b.q.scales, torch.bfloat16, bias)
    assert torch.equal(torch.nn.functional.linear(a, b, bias), want_b)
    compiled = torch.compile(lambda a, b: a @ b.t(), fullgraph=True)
    assert torch.equal(compiled(a, b), want)
