"""The ``mma`` kernel's K split over a cluster (``mma.Hints.ks``): ``ks`` blocks of one cluster each take a
``1/ks`` share of K, and the first adds the others' sums from their shared memory.

CPU: which hints take it, its shared memory, where the rule offers it, and the kernel's CUDA (a
cluster launch, two cluster barriers, the sums read across the cluster). GPU (Hopper): one-hot rows
give the reference's decoded weights exactly; blocks of one K warp give the bits of one block whose
``ks`` warps split K alike (the same fp32 sums in the same order), NaN scale codes included; blocks of
several K warps agree with one block to the fp32 sum order.
"""

import dataclasses

import pytest
import torch

import mxgemm
from mxgemm.codegen import build as builder
from mxgemm.codegen import mma
from mxgemm.codegen import target as targets
from mxgemm.rules import mma as mma_rule
from tests.hopper import assert_same_bits, binade_case, hopper, one_hot_case, run_mma

N, K = 512, 2048  # 64 steps: every case's warps take at least one ring iteration
# (hints with ks, M bucket, rows): one row with programmatic dependent launch, 4 rows with the scale
# table, 16 with folded scales and two K warps a block, 32 with the activations in the ring
CASES = [
    (mma.Hints(nt=1, kw=1, unroll=8, stages=2, pdl=2, ks=4), 1, 1),
    (mma.Hints(nt=2, kw=1, kn=2, unroll=4, stages=3, stab=1, ks=2), 4, 3),
    (mma.Hints(nt=2, kw=2, unroll=8, stages=2, fold=1, ks=2), 16, 13),
    (mma.Hints(nt=2, kw=1, kn=2, unroll=8, stages=2, xs=1, ks=2), 32, 29),
]
FORMATS = [("mxfp4", "float16"), ("mxfp4", "bfloat16"), ("mxfp8_e4m3", "float16"), ("mxint8", "bfloat16")]


def _unsplit(h: mma.Hints) -> mma.Hints:
    """One block whose K warps split K as the cluster's blocks and their warps do."""
    return dataclasses.replace(h, kw=h.kw * h.ks, ks=1)


# the kernels of the GPU tests, mxgemm.build's arguments, for tests.prebuild_gpu
PREBUILD = [
    dict(fmt=f, n=N, k=K, m_bucket=m, target="sm_90", hints=h.to_dict(), rule="mma", a_dtype=dt)
    for f, dt in FORMATS
    for hints, m, _ in CASES
    for h in (hints, _unsplit(hints))
]


def test_the_split_needs_a_ring_and_takes_shared_memory_for_the_sums():
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(stages=0, unroll=4, ks=2)
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(stages=2, unroll=8, ks=3)
    h = mma.Hints(nt=2, kw=4, kn=2, unroll=8, stages=2)
    for m_tile in (1, 16, 64):
        ring = mma.smem_bytes(h, m_tile, 4)[1]
        # after the cross-warp sum: every column's first K warp's fp32 fragments (2 tiles × n8 tiles)
        sums = (4 - 1) * 2 * 2 * -(-m_tile // 8) * 4 * 32 * 4 + 2 * 2 * -(-m_tile // 8) * 4 * 32 * 4
        assert mma.smem_bytes(dataclasses.replace(h, ks=2), m_tile, 4) == (0, max(ring, sums))


def test_the_rule_offers_the_split_where_the_grid_is_short():
    """K splits of 2 and 4 beside each ring candidate whose grid is under two blocks an SM (and whose
    warps' K still takes whole iterations); none beside a long grid; a split divides the warps' K."""
    sm90 = targets.resolve("sm_90")
    short = builder.KernelSpec("mxfp4", 4096, 4096, 16, "float16", "float16", False, 32, sm90)
    cands = mma_rule.RULE.candidates(short)
    split = [h for h in cands if h.ks > 1]
    assert split and all(h.stages and not h.minb for h in split)
    assert all(4096 // (16 * h.nt * h.kn) < 2 * 132 for h in split)
    assert {h.ks for h in split} == {2, 4}
    assert all((4096 // 32) % (h.kw * h.ks * h.unroll) == 0 for h in split)
    record = mma.Hints(nt=2, kw=2, kn=2, unroll=8, stages=2, stab=1, ldm=1, shl=1)
    assert dataclasses.replace(record, ks=2) in cands and dataclasses.replace(record, ks=4) in cands
    assert dataclasses.replace(record, kw=8, kn=1, ks=4) not in cands  # 256 steps of 128
    long = dataclasses.replace(short, n=57344)  # nt 1, kn 1: 3584 blocks
    assert not any(h.ks > 1 and h.nt * h.kn == 1 for h in mma_rule.RULE.candidates(long))


def test_the_rule_offers_every_case_split_and_unsplit():
    sm90 = targets.resolve("sm_90")
    for fmt, dtype in FORMATS:
        for hints, m_bucket, _ in CASES:
            spec = builder.KernelSpec(fmt, N, K, m_bucket, dtype, dtype, False, 32, sm90)
            cands = set(mma_rule.RULE.candidates(spec))
            assert hints in cands and _unsplit(hints) in cands, (fmt, dtype, hints)


def test_the_kernel_launches_a_cluster_and_adds_across_it():
    hints = CASES[2][0]
    k = mxgemm.build("mxfp4", n=N, k=K, m_bucket=16, target="sm_90", hints=hints.to_dict(), rule="mma")
    src = k.source
    assert src.count("mxgemm_cluster_sync();") == 2
    assert "ld.shared::cluster.v4.f32" in src
    # its definition, then a call per fragment: 2 tiles × 2 n8 tiles, from 1 other block
    assert src.count("mxgemm_dsmem_ld4(") == 1 + 2 * (16 // 8)
    plain = _unsplit(hints).to_dict()
    plain = mxgemm.build("mxfp4", n=N, k=K, m_bucket=16, target="sm_90", hints=plain, rule="mma")
    assert "cluster" not in plain.source


# ---- on a Hopper GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_one_hot_rows_give_the_decoded_weights(fmt, dtype, hints, m_bucket, rows):
    """Row ``i`` of X one-hot at K ``37 i + 5``: row ``i`` of Y is that column of the reference's
    decoded W (``reference.dequantize``, exact in the activation dtype), bit for bit."""
    x, q, want = one_hot_case(fmt, dtype, rows, N, K, seed=16)
    assert torch.equal(run_mma(hints, m_bucket, x, q, fmt, N, K), want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_the_split_adds_what_one_block_adds(fmt, dtype, hints, m_bucket, rows):
    """Blocks scaled over 2**-20..1, scale code 255 (NaN) on row 9, activations over 2**±6: with one K
    warp a block, the bits of one block of ``ks`` K warps (the same sums, added in the same order),
    NaN on row 9 alone; with more, the same to the order of the fp32 sums."""
    x, q = binade_case(fmt, dtype, rows, N, K, seed=17)
    y, want = (run_mma(h, m_bucket, x, q, fmt, N, K) for h in (hints, _unsplit(hints)))
    if hints.kw == 1:
        assert_same_bits(y, want)
        return
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(y)) and not finite[:, 9].any()
    scale = want[finite].float().abs().amax()
    torch.testing.assert_close(y[finite].float(), want[finite].float(), rtol=2**-7, atol=2**-12 * scale)
