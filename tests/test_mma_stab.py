"""The ``mma`` kernel's scale table (``mma.Hints.stab``): a ring slot's block scales made floats once a
warp into shared memory (the 4 lanes of a quad hold the same rows), read 4 steps at a time, and at
one row only the fragment's stored column scaled.

CPU: which hints take it, its shared memory, the rule's candidates and twins, and (nvcc) the one-row
kernel's PTX: fewer integer ops and half the fp32 multiply-adds of the step's scaling. GPU (Hopper):
the same output bits as the kernel without it (one row with PDL, 4 rows, 16 rows with folded scales
and a block the fold cannot take, 32 rows with the activations in the ring), with scale codes 0, 255
(NaN) and spread over many binades; one-hot rows give the reference's decoded weights exactly.
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

N, K = 512, 2048  # (8 warps splitting K take 8 steps each: one ring iteration)
CASES = option_cases("stab")  # (hints with stab, M bucket, rows)
FORMATS = [("mxfp4", "float16"), ("mxfp4", "bfloat16"), ("mxfp8_e4m3", "float16"), ("mxint8", "bfloat16")]
# the kernels of the GPU tests, mxgemm.build's arguments, for tests.prebuild_gpu
PREBUILD = prebuild_pairs("stab", CASES, FORMATS, N, K)


def test_the_table_needs_a_ring_and_takes_its_shared_memory():
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(stages=0, unroll=4, stab=1)
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(stages=2, unroll=8, stab=2)
    h = mma.Hints(nt=2, kw=4, kn=2, unroll=8, stages=3)
    for m_tile in (1, 16):
        static, dynamic = mma.smem_bytes(h, m_tile, 4)
        # a float per row (2 tiles of 16) and step (8) for each of the 8 warps
        assert mma.smem_bytes(dataclasses.replace(h, stab=1), m_tile, 4) == (static, dynamic + 8 * 32 * 8 * 4)


def test_the_rule_offers_the_table_beside_each_ring_candidate():
    """Every ring candidate has its twin with the table where the table's bytes still fit, and a
    record's twins include it; the register pipeline never takes it."""
    sm90 = targets.resolve("sm_90")
    spec = builder.KernelSpec("mxfp4", 4096, 4096, 1, "float16", "float16", False, 32, sm90)
    cands = mma_rule.RULE.candidates(spec)
    tables = {h for h in cands if h.stab}
    rings = [h for h in cands if h.stages and not h.stab]
    assert tables and all(h.stages for h in tables)
    fits = [h for h in rings if mma_rule.smem_fits(dataclasses.replace(h, stab=1), 1, 4, mma.RING_SMEM)]
    assert {dataclasses.replace(h, stab=1) for h in fits} == tables
    record = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2)
    assert dataclasses.replace(record, stab=1) in mma_rule.RULE.twins(spec, record)


def _ptx(tmp_path, hints: mma.Hints) -> str:
    k = mxgemm.build("mxfp4", n=N, k=K, m_bucket=1, target="sm_90", hints=hints.to_dict(), rule="mma")
    return ptxas.ptx(k.source, tmp_path, arch="sm_90")


@pytest.mark.nvcc
def test_the_table_cuts_the_one_row_steps_scaling(tmp_path):
    """The one-row ring kernel (8 warps, one iteration of 8 steps, one 16-row tile): with the table,
    one fp32 multiply-add a row and step (the stored column) instead of two, and fewer integer ops
    (a lane converts one word of 4 codes, not its 2 rows' 8 codes)."""
    ops = lambda text: len(re.findall(r"^\s*(?:shl|shr|and|or|max)\.", text, re.M))  # noqa: E731
    fmas = lambda text: len(re.findall(r"^\s*fma\.rn\.f32", text, re.M))  # noqa: E731
    hints = CASES[0][0]
    table, plain = _ptx(tmp_path, hints), _ptx(tmp_path, dataclasses.replace(hints, stab=0))
    assert fmas(plain) == 8 * 2 * 2 and fmas(table) == 8 * 2  # steps × rows × columns
    assert ops(table) < ops(plain)
    assert "st.shared.v4.b32" in table and "st.shared.v4.b32" not in plain


# ---- on a Hopper GPU -------------------------------------------------------------------------------


def _run(hints: mma.Hints, m_bucket: int, x: torch.Tensor, q, fmt: str) -> torch.Tensor:
    return run_mma(hints, m_bucket, x, q, fmt, N, K)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_the_table_gives_the_same_bits(fmt, dtype, hints, m_bucket, rows):
    """Blocks scaled over 2**-20..1 (row 5: one block 2**-60 below the rest, too far to fold), scale
    code 0 (2**-127) on row 7 and 255 (NaN) on row 9, activations over 2**±6: the bits of the kernel
    without the table, NaN on row 9 alone."""
    x, q = binade_case(fmt, dtype, rows, N, K, seed=14, tweak=lambda w: w[5, 64:96].mul_(2.0**-60))
    q.scales[7, 3] = 0
    y = _run(hints, m_bucket, x, q, fmt)
    assert_same_bits(y, _run(dataclasses.replace(hints, stab=0), m_bucket, x, q, fmt))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_one_hot_rows_give_the_decoded_weights(fmt, dtype, hints, m_bucket, rows):
    """Row ``i`` of X one-hot at K ``37 i + 5``: row ``i`` of Y is that column of the reference's
    decoded W (``reference.dequantize``, exact in the activation dtype), bit for bit."""
    x, q, want = one_hot_case(fmt, dtype, rows, N, K, seed=15)
    assert torch.equal(_run(hints, m_bucket, x, q, fmt), want)
