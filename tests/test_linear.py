"""`mxgemm.linear` numerics against the reference (CPU in CI; the same on CUDA under the `gpu` marker)."""

import dataclasses
import itertools

import pytest
import torch

import mxgemm
from mxgemm import ops
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets
from tests.linear_cases import (
    BLOCK_CASES,
    CHUNK_FORMATS,
    DTYPES,
    FORMATS,
    GEMV_K,
    GEMV_N,
    MS,
    PDL_FORMATS,
    PDL_N,
    RULE_CASES,
    TC_K,
    TC_N,
    K,
    N,
    chain_replays_eagerly,
    every_code_weight,
    pdl_chain_kernel,
    rule_kernel,
    rule_shape,
)


@pytest.fixture
def no_cpu_dot(monkeypatch):
    """The CPU routing of a CPU without AVX-512 (``cpu_dot`` declines every spec)."""
    from mxgemm.rules import cpu_dot

    monkeypatch.setattr(cpu_dot, "cpu_bf16_dots", lambda target: False)
    monkeypatch.setattr(cpu_dot, "cpu_word_lookups", lambda target: False)
    ops.clear_kernels()
    yield
    ops.clear_kernels()


def _weights(fmt, n, k, block_size=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    # per-row magnitudes over six decades, so scales vary across blocks
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
    return mxgemm.quantize(w, fmt, block_size=block_size)


def _check(x, q, bias, y, cublas=False):
    """y must equal x.float() @ dequantize(q).T (+ bias) up to fp32 summation order, then the cast
    (outputs beyond the dtype's range must be the same infinities). ``cublas``: the product ran in
    cuBLAS, whose reductions torch lets use 16-bit partial sums (``allow_*_reduced_precision_reduction``):
    one 16-bit rounding of the sum's magnitude more."""
    ref = x.float() @ mxgemm.dequantize(q).to(x.device).T
    if bias is not None:
        ref = ref + bias.float()
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], q.shape[0])
    scale = (x.float().abs() @ mxgemm.dequantize(q).to(x.device).abs().T).clamp(min=1e-30)
    eps = torch.finfo(x.dtype).eps
    over = ref.to(x.dtype).isinf()
    assert torch.equal(y[over], ref[over].to(x.dtype)), "overflow to the wrong infinity"
    err = (y.float() - ref).abs()[~over]
    # one rounding to the output dtype (half ulp ≤ eps·|ref|, or ≤ half the smallest subnormal where
    # |ref| is below the normal range: a sum of 2**-127-scaled blocks) + fp32 accumulation-order error
    sub = torch.finfo(x.dtype).smallest_normal * eps
    bound = eps * ref.abs()[~over] + sub + (eps if cublas else 1e-5) * scale[~over]
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


def _run(fmt, dtype, bias, m, device, n=N, k=K, block_size=None, batch=()):
    dt = getattr(torch, dtype)
    q = _weights(fmt, n, k, block_size).to(device)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(*batch, m, k, generator=g).to(dt).to(device)
    b = torch.randn(n, generator=g).to(dt).to(device) if bias else None
    y = mxgemm.linear(x, q, b)
    _check(
        x,
        q,
        b,
        y,
        cublas=device == "cuda" and ops.plan(m, targets.device_arch(), fmt, n, k, dtype)[0] == "decode",
    )


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu(fmt, dtype, bias, m):
    _run(fmt, dtype, bias, m, "cpu")


@pytest.mark.parametrize(("fmt", "block", "n", "k"), BLOCK_CASES)
def test_cpu_block_sizes(fmt, block, n, k):
    for m in MS:
        _run(fmt, "bfloat16", False, m, "cpu", n=n, k=k, block_size=block)


def test_cpu_batch_dims_and_empty():
    _run("mxfp4", "bfloat16", True, 3, "cpu", batch=(2, 2))
    q = _weights("mxfp4", N, K)
    y = mxgemm.linear(torch.zeros(0, K, dtype=torch.float16), q)
    assert y.shape == (0, N)


