"""The ``mma`` kernel's faster decodes: 8-bit float codes into fp16 by one ``cvt`` a pair, into bf16
by that and a widening (``mma.Hints.cvt``, :func:`mxgemm.codegen.pairs.cvt_pair`); fp4 into fp16 by
one sign-replicating byte permute, a shift and a mask a pair (the plain decode, which ``quad``, now
retired, named).

CPU: which hints and formats take ``cvt``, the rule's twins, a tune record naming the retired
``quad``, and (nvcc) the ops in the kernel's PTX. GPU (Hopper): the same output bits as the kernel
without ``cvt`` on the ring (one row, PDL), the register pipeline (4 rows), 16 rows and 32 rows with
the activations in the ring, with block scales over 16 binades (fp16 and bf16); an e4m3 NaN code
gives NaN.
"""

import dataclasses
import re

import pytest
import torch

import mxgemm
from mxgemm import formats, reference, rules
from mxgemm.codegen import build as builder
from mxgemm.codegen import mma, pairs
from mxgemm.codegen import target as targets
from mxgemm.rules import mma as mma_rule
from tests import ptxas
from tests.hopper import hopper, run_mma

N, K = 512, 2048  # (8 warps splitting K take 8 steps each: one ring iteration)
# (hints with cvt, M bucket, rows)
CVT_CASES = [
    (mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, cvt=1), 1, 1),
    (mma.Hints(nt=2, kw=4, unroll=4, stages=0, cvt=1), 4, 3),
    (mma.Hints(nt=2, kw=4, unroll=8, stages=2, cvt=1), 16, 13),
    (mma.Hints(nt=2, kw=1, kn=8, unroll=8, stages=2, xs=1, cvt=1), 32, 29),
]
CVT_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2")
# the kernels of the GPU tests, mxgemm.build's arguments, for tests.prebuild_gpu
PREBUILD = [
    dict(fmt=f, n=N, k=K, m_bucket=m, target="sm_90", hints=h, rule="mma", a_dtype=dt)
    for f in CVT_FORMATS
    for dt in ("float16", "bfloat16")
    for hints, m, _ in CVT_CASES
    for h in (hints.to_dict(), dataclasses.replace(hints, cvt=0).to_dict())
]


def test_cvt_takes_its_formats_only():
    """e4m3 / e5m2 into fp16 or bf16, never folded (the fold's multipliers are made for
    :func:`~mxgemm.codegen.pairs.decode_pair`'s pairs)."""
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(cvt=2)
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(stages=2, unroll=8, fold=1, cvt=1)
    hints = mma.Hints(nt=1, kw=8, unroll=8, stages=2, cvt=1)
    for fmt, dtype in [("mxfp6_e3m2", "bfloat16"), ("mxfp4", "float16"), ("mxint8", "float16")]:
        with pytest.raises(ValueError, match=f"{fmt} codes in {dtype} take no cvt of fp8 pairs"):
            mma.kernel(formats.get(fmt), n=N, k=K, m_tile=1, out_dtype=dtype, bias=False, block_size=32,
                       hints=hints, a_dtype=dtype)  # fmt: skip


def test_the_rule_offers_cvt_as_a_twin_for_its_formats():
    """Candidates with ``cvt`` exist exactly for e4m3 / e5m2 in fp16 and bf16 (never with ``shl``,
    which it makes moot, nor with ``fold``); a record without it has the twin with it (``shl``
    dropped)."""
    offered = {(f, dt) for f in CVT_FORMATS for dt in ("float16", "bfloat16")}
    record = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, shl=1)
    for fmt in ("mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"):
        for dtype in ("float16", "bfloat16"):
            spec = builder.KernelSpec(fmt, 4096, 4096, 1, dtype, dtype, False, 32, targets.resolve("sm_90"))
            on = [h for h in mma_rule.RULE.candidates(spec) if h.cvt]
            assert bool(on) == ((fmt, dtype) in offered) and not any(h.shl or h.fold for h in on)
            twin = dataclasses.replace(record, shl=0, cvt=1)
            assert (twin in mma_rule.RULE.twins(spec, record)) == ((fmt, dtype) in offered)


def test_a_record_naming_the_retired_quad_types_without_it():
    """``quad`` (fp4 into fp16 four pairs a word) built the plain decode's kernel on every record that
    named it, so it was retired: a log's hints with it type as the same hints without it."""
    hints = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2)
    with pytest.raises(TypeError):
        mma.Hints(quad=1)
    config = {**hints.to_dict(), "quad": 1}
    assert mma_rule.RULE.typed(config) == hints and rules.hints_problem("mma", config) is None


