"""The ``mma`` kernel's 4-bit codes by ``ldmatrix`` (``mma.Hints.ldm``): a warp's 16 rows of two
steps of a ring slot's 4-bit plane, the A fragment's words, in one ``ldmatrix.x4`` (one step in an
``.x2``) instead of a 32-bit load a row and step.

CPU: which hints take it, the rule's candidates and twins (formats with a 4-bit plane only), and
(nvcc) the one-row kernel's PTX: a quarter of the code loads. GPU (Hopper): the same output bits as
the kernel without it for each format with a 4-bit plane (4; 4 and 2; 4, 2 and 1), at 1, 4, 16 (one
step a load: the ``.x2``) and 32 rows; one-hot rows give the reference's decoded weights exactly.
"""

import dataclasses
import re

import pytest
import torch

import mxgemm
from mxgemm.codegen import build as builder
from mxgemm.codegen import mma
from mxgemm.codegen import target as targets
from mxgemm.rules import mma as mma_rule
from tests import ptxas
from tests.hopper import (
    assert_same_bits,
    binade_case,
    hopper,
    one_hot_case,
    option_cases,
    prebuild_pairs,
    run_mma,
)

N, K = 512, 2048
CASES = option_cases("ldm")  # (hints with ldm, M bucket, rows)
FORMATS = [("mxfp4", "float16"), ("mxfp4", "bfloat16"), ("mxfp6_e2m3", "float16"), ("bfp7", "bfloat16")]
# the kernels of the GPU tests, mxgemm.build's arguments, for tests.prebuild_gpu
PREBUILD = prebuild_pairs("ldm", CASES, FORMATS, N, K)


def test_ldmatrix_needs_a_ring_without_fragment_order():
    for bad in (dict(stages=0, unroll=4), dict(stages=2, unroll=8, frag=1)):
        with pytest.raises(ValueError, match="mma hints out of range"):
            mma.Hints(**bad, ldm=1)
    h = mma.Hints(nt=2, kw=4, kn=2, unroll=8, stages=3)
    assert mma.smem_bytes(dataclasses.replace(h, ldm=1), 1, 4) == mma.smem_bytes(h, 1, 4)


def test_the_rule_offers_ldmatrix_beside_each_ring_candidate_of_a_4_bit_plane():
    """mxfp6_e2m3 (planes of 4 and 2 bits): every ring candidate has its twin with ``ldm``, and a
    record's twins include it; the register pipeline never takes it; mxfp8_e4m3 (no 4-bit plane):
    no candidate takes it."""
    sm90 = targets.resolve("sm_90")
    spec = builder.KernelSpec("mxfp6_e2m3", 4096, 4096, 4, "float16", "float16", False, 32, sm90)
    cands = mma_rule.RULE.candidates(spec)
    matrices = {h for h in cands if h.ldm}
    rings = [h for h in cands if h.stages and not h.ldm]
    assert matrices and {dataclasses.replace(h, ldm=1) for h in rings} == matrices
    record = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2)
    assert dataclasses.replace(record, ldm=1) in mma_rule.RULE.twins(spec, record)
    spec8 = dataclasses.replace(spec, fmt="mxfp8_e4m3")
    assert not any(h.ldm for h in mma_rule.RULE.candidates(spec8))


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
def test_the_gpu_cases_are_candidates(fmt, dtype):
    """The GPU tests' hints, with and without ``ldm``, are the rule's candidates for their kernels
    (a hint set that is not would be built with the defaults instead)."""
    sm90 = targets.resolve("sm_90")
    for hints, m_bucket, _ in CASES:
        spec = builder.KernelSpec(fmt, N, K, m_bucket, dtype, dtype, False, 32, sm90)
        cands = set(mma_rule.RULE.candidates(spec))
        assert hints in cands and dataclasses.replace(hints, ldm=0) in cands


@pytest.mark.nvcc
def test_ldmatrix_quarters_the_code_loads(tmp_path):
    """The one-row ring kernel (8 steps, one 16-row tile of mxfp4): 4 ``ldmatrix.x4`` instead of 16
    32-bit loads of codes, and fewer integer ops (their addresses)."""

    def ptx(hints):
        k = mxgemm.build("mxfp4", n=N, k=K, m_bucket=1, target="sm_90", hints=hints.to_dict(), rule="mma")
        return ptxas.ptx(k.source, tmp_path, arch="sm_90")

    matrices, plain = ptx(CASES[0][0]), ptx(dataclasses.replace(CASES[0][0], ldm=0))
    loads = lambda text: len(re.findall(r"ld\.shared\.b32", text))  # noqa: E731
    ops = lambda text: len(re.findall(r"^\s*(?:add|shl|xor|mul|and|or)\.", text, re.M))  # noqa: E731
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", matrices)) == 4
    assert "ldmatrix" not in plain and loads(plain) >= 16 and loads(matrices) == loads(plain) - 16
    assert ops(matrices) < ops(plain)


# ---- on a Hopper GPU -------------------------------------------------------------------------------


def _run(hints: mma.Hints, m_bucket: int, x: torch.Tensor, q, fmt: str) -> torch.Tensor:
    return run_mma(hints, m_bucket, x, q, fmt, N, K)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_ldmatrix_gives_the_same_bits(fmt, dtype, hints, m_bucket, rows):
    """Blocks scaled over 2**-20..1, scale code 255 (NaN) on row 9, activations over 2**±6: the bits
    of the kernel without ``ldm``."""
    x, q = binade_case(fmt, dtype, rows, N, K, seed=16)
    y = _run(hints, m_bucket, x, q, fmt)
    assert_same_bits(y, _run(dataclasses.replace(hints, ldm=0), m_bucket, x, q, fmt))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_ldmatrix_one_hot_rows_give_the_decoded_weights(fmt, dtype, hints, m_bucket, rows):
    """Row ``i`` of X one-hot at K ``37 i + 5``: row ``i`` of Y is that column of the reference's
    decoded W (``reference.dequantize``, exact in the activation dtype), bit for bit."""
    x, q, want = one_hot_case(fmt, dtype, rows, N, K, seed=17)
    assert torch.equal(_run(hints, m_bucket, x, q, fmt), want)