def test_cpu_kernel_is_bit_exact_for_exact_products():
    """With a one-hot x each output is a single decoded weight: the kernel's decode must equal the
    reference bit for bit, for every format (cast to bf16 once, like the reference)."""
    for fmt in FORMATS:
        q = _weights(fmt, N, K)
        x = torch.eye(K, dtype=torch.bfloat16)
        y = mxgemm.linear(x, q)
        assert torch.equal(y, mxgemm.dequantize(q).T.to(torch.bfloat16)), fmt


@pytest.mark.parametrize("bucket", [1, 4])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_gemv_decodes_every_code_and_scale_bit_exactly(fmt, bucket):
    """The few-row CPU kernel (``cpu_gemv``, its ``"sar"`` decode; one row, and four rows, each one-hot
    on another column) with one-hot rows equals the same
    product in torch bit for bit: each output is one decoded weight (rows holding an infinite or NaN
    weight are NaN: 0 × inf). Random codes of every value and scale codes over the whole E8M0
    range, 0 (2**-127), 254 (2**127) and 255 (NaN) included. (NaN/inf element codes, which quantize
    never writes, decode to finite values in every kernel: replaced by 0.)"""
    n, k = 16, 256
    q = every_code_weight(fmt, n, k, 7)
    q.scales[1, 3] = 255
    kernel = mxgemm.build(fmt, n=n, k=k, m_bucket=bucket, a_dtype="bfloat16", target="llvm")
    assert kernel.rule == "cpu_gemv"
    planes, w = mxgemm.layout.transform_weight(q, kernel), mxgemm.dequantize(q)
    y = torch.empty(bucket, n, dtype=torch.bfloat16)
    for col in range(0, k, bucket):
        x = torch.zeros(bucket, k, dtype=torch.bfloat16)
        x[torch.arange(bucket), (col + torch.arange(bucket) * (k // bucket + 1)) % k] = 1
        kernel(x, *planes, y)
        want = (x.float() @ w.T).to(torch.bfloat16)
        torch.testing.assert_close(y, want, rtol=0, atol=0, equal_nan=True)
    assert y[:, 1].isnan().any() and y[:, 2:].isfinite().any()


@pytest.mark.gpu
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu(fmt, dtype, bias, m):
    _run(fmt, dtype, bias, m, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize(("fmt", "block", "n", "k"), BLOCK_CASES)
def test_gpu_block_sizes(fmt, block, n, k):
    for m in MS:
        _run(fmt, "bfloat16", False, m, "cuda", n=n, k=k, block_size=block)


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("rule", "dtype"), RULE_CASES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_small_m_rules(fmt, rule, dtype, bias):
    """Each small-M rule, pinned by its default hints, at every M bucket it serves (padded and full)
    on a shape it tiles: numerics, and one-hot rows give W's columns bit-exactly (padded rows must not
    leak, every column lands where it belongs)."""
    n, k, ms = rule_shape(rule)
    q = _weights(fmt, n, k).to("cuda")
    dt = getattr(torch, dtype)
    w = mxgemm.dequantize(q).to(dt)
    planes = ops._planes(q.blocks, mxgemm.formats.get(fmt).bits)
    g = torch.Generator().manual_seed(7)
    b = torch.randn(n, generator=g).to(dt).to("cuda") if bias else None
    for m in ms:
        kernel = mxgemm.build(**rule_kernel(rule, fmt, dtype, bias, m, "cuda"))
        assert kernel.rule == rule.split("-")[0], (kernel, rule)
        assert rule != "mma-regs" or kernel.info["hints"]["stages"] == 0
        assert rule != "mma-shared" or kernel.info["hints"]["kn"] == 4
        assert rule != "mma-pdl" or kernel.info["hints"]["pdl"] == kernel.info["hints"]["shl"] == 1
        assert rule != "mma-xs" or kernel.info["hints"]["xs"] == 1
        assert rule != "mma-fold" or kernel.info["hints"]["fold"] == 1
        assert rule != "mma-mw" or kernel.info["hints"]["mw"] > 1
        x = torch.randn(m, k, generator=g).to(dt).to("cuda")
        y = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
        kernel(x, *planes, q.scales, *([b] if bias else []), y)
        _check(x, q, b, y)
        cols = torch.arange(m) * 31 % k
        x = torch.zeros(m, k, dtype=dt, device="cuda")
        x[torch.arange(m), cols] = 1
        kernel(x, *planes, q.scales, *([b] if bias else []), y)
        want = (w[:, cols].T.float() + (b.float() if bias else 0)).to(dt)
        assert torch.equal(y, want), (fmt, rule, m)
        _special_scales(kernel, x.normal_(generator=None), q, planes, b, y)


def _special_scales(kernel, x, q, planes, bias, y):
    """E8M0 code 255 (NaN) in some blocks: exactly their rows' outputs are NaN; code 0 (2**-127)
    elsewhere: the other outputs match the reference."""
    s = q.scales.clone()
    s[0, 1], s[5, -1], s[2, :], s[3, 0] = 255, 255, 0, 0
    q = dataclasses.replace(q, scales=s)
    kernel(x, *planes, s, *([bias] if bias is not None else []), y)
    ref = x.float() @ mxgemm.dequantize(q).to(x.device).T + (bias.float() if bias is not None else 0)
    nan = torch.zeros_like(y, dtype=torch.bool)
    nan[:, [0, 5]] = True
    assert torch.equal(y.isnan(), nan) and torch.equal(ref.isnan(), nan)
    keep = [c for c in range(y.shape[1]) if c not in (0, 5)]
    _check(x, dataclasses.replace(q, blocks=q.blocks[keep], scales=s[keep], shape=(len(keep), q.shape[1])),
           bias[keep] if bias is not None else None, y[:, keep])  # fmt: skip


def fold_scales(fmt: str, dtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    """uint8 E8M0 codes ``[n, k/32]`` for the folded-scale kernels: each row's codes within the fold's
    spread of the row's largest (row 0 from code 0, row 1 up to 254, the others anywhere), except rows
    32..39, whose spread is one binade more (their warps take the unfolded loop) and whose codes stay
    ≤ 127: that loop scales each step before the format's step (``pairs.out_factor``), so integer
    formats' sums above 2**121 overflow there."""
    from mxgemm.codegen import pairs

    spread = pairs.fold(mxgemm.formats.get(fmt), dtype).spread
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 255 - spread, (n, 1), generator=g)
    base[0], base[1] = 0, 254 - spread
    wide = torch.zeros(n, 1, dtype=torch.long)
    wide[32:40] = 1
    base = torch.where(wide > 0, base.clamp(max=max(0, 126 - spread)), base)
    codes = (
        base
        + torch.randint(0, spread + 1, (n, k // 32), generator=g)
        + wide * torch.randint(0, 2, (n, k // 32), generator=g)
    )
    codes[:, 0], codes[:, 1] = base[:, 0], (base + spread + wide)[:, 0]  # both ends in every row
    return codes.to(torch.uint8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", [f for f in FORMATS if mxgemm.formats.get(f).block_size == 32])
def test_gpu_folded_scales_bit_exact(fmt, dtype):
    """The folded block scales (``mma`` hints ``fold``) with every code and scale codes that span the
    fold's whole range in every row (from code 0 up to 254), and rows one binade wider (their warps
    fall back, :func:`fold_scales`): one-hot rows give W's columns bit for bit, at 16, 64 and 128 rows,
    and with warps splitting M at 128 and 256 rows."""
    n, k = TC_N, TC_K
    q = every_code_weight(fmt, n, k, 5)
    q = dataclasses.replace(q, scales=fold_scales(fmt, dtype, n, k, 5)).to("cuda")
    dt = getattr(torch, dtype)
    w = mxgemm.dequantize(q)
    planes = ops._planes(q.blocks, mxgemm.formats.get(fmt).bits)
    for rule, m in [("mma-fold", 16), ("mma-fold", 64), ("mma-fold", 128), ("mma-mw", 128), ("mma-mw", 256)]:
        kernel = mxgemm.build(**rule_kernel(rule, fmt, dtype, False, m, "cuda"))
        for start in (0, 7):
            cols = (torch.arange(m) * 97 + start * 31) % k
            x = torch.zeros(m, k, dtype=dt, device="cuda")
            x[torch.arange(m), cols] = 1
            y = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
            kernel(x, *planes, q.scales, y)
            want = w[:, cols].T.to(dt)
            assert torch.equal(y, want), (fmt, dtype, m, (y != want).nonzero()[:4].tolist())


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [1, 2])
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("fmt", PDL_FORMATS)
def test_gpu_pdl_chain(fmt, m, pdl):
    """Programmatic dependent launch: six launches of a ``pdl`` kernel (1: the next one let in at once,
    2: after the wait), each reading the output of the one before, captured in one CUDA graph (where a
    launch may start before its predecessor ends) give the eager chain bit for bit, and every link
    matches the reference."""
    n = PDL_N
    g = torch.Generator().manual_seed(11)
    q = mxgemm.quantize(torch.randn(n, n, generator=g) / n**0.5, fmt).to("cuda")
    kernel = mxgemm.build(**pdl_chain_kernel(fmt, m, "cuda", pdl))
    assert kernel.info["hints"]["pdl"] == pdl
    planes = ops._planes(q.blocks, mxgemm.formats.get(fmt).bits)
    ys = [torch.randn(m, n, generator=g).half().cuda()]
    ys += [torch.full((m, n), float("nan"), dtype=torch.half, device="cuda") for _ in range(6)]

    def chain():
        for a, b in itertools.pairwise(ys):
            builder.launch(kernel, [a, *planes, q.scales, b])

    eager = chain_replays_eagerly(chain, ys[1:])
    for a, b in itertools.pairwise([ys[0], *eager]):
        _check(a, q, None, b)


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_linear_small_m(fmt, dtype, bias):
    """`mxgemm.linear` at small M on shapes the rules tile, as `ops.plan` routes them."""
    for m in (1, 3, 5, 16, 17, 64):
        _run(fmt, dtype, bias, m, "cuda", n=TC_N, k=TC_K)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", CHUNK_FORMATS)
def test_cpu_decode_path_in_chunks(fmt, dtype, monkeypatch, no_cpu_dot):
    """Five or more rows on CPU without ``cpu_dot`` (a CPU without AVX-512): W
    decoded by the ``cpu_dequant`` kernel a 64-row chunk at a time (in the permuted K order, with x
    permuted to match), each chunk through torch's GEMM, bias per chunk: numerics, and one-hot rows
    give W's columns bit-exactly."""
    n, k = GEMV_N * 4, GEMV_K
    wbytes = ops.cpu_gemm_dtype(getattr(torch, dtype)).itemsize
    monkeypatch.setenv("MXGEMM_DECODE_CHUNK_MB", str(0.125 * wbytes))
    assert ops.decode_chunk_rows(n, k, ops.CPU_CHUNK_MB, k * wbytes) == GEMV_N
    assert ops.plan(5, "llvm", fmt, n, k, dtype) == ("decode", None)
    for m, bias in ((5, False), (17, True)):
        _run(fmt, dtype, bias, m, "cpu", n=n, k=k)
    q = _weights(fmt, n, k)
    x = torch.eye(k, dtype=getattr(torch, dtype))[:40]
    assert torch.equal(mxgemm.linear(x, q), mxgemm.dequantize(q).to(x.dtype)[:, :40].T), fmt


@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_decode_kernel_writes_every_code_and_scale_exactly(fmt, out):
    """The CPU decode kernel writes W in the permuted K order (`layout.k_permuted`) with every value
    the reference's, rounded once to ``out``: random codes of every value, scale codes 0 (2**-127)
    through 254 (NaN/inf element codes, never written by quantize, and scale 255 excluded)."""
    from mxgemm import layout

    f = mxgemm.formats.get(fmt)
    n, k = 16, 256
    q = every_code_weight(fmt, n, k, 3)
    kernel = mxgemm.build(fmt, n=n, k=k, a_dtype="bfloat16", out_dtype=out, target="llvm", op="decode")
    assert kernel.rule == "cpu_dequant"
    _, per, lanes = layout.cpu_group(f.bits, 32)
    w = torch.empty(n, k // (per * lanes), per, lanes, dtype=getattr(torch, out))
    kernel(*mxgemm.layout.transform_weight(q, kernel), w)
    want = layout.k_permuted(mxgemm.dequantize(q).to(w.dtype), f.bits, 32)
    assert torch.equal(w.view(n, k), want), fmt


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", CHUNK_FORMATS)
def test_gpu_decode_path_in_chunks(fmt, dtype, monkeypatch):
    """M > 16 on CUDA: W decoded a 64-row chunk at a time (a 256 KB chunk budget), each chunk through
    cuBLAS, bias added per chunk: numerics, and one-hot rows give W's columns bit-exactly."""
    monkeypatch.setenv("MXGEMM_DECODE_CHUNK_MB", "0.25")
    assert ops.decode_chunk_rows(GEMV_N * 4, GEMV_K) == GEMV_N
    for m, bias in ((17, False), (64, True)):
        _run(fmt, dtype, bias, m, "cuda", n=GEMV_N * 4, k=GEMV_K)
    q = _weights(fmt, GEMV_N * 4, GEMV_K).to("cuda")
    x = torch.eye(GEMV_K, dtype=getattr(torch, dtype), device="cuda")[:40]
    assert torch.equal(mxgemm.linear(x, q), mxgemm.dequantize(q).to(x.dtype)[:, :40].T), fmt


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", CHUNK_FORMATS)
def test_gpu_decode_kernel_writes_exactly_w(fmt):
    """The standalone decode kernel fills every element of W with the reference value and writes
    nothing past it (a ragged shape: 120 threads of work)."""
    q = _weights(fmt, N, K).to("cuda")
    kernel = mxgemm.build(fmt, n=N, k=K, a_dtype="bfloat16", target="cuda", op="decode")
    buf = torch.full((N * K + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    kernel(*ops._planes(q.blocks, mxgemm.formats.get(fmt).bits), q.scales, buf[: N * K].view(N, K))
    assert torch.equal(buf[: N * K].view(N, K), mxgemm.dequantize(q).to(torch.bfloat16)), fmt
    assert bool(buf[N * K :].isnan().all()), f"{fmt}: wrote past W"


@pytest.mark.gpu
def test_gpu_exact_decode_and_side_stream():
    """One-hot x on a side stream: bit-exact decode on the GPU, and the kernel runs on torch's stream."""
    s = torch.cuda.Stream()
    for fmt in FORMATS:
        q = _weights(fmt, N, K).to("cuda")
        with torch.cuda.stream(s):
            eye = torch.eye(K, dtype=torch.bfloat16, device="cuda")
            y = torch.cat([mxgemm.linear(x, q) for x in eye.split(MS[-1])])  # within the prebuilt buckets
        s.synchronize()
        assert torch.equal(y.cpu(), mxgemm.dequantize(q).T.to(torch.bfloat16).cpu()), fmt


# ---- bad input ------------------------------------------------------------------------------------


def test_bad_inputs():
    q = _weights("mxfp4", N, K)
    x = torch.randn(2, K, dtype=torch.float16)
    with pytest.raises(ValueError, match="last dimension must be k=96"):
        mxgemm.linear(torch.randn(2, K + 32, dtype=torch.float16), q)
    with pytest.raises(TypeError, match="float16 or bfloat16.*float32"):
        mxgemm.linear(x.float(), q)
    with pytest.raises(ValueError, match="bias must be torch.float16 \\[40\\]"):
        mxgemm.linear(x, q, torch.zeros(N + 1, dtype=torch.float16))
    with pytest.raises(ValueError, match="bias must be"):
        mxgemm.linear(x, q, torch.zeros(N, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="MxWeight"):
        mxgemm.linear(x, torch.zeros(N, K))
    with pytest.raises(ValueError, match="2-D"):
        mxgemm.linear(x, mxgemm.quantize(torch.randn(2, N, K), "mxfp4"))


def test_fp16_overflow_is_an_error_that_suggests_bf16():
    w = torch.randn(N, K) * 1e6  # decodes beyond float16's 65504
    q = mxgemm.quantize(w, "mxfp8_e4m3")
    with pytest.raises(ValueError, match="beyond float16's range.*bfloat16"):
        mxgemm.linear(torch.randn(1, K, dtype=torch.float16), q)
    x = torch.randn(1, K, dtype=torch.bfloat16)
    _check(x, q, None, mxgemm.linear(x, q))


@pytest.mark.parametrize(("n", "k"), [(0, 64), (64, 0), (0, 0)])
@pytest.mark.parametrize("bias", [False, True])
def test_empty_shapes_give_what_f_linear_gives(n, k, bias):
    q = mxgemm.quantize(torch.randn(n, k), "mxfp4")
    x = torch.randn(3, 2, k, dtype=torch.bfloat16)
    b = torch.randn(n, dtype=torch.bfloat16) if bias else None
    want = torch.nn.functional.linear(x, mxgemm.dequantize(q, torch.bfloat16), b)
    got = mxgemm.linear(x, q, b)
    assert got.shape == want.shape == (3, 2, n) and got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    layer = mxgemm.MxLinear(k, n, bias, a_dtype="bfloat16")
    assert torch.equal(
        layer(x), torch.nn.functional.linear(x, mxgemm.dequantize(layer.weight, torch.bfloat16), layer.bias)
    )
    with pytest.raises(TypeError, match="floating-point input, got torch.int64"):
        layer(torch.ones(3, k, dtype=torch.int64))


def test_fp16_range_check_is_not_skipped_for_a_weight_sharing_checked_scales():
    q = mxgemm.quantize(torch.randn(N, K) * 1e6, "mxfp8_e4m3")
    x = torch.randn(1, K, dtype=torch.float16)
    zero = dataclasses.replace(q, blocks=torch.zeros_like(q.blocks))  # same scales, decodes to 0: in range
    assert torch.equal(mxgemm.linear(x, zero), torch.zeros(1, N, dtype=torch.float16))
    with pytest.raises(ValueError, match="beyond float16's range"):
        mxgemm.linear(x, dataclasses.replace(zero, blocks=q.blocks.clone()))
    zero.blocks.copy_(q.blocks)  # the checked weight changed in place
    with pytest.raises(ValueError, match="beyond float16's range"):
        mxgemm.linear(x, zero)


@pytest.mark.gpu
def test_device_mismatch():
    q = _weights("mxfp4", N, K)
    with pytest.raises(ValueError, match="cuda.*cpu"):
        mxgemm.linear(torch.randn(1, K, dtype=torch.float16, device="cuda"), q)


# ---- torch integration ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3"])
def test_custom_op_opcheck(fmt):
    q = _weights(fmt, N, K)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    b = torch.randn(N, dtype=torch.bfloat16)
    planes = ops._planes(q.blocks, mxgemm.formats.get(fmt).bits)
    torch.library.opcheck(ops._linear, (x, planes, q.scales, b, q.fmt, q.block_size, N, K))


def test_compiles_without_graph_breaks():
    q = _weights("bfp8", N, K)

    def f(x):
        return torch.relu(mxgemm.linear(x, q)) * 2

    x = torch.randn(5, K, dtype=torch.bfloat16)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), f(x))


def _every_code_weight(fmt: str, device: str) -> mxgemm.MxWeight:
    """A [4, 256] weight holding every finite code of ``fmt`` (cycled), scales 2**-3 .. 2**3."""
    from mxgemm import formats, packing

    f = formats.get(fmt)
    codes = torch.arange(2**f.bits)
    codes = codes[torch.isfinite(f.decode(codes))]
    k = 256
    rows = torch.stack([codes.roll(r)[torch.arange(k) % len(codes)] for r in range(4)])
    scales = (127 + torch.arange(-3, 5)).repeat(4, 1)[:, : k // f.block_size].to(torch.uint8)
    q = mxgemm.MxWeight(packing.pack(rows.to(torch.uint8), f.bits), scales, fmt, f.block_size, (4, k))
    return q.to(device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_code_decodes_exactly(device):
    """One-hot x through the kernel returns each weight exactly (float32 products, one cast): every
    finite code of every format, against the format's own decode table and the oracle-checked scale."""
    for fmt in FORMATS:
        q = _every_code_weight(fmt, device)
        x = torch.eye(256, dtype=torch.bfloat16, device=device)
        for m in (1, 256) if device == "cuda" else (256,):
            y = mxgemm.linear(x[:m], q)
            assert torch.equal(y, mxgemm.dequantize(q).T[:m].to(torch.bfloat16)), (fmt, m)