def test_cvt_and_fold_twins_exclude_each_other():
    record = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, shl=1)
    # a record with cvt has no folded twin (cvt and fold do not go together), a folded one no cvt twin
    spec = builder.KernelSpec(
        "mxfp8_e4m3", 28672, 8192, 1, "float16", "float16", False, 32, targets.resolve("sm_90")
    )
    cvt = dataclasses.replace(record, shl=0, cvt=1)
    assert dataclasses.replace(record, pdl=2, shl=0, cvt=1) in mma_rule.RULE.twins(
        spec, dataclasses.replace(cvt, pdl=1)
    )
    assert not any(t.fold for t in mma_rule.RULE.twins(spec, cvt))
    assert not any(t.cvt for t in mma_rule.RULE.twins(spec, dataclasses.replace(record, fold=1)))


def _ptx(tmp_path, fmt, hints, dtype="float16") -> str:
    k = mxgemm.build(fmt, n=N, k=K, m_bucket=1, target="sm_90", hints=hints, rule="mma", a_dtype=dtype)
    return ptxas.ptx(k.source, tmp_path, arch="sm_90")


@pytest.mark.nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", CVT_FORMATS)
def test_cvt_converts_each_pair_once(tmp_path, fmt, dtype):
    """The one-row ring kernel (8 warps, one iteration of 8 steps, one 16-row tile): one
    ``cvt.rn.f16x2`` a pair (2 rows × 8 steps × 4 pairs a lane) and fewer shifts and logic ops."""
    ops = lambda text: len(re.findall(r"^\s*(?:shl|shr|and|or|xor|lop3|prmt)\.", text, re.M))  # noqa: E731
    hints = CVT_CASES[0][0]
    cvt = _ptx(tmp_path, fmt, hints.to_dict(), dtype)
    plain = _ptx(tmp_path, fmt, dataclasses.replace(hints, cvt=0).to_dict(), dtype)
    assert len(re.findall(rf"cvt\.rn\.f16x2\.{pairs.CVT[fmt]}", cvt)) == 2 * 8 * 4
    assert "cvt.rn.f16x2" not in plain and ops(cvt) < ops(plain)


@pytest.mark.nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("fmt", "six"), [("mxfp6_e2m3", True), ("mxfp6_e3m2", True), ("bfp6", False)])
def test_six_bit_float_pairs_come_from_a_code_a_byte(tmp_path, fmt, six, dtype):
    """6-bit float codes: every pair of the one-row ring kernel (2 rows × 8 steps × 4 pairs a lane) is
    cut from the step's even and odd code bytes (:func:`pairs.six_words`), each made by one ``lop3``
    select (two a pair in the PTX, shared by ptxas); 6-bit integers (bfp6) keep the plane-wise decode."""
    hints = dataclasses.replace(CVT_CASES[0][0], cvt=0)
    ptx = _ptx(tmp_path, fmt, hints.to_dict(), dtype)
    assert len(re.findall(r"lop3\.b32[^;]*0xE4;", ptx)) == (2 * (2 * 8 * 4) if six else 0)


# ---- on a Hopper GPU -------------------------------------------------------------------------------


def _run(hints: mma.Hints, m_bucket: int, x: torch.Tensor, q, fmt: str = "mxfp4") -> torch.Tensor:
    return run_mma(hints, m_bucket, x, q, fmt, N, K)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", CVT_FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CVT_CASES)
def test_gpu_cvt_gives_the_same_bits(fmt, hints, m_bucket, rows, dtype):
    """Weights whose blocks are scaled over 2**-16..1, activations over 2**-6..4: the bits of the
    kernel without ``cvt`` (whose pairs are the values times ``2**(bias - 15)``, brought back per
    output)."""
    torch.manual_seed(12)
    binades = torch.randint(-16, 1, (N, K // 32), device="cuda").repeat_interleave(32, 1)
    q = reference.quantize(torch.randn(N, K, device="cuda") * 2.0**binades, fmt)
    binades = torch.randint(-6, 3, (rows, 1), device="cuda")
    x = (torch.randn(rows, K, device="cuda") * 2.0**binades).to(dtype)
    y = _run(hints, m_bucket, x, q, fmt)
    want = _run(dataclasses.replace(hints, cvt=0), m_bucket, x, q, fmt)
    assert torch.isfinite(want).all() and torch.equal(y, want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_cvt_gives_nan_for_an_e4m3_nan_code(dtype):
    """An e4m3 NaN element code (0x7F; quantize never writes one) gives NaN in its output column, as
    the OCP spec and ml_dtypes decode it; the other outputs (one-hot row: the weights themselves) finite."""
    torch.manual_seed(13)
    q = reference.quantize(torch.randn(N, K, device="cuda"), "mxfp8_e4m3")
    q.blocks[3, 100] = 0x7F
    x = torch.zeros(1, K, dtype=dtype, device="cuda")
    x[0, 100] = 1.0
    y = _run(CVT_CASES[0][0], 1, x, q, "mxfp8_e4m3")[0]
    assert y[3].isnan() and torch.isfinite(torch.cat([y[:3], y[4:]])).all()
