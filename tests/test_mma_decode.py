"""The ``mma`` kernel's faster decodes: fp4 codes into fp16 four pairs a word (``mma.Hints.quad``,
:func:`mxgemm.codegen.pairs.decode_quad`) and 8-bit float codes into fp16 by one ``cvt`` a pair, into
bf16 by that and a widening (``mma.Hints.cvt``, :func:`mxgemm.codegen.pairs.cvt_pair`).

CPU: which hints and formats take them, the rule's twins, and (nvcc) fewer integer ops in the
kernel's PTX (``cvt``: one conversion a pair). GPU (Hopper): the same output bits as the kernel
without them, on the ring (one row, PDL), the register pipeline (4 rows), 16 rows (``quad``: folded
scales) and 32 rows with the activations in the ring, with a block the fold cannot take
(``quad``) or block scales over 16 binades (``cvt``, fp16 and bf16); an e4m3 NaN code gives NaN
(``cvt``).
"""

import dataclasses
import re

import pytest
import torch

import mxgemm
from mxgemm import formats, reference
from mxgemm.codegen import build as builder
from mxgemm.codegen import mma, pairs
from mxgemm.codegen import target as targets
from mxgemm.rules import mma as mma_rule
from tests import ptxas
from tests.hopper import hopper, run_mma

N, K = 512, 2048  # (8 warps splitting K take 8 steps each: one ring iteration)
# (hints with quad, M bucket, rows)
CASES = [
    (mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, quad=1), 1, 1),
    (mma.Hints(nt=2, kw=4, unroll=4, stages=0, quad=1), 4, 3),
    (mma.Hints(nt=2, kw=4, unroll=8, stages=2, fold=1, quad=1), 16, 13),
    (mma.Hints(nt=2, kw=1, kn=8, unroll=8, stages=2, fold=1, xs=1, quad=1), 32, 29),
]
# (hints with cvt, M bucket, rows): as CASES, without folded scales
CVT_CASES = [(dataclasses.replace(h, quad=0, fold=0, cvt=1), m, rows) for h, m, rows in CASES]
CVT_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2")
# the kernels of the GPU tests, mxgemm.build's arguments, for tests.prebuild_gpu
PREBUILD = [
    dict(fmt="mxfp4", n=N, k=K, m_bucket=m, target="sm_90", hints=h, rule="mma")
    for hints, m, _ in CASES
    for h in (hints.to_dict(), dataclasses.replace(hints, quad=0).to_dict())
]
PREBUILD += [
    dict(fmt=f, n=N, k=K, m_bucket=m, target="sm_90", hints=h, rule="mma", a_dtype=dt)
    for f in CVT_FORMATS
    for dt in ("float16", "bfloat16")
    for hints, m, _ in CVT_CASES
    for h in (hints.to_dict(), dataclasses.replace(hints, cvt=0).to_dict())
]


@pytest.mark.parametrize(
    ("option", "why", "declined"),
    [
        (
            "quad",
            "are not decoded four pairs a word",
            [("mxfp4", "bfloat16"), ("mxfp6_e2m3", "float16"), ("mxint8", "float16")],
        ),
        (
            "cvt",
            "take no cvt of fp8 pairs",
            [("mxfp6_e3m2", "bfloat16"), ("mxfp4", "float16"), ("mxint8", "float16")],
        ),
    ],
)
def test_each_decode_takes_its_formats_only(option, why, declined):
    """``quad``: fp4 into fp16; ``cvt``: e4m3 / e5m2 into fp16 or bf16, never folded (the fold's multipliers
    are made for :func:`~mxgemm.codegen.pairs.decode_pair`'s pairs)."""
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(**{option: 2})
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(stages=2, unroll=8, fold=1, cvt=1)
    hints = mma.Hints(nt=1, kw=8, unroll=8, stages=2, **{option: 1})
    for fmt, dtype in declined:
        with pytest.raises(ValueError, match=f"{fmt} codes in {dtype} {why}"):
            mma.kernel(formats.get(fmt), n=N, k=K, m_tile=1, out_dtype=dtype, bias=False, block_size=32,
                       hints=hints, a_dtype=dtype)  # fmt: skip


@pytest.mark.parametrize(
    ("option", "offered"),
    [
        ("quad", {("mxfp4", "float16")}),
        ("cvt", {(f, dt) for f in ("mxfp8_e4m3", "mxfp8_e5m2") for dt in ("float16", "bfloat16")}),
    ],
)
def test_the_rule_offers_each_decode_as_a_twin_for_its_formats(option, offered):
    """Candidates with the option exist exactly for its formats and dtype (never with ``shl``, which
    it makes moot, nor ``cvt`` with ``fold``); a record without it has the twin with it (``shl``
    dropped)."""
    record = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, shl=1)
    for fmt in ("mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"):
        for dtype in ("float16", "bfloat16"):
            spec = builder.KernelSpec(fmt, 4096, 4096, 1, dtype, dtype, False, 32, targets.resolve("sm_90"))
            cands = mma_rule.RULE.candidates(spec)
            on = [h for h in cands if getattr(h, option)]
            assert bool(on) == ((fmt, dtype) in offered) and not any(h.shl or (h.cvt and h.fold) for h in on)
            twin = dataclasses.replace(record, shl=0, **{option: 1})
            assert (twin in mma_rule.RULE.twins(spec, record)) == ((fmt, dtype) in offered)


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
def test_quad_and_the_plain_decode_issue_the_same_ops(tmp_path):
    """The one-row ring kernel's PTX: fp4 pairs are one sign-replicating byte permute, a shift and a
    mask each, with ``quad`` or without it (the four-at-once decode ``quad`` named took more time)."""

    def integer_ops(hints):
        text = _ptx(tmp_path, "mxfp4", hints)
        ops = len(re.findall(r"^\s*(?:shl|shr|and|or|xor|lop3)\.", text, re.M))
        return ops, len(re.findall(r"^\s*prmt\.", text, re.M))

    quad = CASES[0][0]
    assert integer_ops(quad.to_dict()) == integer_ops(dataclasses.replace(quad, quad=0).to_dict())


# ---- on a Hopper GPU -------------------------------------------------------------------------------


def _run(hints: mma.Hints, m_bucket: int, x: torch.Tensor, q, fmt: str = "mxfp4") -> torch.Tensor:
    return run_mma(hints, m_bucket, x, q, fmt, N, K)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_quad_gives_the_same_bits(hints, m_bucket, rows):
    """Weights whose rows' scales fold, one 32-block scaled 2**-60 below its row (too many binades to
    fold: that warp runs the plain loop), activations spanning 2**±8: the bits of the kernel without
    ``quad``."""
    torch.manual_seed(11)
    w = torch.randn(N, K, device="cuda") * 0.05
    w[5, 64:96] *= 2.0**-60
    q = reference.quantize(w, "mxfp4")
    x = (torch.randn(rows, K, device="cuda") * 2.0 ** torch.randint(-8, 9, (rows, 1), device="cuda")).half()
    y = _run(hints, m_bucket, x, q)
    want = _run(dataclasses.replace(hints, quad=0), m_bucket, x, q)
    assert torch.isfinite(want).all() and torch.equal(y, want)


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
