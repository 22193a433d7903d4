"""The decode-fused wgmma GEMM (mxgemm.codegen.wgmma_w) and its rule (mxgemm.rules.wgmma_w).

CPU: hint and shape checks, and (nvcc) that ptxas keeps its wgmmas asynchronous and spills nothing.
GPU (Hopper): against a float64 product of the oracle's dequantized weights (ml_dtypes), folded and
unfolded (rows whose scales span more binades than the fold allows, NaN scales), one-hot activation
rows bit for bit (which also pins the K order each lane gathers from the portable codes).
"""

import dataclasses
import itertools
import re
import subprocess

import numpy as np
import pytest
import torch

import mxgemm
from mxgemm import formats, layout, ops, packing, reference, rules, tunelog
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets
from mxgemm.codegen import wgmma_w
from tests import oracle, ptxas
from tests.hopper import hopper
from tests.linear_cases import chain_replays_eagerly


def test_applies_names_the_problem():
    fp4, fp6 = formats.get("mxfp4"), formats.get("mxfp6_e2m3")
    assert wgmma_w.applies(fp4, 8192, 8192, "float16") is None
    assert wgmma_w.applies(fp6, 8192, 8192, "float16") is None  # two planes: 4 and 2 bits
    assert "planes of (4, 1) bits" in wgmma_w.applies(formats.get("bfp5"), 8192, 8192, "float16")
    frag = wgmma_w.applies(fp6, 8192, 8192, "float16", wgmma_w.Hints(frag=1))
    assert "fragment order takes one plane of 4 or 8 bits" in frag
    assert "N=192 is not a multiple of 128" in wgmma_w.applies(fp4, 192, 8192, "float16")
    assert "K=384 is not a multiple of 256" in wgmma_w.applies(fp4, 256, 384, "float16")
    assert "exceed" in wgmma_w.applies(fp4, 256, 512, "float16", wgmma_w.Hints(2, 6, 1))
    assert "spill" in wgmma_w.applies(fp4, 768, 512, "float16", wgmma_w.Hints(3, 4, 1, mt=128))
    assert "spill" in wgmma_w.applies(fp4, 768, 512, "float16", wgmma_w.Hints(3, 3, 1, mt=256))
    assert wgmma_w.applies(fp4, 256, 512, "float16", wgmma_w.Hints(2, 3, 1, mt=256)) is None
    fp8 = formats.get("mxfp8_e4m3")
    assert "exceed" in wgmma_w.applies(fp8, 256, 512, "float16", wgmma_w.Hints(2, 3, 1, mt=256))
    split = wgmma_w.Hints(1, 4, 1, mt=64, splits=4)
    assert "K=1536 is not a multiple of 4 ranges of 256" in wgmma_w.applies(fp4, 256, 1536, "float16", split)
    assert wgmma_w.applies(fp4, 256, 2048, "float16", split) is None
    ring = wgmma_w.Hints(2, 4, 1, mt=128, ring=1)  # 4 slots of 41 KB + 1 KB of barriers fit; 6 do not
    assert wgmma_w.applies(fp4, 256, 512, "float16", ring) is None
    six = wgmma_w.Hints(2, 6, 1, ring=1)
    assert "and the barriers exceed" in wgmma_w.applies(fp4, 256, 512, "float16", six)
    for bad in (dict(wg=5), dict(mt=512), dict(stages=2), dict(splits=3), dict(ring=2), dict(tma=3)):
        with pytest.raises(ValueError, match="wg 1..4"):
            wgmma_w.Hints(**bad)
    with pytest.raises(ValueError, match="with ring 1"):  # TMA completes on the ring's mbarriers
        wgmma_w.Hints(tma=1)
    with pytest.raises(ValueError, match=r"early 0\|1 \(1 with sk 0\)"):  # stream-K scans after the loads
        wgmma_w.Hints(ring=1, sk=1, early=1)
    with pytest.raises(ValueError, match=r"frag 0\|1"):
        wgmma_w.Hints(frag=2)
    for bad in (dict(sk=1), dict(sk=1, ring=1, splits=2), dict(sk=3, ring=1)):  # stream-K: ring, unsplit
        with pytest.raises(ValueError, match=r"sk 0\|1\|2 \(with ring 1 and splits 1\)"):
            wgmma_w.Hints(**bad)
    # warp 0 or a producer warpgroup refills the ring by TMA (the producer: beside 1 or 2 warpgroups)
    for kw in (dict(tma=1), dict(tma=2, prod=3), dict(tma=2, prod=2, wg=3, mt=64)):
        with pytest.raises(ValueError, match=r"prod 0\|1\|2 \(with tma 2; 2 with wg 1\|2\)"):
            wgmma_w.Hints(**{"ring": 1, "prod": 1, **kw})
    two = wgmma_w.Hints(1, 4, 1, mt=64, ring=1, tma=2, sk=2, prod=2)  # 2 × 256 threads × 148 registers
    assert "do not fit an SM's registers" in wgmma_w.applies(fp4, 256, 512, "float16", two)
    sk = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, sk=1)  # (its unfolded sums kept in memory)
    assert wgmma_w.applies(fp4, 256, 512, "float16", sk) is None
    small = wgmma_w.Hints(1, 4, 1, mt=16, ring=1, tma=2, sk=1)  # 16 × 64 outputs: the fixup takes 2048
    assert "stream-K's fixup takes tiles of 2048 outputs" in wgmma_w.applies(fp4, 256, 512, "float16", small)
    assert wgmma_w.applies(fp4, 256, 512, "float16", dataclasses.replace(small, wg=2)) is None
    two = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=2)  # 165 KB a block: one an SM
    assert "two blocks of 168960 bytes" in wgmma_w.applies(fp4, 256, 512, "float16", two)
    assert wgmma_w.applies(fp4, 256, 512, "float16", wgmma_w.Hints(1, 4, 1, mt=64, ring=1, sk=2)) is None
    with pytest.raises(ValueError, match=r"cluster 0\|1 \(1 with splits > 1\)"):  # a cluster adds splits
        wgmma_w.Hints(cluster=1)
    # the parts of a cluster's splits go to the ring's slots: 256 rows × (128 + 4) fp32 in 3 × 74 KB
    big = wgmma_w.Hints(2, 3, 1, mt=256, splits=2, ring=1, tma=2, prod=2, cluster=1)
    assert big.partial_bytes() == 256 * 132 * 4 <= 3 * big.slot_bytes(4)[2]
    assert wgmma_w.applies(fp4, 256, 1024, "float16", big) is None


def test_slots_of_64_k_fit_twice_as_many():
    """Half the bytes a slot, so 8-bit codes fit two warpgroups × 256 rows in 5 (32 KB of activations,
    8 KB of codes, 512 bytes of scale codes: 41 KB a slot), not 6; K a multiple of 128 (a slot's
    word of 4 scale codes a row)."""
    fp8 = formats.get("mxfp8_e4m3")
    half = wgmma_w.Hints(2, 5, 1, mt=256, ring=1, tma=2, prod=2, bk=64)
    assert half.slot_bytes(8) == (32768, 32768 + 8192, 41984)
    assert wgmma_w.applies(fp8, 256, 512, "float16", half) is None
    assert "exceed" in wgmma_w.applies(fp8, 256, 512, "float16", dataclasses.replace(half, stages=6))
    assert "K=320 is not a multiple of 128" in wgmma_w.applies(fp8, 256, 320, "float16", half)
    assert wgmma_w.applies(fp8, 256, 384, "float16", dataclasses.replace(half, double=0)) is None
    for bad in (dict(bk=32), dict(bk=64, stages=9), dict(bk=128, stages=8), dict(bk=64, frag=1)):
        with pytest.raises(ValueError, match=r"bk 128\|64"):
            wgmma_w.Hints(**bad)


def test_split_k_runs_only_where_the_grid_is_short():
    """The rule splits K for grids short of the SMs (4096 rows at M=64: 64 one-warpgroup blocks on
    132 SMs, 2 an SM), never where the unsplit grid fills them (28672 rows: 448 such blocks)."""
    rule = rules.get("wgmma_w")

    def spec(n, k, bucket):
        sm90 = targets.cuda("sm_90")
        return builder.KernelSpec("mxfp4", n, k, bucket, "float16", "float16", False, 32, sm90)

    short = spec(4096, 4096, 64)
    assert {h.splits for h in rule.candidates(short)} == {1, 2, 4, 8}
    assert {h.splits for h in rule.candidates(short) if h.cluster} == {2}  # a cluster of 2 splits only
    assert min((h for h in rule.candidates(short) if not h.sk), key=lambda h: rule.cost(short, h)).splits > 1
    assert rule.default_hints(short).sk  # stream-K fills the SMs without splitting every tile
    assert {h.splits for h in rule.candidates(spec(28672, 8192, 64)) if h.wg == 1} == {1}
    assert rule.default_hints(spec(28672, 8192, 64)).splits == 1


@pytest.mark.parametrize(("bucket", "evens"), [(1024, True), (896, True), (512, False)])
def test_wide_buckets_split_in_a_cluster_where_it_fills_the_last_wave(bucket, evens):
    """Past 256 rows a full grid is split in two (a cluster) only where the split grid's last wave is
    fuller: 14336×4096 with 256-row tiles of two warpgroups is 112 × 4 blocks at 1024 rows (3.4
    waves of 132: 4 run), split 6.8 (7 run); at 512 rows 224 blocks (1.7 waves, 2 run) split to 3.4
    (4 run) gains nothing. The cost model ranks 16- to 64-row tiles, which decode the weights again
    for every tile, below 128- and 256-row ones there."""
    rule = rules.get("wgmma_w")
    sm90 = targets.cuda("sm_90")
    wide = builder.KernelSpec("mxfp4", 14336, 4096, bucket, "float16", "float16", False, 32, sm90)
    base = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=2, lean=2, early=1)
    split = dataclasses.replace(base, splits=2, cluster=1)
    cands = rule.candidates(wide)
    assert base in cands
    assert (split in cands) is evens
    assert not any(h.splits > 1 and not h.cluster for h in cands if h.mt == 256)  # the grid is not short
    if evens:
        assert rule.cost(wide, split) < rule.cost(wide, base)
    best = min(cands, key=lambda h: rule.cost(wide, h))
    assert best.mt >= 128


def test_slots_of_64_k_are_candidates_of_wide_tiles_by_tma():
    """8-bit codes take two warpgroups × 256 rows only in slots of 64 K (5 of them); the rule offers
    such slots for 128- and 256-row tiles whose codes come by TMA, 4 to 8 of them, and a record's
    twin is itself in as many as fit."""
    rule = rules.get("wgmma_w")
    sm90 = targets.cuda("sm_90")
    spec = builder.KernelSpec("mxfp8_e4m3", 28672, 8192, 1024, "float16", "float16", False, 32, sm90)
    cands = rule.candidates(spec)
    halves = [h for h in cands if h.bk == 64]
    assert all(h.tma == 2 and h.mt >= 128 and 4 <= h.stages <= 8 for h in halves)
    assert {h.stages for h in halves if h.mt == 256 and h.wg == 2} == {4, 5}
    assert not any(h.mt == 256 and h.wg == 2 for h in cands if h.bk == 128)  # (3 slots of 83 KB)
    record = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, prod=2, lean=2, early=1)
    assert dataclasses.replace(record, bk=64, stages=8) in rule.twins(spec, record)
    # the cost counts a ring's bytes, not its slots: 8 of 64 K as 4 of 128 K, and twice the turns
    assert rule.cost(spec, dataclasses.replace(record, bk=64, stages=8)) == pytest.approx(
        1.05 * rule.cost(spec, record)
    )


def test_loads_by_tma_are_candidates_on_the_ring_and_twins_of_a_record():
    """TMA completes on the ring's barriers: no candidate asks for it without them; a recorded hint
    set's twin is itself with the ring and both loads by TMA (the tuner measures it beside it)."""
    rule = rules.get("wgmma_w")
    sm90 = targets.cuda("sm_90")
    spec = builder.KernelSpec("mxfp4", 28672, 8192, 128, "float16", "float16", False, 32, sm90)
    cands = rule.candidates(spec)
    assert {h.tma for h in cands} == {0, 1, 2} and all(h.ring for h in cands if h.tma)
    assert all(h.tma == 2 for h in cands if h.prod) and any(h.prod for h in cands)
    plain = wgmma_w.Hints(2, 4, 1, mt=128)
    tma = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2)
    # warp 0 alone, or a producer warpgroup, refills the ring
    warp0, producer = (wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, prod=p) for p in (1, 2))
    # and stream-K on 1 block an SM (2 do not fit the shared memory)
    sk = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1)
    # each leaner (the record itself first: the same kernel in fewer instructions; then it with its
    # outputs scaled by a multiply, lean 2)
    lean = lambda *hs, n=1: [dataclasses.replace(h, lean=n) for h in hs]  # noqa: E731
    # and first, the record launched with programmatic dependent launch (pdl 1 and 2), then with the
    # ring's first loads issued before its scale scan (early)
    early = lambda h: [*(dataclasses.replace(h, pdl=p) for p in (1, 2)), dataclasses.replace(h, early=1)]  # noqa: E731
    # and, codes by TMA, in 8 slots of 64 K
    half = lambda h: [dataclasses.replace(h, lean=1, bk=64, stages=8)]  # noqa: E731
    assert rule.twins(spec, plain) == early(plain) + lean(plain) + lean(plain, n=2) + lean(
        tma, warp0, producer, sk
    )
    twins = early(tma) + lean(tma) + lean(tma, n=2) + lean(warp0, producer) + half(tma) + lean(sk)
    assert rule.twins(spec, tma) == twins
    sk2 = dataclasses.replace(sk, prod=2)
    assert rule.twins(spec, producer) == early(producer) + lean(producer) + lean(producer, n=2) + lean(
        tma, warp0
    ) + half(producer) + lean(sk2)
    leaner = lean(producer)[0]
    assert rule.twins(spec, leaner) == early(leaner) + lean(producer, n=2) + lean(tma, warp0) + half(
        producer
    ) + lean(sk2)
    # (no split here: neither it leaner, nor early, pdl or a TMA twin)
    small = wgmma_w.Hints(1, 4, 1, mt=64, splits=2, ring=1, tma=1)
    assert rule.twins(spec, small) == lean(  # and on 128-row tiles (two such blocks do not fit an SM)
        *(wgmma_w.Hints(1, 4, 1, mt=64, ring=1, tma=1, sk=sk) for sk in (1, 2)),
        wgmma_w.Hints(1, 4, 1, mt=128, ring=1, tma=1, sk=1),
    )
    assert rule.twins(spec, sk)[0].sk and not any(t.early or t.pdl for t in rule.twins(spec, sk))
    assert rule.default_hints(spec).tma == 2  # what the H100 measured fastest with two warpgroups
    # a split record's second twin: split in two, the parts added in a cluster's shared memory (4096² at
    # 128 rows: 32 blocks of 128 weight rows, short of the 132 SMs)
    short = builder.KernelSpec("mxfp4", 4096, 4096, 128, "float16", "float16", False, 32, sm90)
    for splits in (2, 4):
        split = wgmma_w.Hints(2, 4, 1, mt=64, splits=splits, ring=1, tma=2, lean=2)
        assert rule.twins(short, split)[3] == dataclasses.replace(split, cluster=1, splits=2)
    assert rule.default_hints(spec).lean == 1


def test_stream_k_costs_the_work_where_waves_quantize():
    """224 blocks of a tile on 132 SMs run 2 waves for 1.7 waves' work: the cost model charges the
    whole waves, stream-K (a grid of the SMs sharing the tiles' K iterations) the work alone."""
    rule = rules.get("wgmma_w")
    sm90 = targets.cuda("sm_90")
    spec = builder.KernelSpec("mxfp4", 28672, 8192, 128, "float16", "float16", False, 32, sm90)
    tiles = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2)
    persistent = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1)
    assert rule.cost(spec, tiles) / rule.cost(spec, persistent) == pytest.approx(2 / (224 / 132) / 1.03)
    warp0 = dataclasses.replace(tiles, prod=1)  # warp 0 alone refilling the ring: measured 0.97x
    assert rule.cost(spec, warp0) / rule.cost(spec, tiles) == pytest.approx(0.97)
    assert rule.cost(spec, dataclasses.replace(persistent, prod=1)) == rule.cost(spec, persistent)
    producer = dataclasses.replace(tiles, prod=2)  # a producer warpgroup: measured 0.90x
    assert rule.cost(spec, producer) / rule.cost(spec, tiles) == pytest.approx(0.9)
    leaner = dataclasses.replace(producer, lean=1)  # 0.94-0.98x measured
    assert rule.cost(spec, leaner) / rule.cost(spec, producer) == pytest.approx(0.95)


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("fmt", "dtype", "hints"),
    [
        ("mxfp4", "float16", wgmma_w.Hints()),
        ("mxfp8_e4m3", "bfloat16", wgmma_w.Hints(1, 4, 1, mt=64)),
        ("mxfp4", "bfloat16", wgmma_w.Hints(1, 4, 1, mt=64, splits=2)),
        ("mxint8", "float16", wgmma_w.Hints(2, 4, 1, mt=128, ring=1)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=1)),
        ("mxfp4", "bfloat16", wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2)),
        ("mxfp8_e4m3", "float16", wgmma_w.Hints(1, 4, 1, mt=64, splits=2, ring=1, tma=2)),
        ("mxfp4", "bfloat16", wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2)),
        ("mxint8", "float16", wgmma_w.Hints(1, 3, 1, mt=256, ring=1, tma=2)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1)),
        ("mxfp8_e4m3", "bfloat16", wgmma_w.Hints(1, 4, 1, mt=64, ring=1, tma=2, sk=2)),
        ("mxint8", "float16", wgmma_w.Hints(2, 3, 0, mt=128, ring=1, sk=1)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=1)),
        ("mxfp8_e5m2", "bfloat16", wgmma_w.Hints(1, 4, 1, mt=64, ring=1, tma=2, sk=2, prod=1)),
        ("mxfp4", "bfloat16", wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=2)),
        ("mxint8", "float16", wgmma_w.Hints(1, 4, 0, mt=64, splits=2, ring=1, tma=2, prod=2)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1, prod=2)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=2, lean=1)),
        ("mxfp4", "bfloat16", wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1, prod=2, lean=1)),
        ("mxfp8_e4m3", "float16", wgmma_w.Hints(1, 4, 1, mt=64, splits=2, lean=1)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, sk=1, prod=2, lean=1)),
        ("mxfp4", "bfloat16", wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, sk=1, prod=1, lean=1)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=2, lean=2)),
        (
            "mxfp4",
            "bfloat16",
            wgmma_w.Hints(2, 4, 1, 64, 2, ring=1, tma=2, prod=2, lean=2, cluster=1, early=1),
        ),
        ("mxfp8_e4m3", "float16", wgmma_w.Hints(1, 4, 1, mt=64, splits=2, early=1)),
        ("mxint8", "float16", wgmma_w.Hints(1, 3, 0, mt=256, ring=1, tma=2, sk=1)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 4, 1, 128, 2, ring=1, tma=2, prod=2, lean=2, cluster=1)),
        ("mxfp8_e4m3", "bfloat16", wgmma_w.Hints(1, 4, 0, mt=16, splits=4, cluster=1)),
        ("mxfp4", "float16", wgmma_w.Hints(2, 4, 1, 64, 2, ring=1, tma=2, prod=2, lean=2, cluster=1, frag=1)),
        ("mxint8", "bfloat16", wgmma_w.Hints(1, 4, 1, mt=64, splits=2, frag=1)),
        ("mxfp8_e4m3", "float16", wgmma_w.Hints(1, 3, 1, mt=256, ring=1, tma=2, frag=1)),
        ("mxfp8_e4m3", "float16", wgmma_w.Hints(2, 5, 1, 256, ring=1, tma=2, prod=2, lean=2, cvt=1, bk=64)),
        ("mxfp4", "bfloat16", wgmma_w.Hints(2, 8, 1, mt=128, ring=1, tma=2, sk=1, prod=2, lean=1, bk=64)),
        ("mxfp6_e2m3", "float16", wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, prod=2, lean=2)),
        ("mxfp6_e3m2", "bfloat16", wgmma_w.Hints(2, 5, 1, 256, ring=1, tma=2, prod=2, lean=2, bk=64)),
        ("bfp6", "float16", wgmma_w.Hints(1, 4, 1, mt=64, splits=2)),
    ],
)
def test_ptxas_keeps_wgmmas_asynchronous(tmp_path, fmt, dtype, hints):
    """Also: a split K is two kernels, the second adding the splits' partial sums in split order (and
    stream-K, the second adding the shared tiles' parts), or with ``cluster`` one, whose blocks add
    them from each other's shared memory; the mbarrier ring waits on barriers instead of a block
    barrier an iteration."""
    import tvm

    from mxgemm.codegen.wgmma import TARGET

    ab, h = {"float16": "f16", "bfloat16": "bf16"}[dtype], hints

    def source(bias: bool, h=h) -> str:
        f = wgmma_w.kernel(formats.get(fmt), n=512, k=512, out_dtype=dtype, bias=bias, a_dtype=dtype, hints=h)
        return builder.compile_export(tvm.IRModule({"main": f}), TARGET, tmp_path / "k.so")["source"]

    src = source(bias=True)
    assert f"wgmma.mma_async.sync.aligned.m64n{hints.mt}k16.f32.{ab}.{ab}" in src
    second = (hints.splits > 1 and not hints.cluster) or hints.sk
    assert src.count("__global__") == (4 if second else 2)  # declared and defined
    assert ("ld.shared::cluster.v4.f32" in src) == ("barrier.cluster.arrive" in src) == bool(hints.cluster)
    assert ("blockIdx.z" in src) == (hints.splits > 1)
    main = re.search(r"main_kernel\([^;{]*\{(.*?)(extern \"C\"|$)", src, re.S).group(1)  # its definition
    assert ("blockIdx.y" in main) == (not hints.sk)  # stream-K: one grid dimension (the SMs)
    assert ("cp.async.mbarrier.arrive.noinc" in src) == bool(hints.ring)
    assert ("cp.async.wait_group" in src) == (not hints.ring)
    assert ("cp.async.bulk.tensor.2d" in src) == bool(hints.tma)  # loads by TMA, through tensor maps:
    planes = len(layout.plane_widths(formats.get(fmt).bits))  # (6-bit codes: planes of 4 and 2 bits)
    maps = (0, 1, 1 + planes)[hints.tma]  # the activations', and (tma 2) each code plane's
    assert src.count("__grid_constant__ CUtensorMap") == 2 * maps  # declaration and definition
    assert ("cp.async.cg.shared.global" in src) == (hints.tma < 2)  # codes by cp.async
    # the producer warpgroup gives its registers to the others (two: 232 a thread) and waits for nothing
    # but empty slots
    assert ("setmaxnreg" in src) == (hints.prod == 2 and hints.wg == 2)
    # e2m1, e4m3 (not by ``cvt``) and 6-bit float codes (made a byte a code first) into either dtype:
    # pairs by the sign-replicating prmt
    signs = (fmt in ("mxfp4", "mxfp8_e4m3") and not hints.cvt) or fmt.startswith("mxfp6")
    assert ("mxgemm_prmt(" in src) == signs
    # early (and stream-K): the ring's first copies issued before the scan of the scale codes (its
    # byte-wise maxima)
    body = src[src.index("main_kernel(") :]
    assert (body.index("__vmaxu4(") > body.index("_shared_global_4(")) == bool(hints.early or hints.sk)
    # a producer warpgroup does not wait for the vote: the compute warpgroups count theirs on barrier 1
    assert ("bar.red.popc" in src) == (hints.prod == 2 and bool(hints.sk or hints.early))
    # the codes in fragment order: a lane's words are read as they are, none gathered by __byte_perm
    if hints.frag:
        planes = source(bias=True, h=dataclasses.replace(hints, frag=0))
        assert src.count("__byte_perm(") < planes.count("__byte_perm(")
    big = hints.mt == 256 and hints.prod < 2
    # stream-K of 256-row tiles, bf16: up to 40 bytes, all outside the K loop (the prologue's barrier
    # addresses and the epilogue's stores: nvdisasm of mxfp4 bf16, 2 warpgroups, warp 0 refilling)
    spills = 40 if hints.mt == 256 and hints.sk else 4 if big else 0
    ptxas.assert_wgmmas_async_no_spills(src, tmp_path, spills=spills)
    if big and not hints.sk:  # 4 bytes with a bias (a 128-register accumulator beside it); none without
        ptxas.assert_wgmmas_async_no_spills(source(bias=False), tmp_path)


# ---- on a Hopper GPU (kernels built where TVM can build them) -----------------------------------------

# every format the rule serves in one plane of 4 or 8 bits, fp16 and bf16 (more planes: PLANE_FORMATS)
GPU_FORMATS = [
    (f, dt)
    for f in ("mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "bfp4", "bfp8")
    for dt in ("float16", "bfloat16")
]
SPLIT = wgmma_w.Hints(1, 4, 1, mt=64, splits=2)
RING = wgmma_w.Hints(2, 3, 0, mt=128, ring=1)  # one fragment set: a slot released right after its wgmmas
TMA1 = wgmma_w.Hints(2, 3, 0, mt=128, ring=1, tma=1)  # 150 rows: the second M tile's rows past M are zeros
TMA2 = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2)
TMA2_SPLIT = wgmma_w.Hints(1, 4, 1, mt=64, splits=2, ring=1, tma=2)
GPU_TILES = [(wgmma_w.Hints(), 200), (wgmma_w.Hints(1, 4, 1, mt=64), 37), (SPLIT, 77), (RING, 150)]
BIG = wgmma_w.Hints(1, 3, 1, mt=256, ring=1, tma=2)  # 300 rows: a full M tile and 44 rows of another
GPU_TILES += [(TMA1, 150), (TMA2, 37), (TMA2_SPLIT, 77), (BIG, 300)]
# stream-K on 256×512: 150 rows, 4 tiles of 2 units, a block a unit (every tile in 2 parts); 77 rows,
# 8 tiles of 4 units, 264 blocks at most (4 parts); 3000 rows, 188 tiles of 4 units on 132 blocks
# (5-6 units a block: whole tiles between parts)
SK1 = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1)
SK2 = wgmma_w.Hints(1, 4, 0, mt=64, ring=1, tma=1, sk=2)
SK_LONG = wgmma_w.Hints(1, 4, 0, mt=64, ring=1, sk=1)
GPU_TILES += [(SK1, 150), (SK2, 77), (SK_LONG, 3000)]
# warp 0 alone refills the ring: two warpgroups × 256 rows (4-bit codes: three such slots of 8-bit
# ones exceed the shared memory, skipped); stream-K of 64-row tiles (two lanes' rows a lane)
PROD = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=1)
PROD_SK = wgmma_w.Hints(1, 4, 1, mt=64, ring=1, tma=2, sk=2, prod=1)
# a producer warpgroup: two warpgroups × 256 (4-bit) and × 128 rows (232 registers a compute thread);
# a split K of 64-row tiles
PRODUCER = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=2)
PRODUCER_128 = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, prod=2)
PRODUCER_SPLIT = wgmma_w.Hints(1, 4, 0, mt=64, splits=2, ring=1, tma=2, prod=2)
GPU_TILES += [(PROD, 300), (PROD_SK, 77), (PRODUCER, 300), (PRODUCER_128, 150), (PRODUCER_SPLIT, 77)]
# stream-K with a producer warpgroup (the compute warpgroups vote on barrier 1): 150 rows as SK1; 3000
PRODUCER_SK = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1, prod=2)
PRODUCER_SK_LONG = wgmma_w.Hints(1, 4, 0, mt=64, ring=1, tma=2, sk=1, prod=2)
GPU_TILES += [(PRODUCER_SK, 150), (PRODUCER_SK_LONG, 3000)]
# leaner: 256-row tiles (a step's code words loaded just before its decode), stream-K, every thread's
# copies and a split K
LEAN = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=2, lean=1)
LEAN_SK = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, sk=1, prod=2, lean=1)
LEAN_SPLIT = wgmma_w.Hints(1, 4, 1, mt=64, splits=2, lean=1)
GPU_TILES += [(LEAN, 300), (LEAN_SK, 150), (LEAN_SPLIT, 77)]
# lean 2: the outputs scaled by a multiply a row where the exponents allow (the same bits as lean 1)
LEAN2 = dataclasses.replace(LEAN, lean=2)
LEAN2_SK = dataclasses.replace(LEAN_SK, lean=2)
LEAN2_SPLIT = dataclasses.replace(LEAN_SPLIT, lean=2)
GPU_TILES += [(LEAN2, 300), (LEAN2_SK, 150), (LEAN2_SPLIT, 77)]
# stream-K of 256-row tiles (the unfolded path's sums added in memory): 300 rows, 4 tiles of 2 units on
# 132 blocks (every tile in 2 parts); 3000 rows, 24 tiles: whole tiles between parts
SK_BIG = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, sk=1, prod=2, lean=1)
SK_BIG_LONG = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, sk=1, prod=1, lean=1)
SK_BIG_1 = wgmma_w.Hints(1, 3, 0, mt=256, ring=1, tma=2, sk=1)  # one warpgroup: 8-bit codes too
GPU_TILES += [(SK_BIG, 300), (SK_BIG_LONG, 3000), (SK_BIG_1, 300)]
# M tiles of 16 and 32 rows (the 32-row bucket's): 37 rows, 3 tiles (5 rows in the last); a split
# K; stream-K of 32-row tiles over 6 slots (77 rows: 3 tiles) and of 16-row tiles, 2 blocks an SM
SMALL = wgmma_w.Hints(2, 4, 1, mt=16, ring=1, tma=2, prod=2, lean=2)
SMALL_SPLIT = wgmma_w.Hints(1, 5, 1, mt=16, splits=2, lean=2)
SMALL_SK = wgmma_w.Hints(2, 6, 1, mt=32, ring=1, tma=2, sk=1, prod=1, lean=2)
SMALL_SK2 = wgmma_w.Hints(2, 4, 1, mt=16, ring=1, tma=2, sk=2, prod=1, lean=2)
GPU_TILES += [(SMALL, 37), (SMALL_SPLIT, 20), (SMALL_SK, 77), (SMALL_SK2, 16)]
# a split K's parts added in a cluster's shared memory: 150 rows on 128-row tiles with a producer; 37
# rows on 16-row tiles in 4 splits (4 rows a block to add, every thread copying); 300 rows on 256-row
# tiles, warp 0 refilling
CLUSTER = wgmma_w.Hints(2, 4, 1, mt=128, splits=2, ring=1, tma=2, prod=2, lean=2, cluster=1)
CLUSTER_SMALL = wgmma_w.Hints(1, 4, 0, mt=16, splits=4, lean=1, cluster=1)
CLUSTER_BIG = wgmma_w.Hints(2, 3, 1, mt=256, splits=2, ring=1, tma=2, prod=1, lean=1, cluster=1)
GPU_TILES += [(CLUSTER, 150), (CLUSTER_SMALL, 37), (CLUSTER_BIG, 300)]
# test_gpu_cluster_gives_the_second_kernels_bits's: (hints, rows, K); 8 splits of 256 K
CLUSTER_CASES = [(CLUSTER, 150, 512), (CLUSTER_SMALL, 37, 512), (CLUSTER_BIG, 300, 512)]
CLUSTER_8 = wgmma_w.Hints(2, 4, 0, mt=64, splits=8, ring=1, tma=2, prod=2, lean=2, cluster=1)
CLUSTER_CASES += [(CLUSTER_8, 100, 2048)]
# the wide buckets' records (384-1024 rows): 256-row tiles of two warpgroups split in a cluster, lean 2,
# early, a producer warpgroup (300 rows: a full M tile and 44 rows of another)
CLUSTER_WIDE = wgmma_w.Hints(2, 3, 1, mt=256, splits=2, ring=1, tma=2, prod=2, lean=2, cluster=1, early=1)
GPU_TILES += [(CLUSTER_WIDE, 300)]
CLUSTER_CASES += [(CLUSTER_WIDE, 300, 512)]
# test_gpu_lean_2_gives_lean_1s_bits's: lean 2 against its lean-1 twin (mxfp4, no bias)
LEAN2_CASES = [(LEAN2, 300), (LEAN2_SK, 150), (LEAN2_SPLIT, 77)]
# the ring's first loads before the scale scan: a producer warpgroup (the others vote on barrier 1) and
# a cluster of 2 splits; every thread's cp.async on the block-barrier ring
EARLY = wgmma_w.Hints(2, 4, 1, mt=64, splits=2, ring=1, tma=2, prod=2, lean=2, cluster=1, early=1)
EARLY_PLAIN = wgmma_w.Hints(1, 4, 1, mt=64, splits=2, early=1)
GPU_TILES += [(EARLY, 77), (EARLY_PLAIN, 37)]
EARLY_CASES = [(EARLY, 77), (EARLY_PLAIN, 37)]  # test_gpu_early_gives_the_same_bits's
# the codes in fragment order (mxgemm.layout.frag_order): codes by TMA, by every thread's cp.async, and
# a step's words read just before its decode (256-row tiles)
FRAG = dataclasses.replace(EARLY, frag=1)
FRAG_PLAIN = wgmma_w.Hints(1, 4, 1, mt=64, splits=2, frag=1)
FRAG_BIG = wgmma_w.Hints(1, 3, 1, mt=256, ring=1, tma=2, frag=1)
FRAG_CASES = [(FRAG, 77), (FRAG_PLAIN, 37), (FRAG_BIG, 300)]
GPU_TILES += FRAG_CASES
# programmatic dependent launch: a split K's second kernel (the scale scan before the wait), a cluster
# of 2 splits with the ring's first loads before the scan, the block-barrier ring of every thread
PDL = wgmma_w.Hints(2, 4, 1, mt=64, splits=2, ring=1, tma=2, prod=2, lean=2, pdl=1)
PDL_CASES = [(PDL, 77), (dataclasses.replace(EARLY, pdl=1), 77), (wgmma_w.Hints(1, 4, 1, mt=64, pdl=1), 37)]
PDL_CASES += [(dataclasses.replace(PDL, pdl=2), 77)]  # the next kernel let in after the wait
PDL_N = 512  # test_gpu_pdl_chain's layer: n = k, each launch reading the output of the one before
# 8-bit float codes into fp16 by one cvt a pair: a cluster of 2 splits with a producer (codes by TMA,
# fragment order), one warpgroup on the block-barrier ring, a 256-row tile (a step's words read late)
CVT_CASES = [(dataclasses.replace(FRAG, cvt=1), 77), (dataclasses.replace(EARLY_PLAIN, cvt=1), 37)]
CVT_CASES += [(dataclasses.replace(FRAG_BIG, frag=0, cvt=1), 300)]
# slots of 64 K (``bk``): two warpgroups × 256 rows in 5 (8-bit codes fit), 128-row tiles in 8 on
# stream-K a unit a block (odd K iterations first: a slot takes its scale word's high half), and a
# split K on the block-barrier ring, one fragment set (the K iteration's parity at run time)
HALF_WIDE = wgmma_w.Hints(2, 5, 1, mt=256, ring=1, tma=2, prod=2, lean=2, early=1, bk=64)
HALF_SK = wgmma_w.Hints(2, 8, 0, mt=128, ring=1, tma=2, sk=1, prod=2, lean=1, bk=64)
HALF_SPLIT = wgmma_w.Hints(1, 4, 0, mt=64, splits=2, bk=64)
GPU_TILES += [(HALF_WIDE, 300), (HALF_SK, 150), (HALF_SPLIT, 77)]
CVT_CASES += [(dataclasses.replace(HALF_WIDE, cvt=1), 300)]
# ... and their bits against slots of 128 K (where those fit: one warpgroup × 256 rows in 3 slots; a
# cluster of two splits; not stream-K, whose units, and so the order its parts are added in, are of
# bk K)
HALF_CASES = [(dataclasses.replace(HALF_WIDE, wg=1, stages=3), 300), (HALF_SPLIT, 77)]
HALF_CASES += [(wgmma_w.Hints(2, 4, 1, 128, 2, ring=1, tma=2, prod=2, lean=2, cluster=1, bk=64), 150)]
# test_gpu_an_option_gives_the_same_bits's: (option, hints with it, rows)
SAME_BITS = [
    (o, h, m)
    for o, cases in (("early", EARLY_CASES), ("frag", FRAG_CASES), ("pdl", PDL_CASES), ("bk", HALF_CASES))
    for h, m in cases
]


# two bit planes, 4 and 2 bits (6-bit codes), and one of 2 bits: every plane width's copy (cp.async, TMA
# with 64-, 32- and, in slots of 64 K, 16-byte rows of a plane) and gather, the step's words read early
# and late (256-row tiles), each ring, split K (a second kernel, a cluster), stream-K, small M tiles
PLANE_FORMATS = [("mxfp6_e2m3", "float16"), ("mxfp6_e2m3", "bfloat16"), ("mxfp6_e3m2", "float16")]
PLANE_FORMATS += [("mxfp6_e3m2", "bfloat16"), ("bfp6", "float16"), ("bfp2", "bfloat16")]
PLANE_TILES = [(wgmma_w.Hints(), 200), GPU_TILES[1], (SPLIT, 77), (TMA1, 150), (TMA2, 37), (BIG, 300)]
PLANE_TILES += [(SK1, 150), (PRODUCER_128, 150), (LEAN2_SPLIT, 77), (SMALL, 37), (CLUSTER, 150)]
PLANE_TILES += [(HALF_WIDE, 300), (HALF_SK, 150), PDL_CASES[0]]
# test_gpu_matches_the_dequantized_product's (fmt, dtype, hints, rows)
GPU_CASES = [(f, dt, h, m) for f, dt in GPU_FORMATS for h, m in GPU_TILES]
GPU_CASES += [(f, dt, h, m) for f, dt in PLANE_FORMATS for h, m in PLANE_TILES]


def _without(option: str, hints: wgmma_w.Hints) -> wgmma_w.Hints:
    """``hints`` with ``option`` at its default (0; ``bk``: 128)."""
    return dataclasses.replace(hints, **{option: wgmma_w.Hints.__dataclass_fields__[option].default})


# the kernels of the GPU tests, (fmt, N, K, dtype, bias, hints), for tests.prebuild_gpu
PREBUILD = [
    (f, 256, 512, dt, True, h)
    for f, dt, h, _ in GPU_CASES
    if wgmma_w.applies(formats.get(f), 256, 512, dt, h) is None
]
PREBUILD += [
    (f, 256, k, dt, True, h)
    for f in ("mxfp4", "mxfp8_e4m3")
    for dt in ("float16", "bfloat16")
    for cluster, _, k in CLUSTER_CASES
    for h in (dataclasses.replace(cluster, cluster=0), cluster)
    if wgmma_w.applies(formats.get(f), 256, k, dt, h) is None
]
PREBUILD += [
    ("mxfp4", 256, 512, dt, False, h)
    for dt in ("float16", "bfloat16")
    for lean2, _ in LEAN2_CASES
    for h in (dataclasses.replace(lean2, lean=1), lean2)
]
PREBUILD += [  # _assert_same_bits's: each case without its option and with it
    (f, 256, 512, dt, False, h)
    for f in ("mxfp4", "mxfp8_e4m3")
    for dt in ("float16", "bfloat16")
    for option, case, _ in SAME_BITS
    for h in (_without(option, case), case)
    if wgmma_w.applies(formats.get(f), 256, 512, dt, h) is None
]
PREBUILD += [("mxfp4", PDL_N, PDL_N, dt, False, h) for dt in ("float16", "bfloat16") for h, _ in PDL_CASES]
PREBUILD += [  # test_gpu_cvt_gives_the_same_bits's
    (f, 256, 512, dt, False, h)
    for f in ("mxfp8_e4m3", "mxfp8_e5m2")
    for dt in ("float16", "bfloat16")
    for case, _ in CVT_CASES
    for h in (dataclasses.replace(case, cvt=0), case)
]
# test_gpu_linear_runs_the_records_kernel's: its record's layer, n, k, bucket and hints
LINEAR = ("mxfp4", 512, 1024, 128, wgmma_w.Hints(2, 4, 1, mt=64, splits=2, ring=1, tma=2))
LINEAR_384 = ("mxfp4", 512, 1024, 384, wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2, prod=2, lean=1))
LINEAR_32 = ("mxfp4", 512, 1024, 32, wgmma_w.Hints(2, 4, 1, mt=32, ring=1, tma=2, prod=2, lean=2))
LINEAR_CLUSTER = ("mxfp4", 512, 1024, 128, dataclasses.replace(LINEAR[4], lean=2, cluster=1))
LINEAR_512 = ("mxfp4", 512, 1024, 512, CLUSTER_WIDE)
LINEAR_6 = ("mxfp6_e3m2", 512, 1024, 128, dataclasses.replace(LINEAR[4], lean=2))  # two code planes
LINEARS = (LINEAR, LINEAR_384, LINEAR_32, LINEAR_CLUSTER, LINEAR_512, LINEAR_6)
# the rows test_gpu_linear_runs_the_records_kernel calls each with
ROWS = {128: 100, 384: 300, 32: 20, 512: 400}


def _run(fmt, x, q, dtype, hints, bias=None):
    n, k = q.shape
    why = wgmma_w.applies(formats.get(fmt), n, k, dtype, hints)
    if why is not None:  # (a tile of the list that this format's codes do not fit)
        pytest.skip(why)
    func = wgmma_w.compiled(fmt, n, k, dtype, bias is not None, hints)
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device="cuda")
    bits = formats.get(fmt).bits
    planes = [layout.frag_order(q.blocks, bits)] if hints.frag else layout.to_planes(q.blocks, bits)
    func(x, *planes, q.scales, *([bias] if bias is not None else []), y)
    return y


def _dequant(q, fmt) -> torch.Tensor:
    """float64 weights from the oracle's decode (ml_dtypes) and E8M0 factors."""
    codes = packing.unpack(q.blocks.cpu(), formats.get(fmt).bits).numpy()
    return torch.from_numpy(oracle.dequantize(codes, q.scales.cpu().numpy(), oracle.SPECS[fmt]))


ONE_HOT_TILES = [
    *(GPU_TILES[1][0], SPLIT, RING, TMA1, TMA2_SPLIT, BIG, SK1, SK2),
    *(PROD, PROD_SK, PRODUCER, PRODUCER_SPLIT, PRODUCER_SK, LEAN, LEAN_SK, LEAN_SPLIT, SK_BIG, SK_BIG_1),
    *(LEAN2, LEAN2_SK, LEAN2_SPLIT, SMALL, SMALL_SPLIT, SMALL_SK, SMALL_SK2),
    *(CLUSTER, CLUSTER_SMALL, CLUSTER_BIG, EARLY, EARLY_PLAIN, FRAG, FRAG_PLAIN, FRAG_BIG),
    *(HALF_WIDE, HALF_SK, HALF_SPLIT),
]
# test_gpu_one_hot_rows_are_bit_exact's (fmt, dtype, hints): every format's, its K order pinned
ONE_HOT = [(f, dt, h) for f, dt in GPU_FORMATS for h in ONE_HOT_TILES]
ONE_HOT += [(f, dt, h) for f, dt in PLANE_FORMATS for h, _ in PLANE_TILES]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype", "hints", "m"), GPU_CASES)
@pytest.mark.parametrize("unfolded", [False, True])
def test_gpu_matches_the_dequantized_product(fmt, dtype, hints, m, unfolded):
    torch.manual_seed(0)
    n, k = 256, 512
    w = torch.randn(n, k, device="cuda") * 0.05
    if unfolded:  # a row's scales span 32 binades (past fp16's folds; outputs within fp16), one NaN scale
        w[5] *= torch.exp2(torch.linspace(-28, 4, k // 32, device="cuda")).repeat_interleave(32)
    q = reference.quantize(w, fmt)
    if unfolded:
        q.scales[9, 3] = 255
    dt = getattr(torch, dtype)
    x = (torch.randn(m, k, device="cuda") * 2).to(dt)
    bias = torch.randn(n, device="cuda").to(dt)
    y = _run(fmt, x, q, dtype, hints, bias).cpu().double()
    wd = _dequant(q, fmt)
    ref = x.cpu().double() @ wd.T + bias.cpu().double()
    rounding = 2.0 ** -(11 if dtype == "float16" else 8)
    bound = x.cpu().double().abs() @ wd.abs().T * 2.0**-20 + ref.abs() * rounding
    nan = torch.isnan(ref)
    assert bool(nan.any()) == unfolded and torch.equal(torch.isnan(y), nan)
    assert ((y - ref).abs()[~nan] <= bound[~nan]).all()


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype", "hints"), ONE_HOT)
def test_gpu_one_hot_rows_are_bit_exact(fmt, dtype, hints):
    """Activation row i is one 1 at column c_i: output (i, n) is the weight W[n, c_i] itself (rounded
    to the activations' dtype; the bias is zero); split K: the other splits add exact zeros."""
    n, k, m = 256, 512, 64
    torch.manual_seed(2)
    q = reference.quantize(torch.randn(n, k, device="cuda"), fmt)
    cols = torch.arange(m) * 7 % k
    dt = getattr(torch, dtype)
    x = torch.zeros(m, k, dtype=dt, device="cuda")
    x[torch.arange(m), cols] = 1.0
    y = _run(fmt, x, q, dtype, hints, torch.zeros(n, dtype=dt, device="cuda")).cpu()
    want = _dequant(q, fmt)[:, cols].T.to(dt)
    assert torch.equal(y, want), np.abs((y.double() - want.double()).numpy()).max()


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("lean2", "m"), LEAN2_CASES)
def test_gpu_lean_2_gives_lean_1s_bits(dtype, lean2, m):
    """``lean`` 2 scales the outputs by a multiply where a row's exponent is a normal fp32 one, else by
    ``ldexpf`` as ``lean`` 1 does: the same bits, on rows of ordinary scales, rows whose scales lie near
    the top and the bottom of the E8M0 range (their exponents past fp32's normal ones) and a NaN scale."""
    torch.manual_seed(3)
    n, k = 256, 512
    w = torch.randn(n, k, device="cuda")
    w[:8] *= 2.0**100  # scale codes near 230: past fp32's exponents with the format's offset
    w[8:16] *= 2.0**-120
    q = reference.quantize(w, "mxfp4")
    q.scales[20, 2] = 255
    dt = getattr(torch, dtype)
    x = torch.randn(m, k, device="cuda").to(dt)
    y1 = _run("mxfp4", x, q, dtype, dataclasses.replace(lean2, lean=1))
    y2 = _run("mxfp4", x, q, dtype, lean2)
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("option", "hints", "m"), SAME_BITS)
@pytest.mark.parametrize("fold", [True, False])
def test_gpu_an_option_gives_the_same_bits(fmt, dtype, option, hints, m, fold):
    """Each option gives the bits of the same kernel without it, with rows that fold and (``fold``
    False: a row whose codes span more binades than the fold allows) with a block that does not.
    ``early`` moves the scan of the scale codes after the ring's first loads (and, with a producer
    warpgroup, to the compute warpgroups' own barrier); ``frag`` reads the codes in fragment order
    (:func:`mxgemm.layout.frag_order` of the same weight: each lane's words as they are instead of
    gathered from the planes' K order, the same pairs into the same wgmmas); ``pdl`` launches the
    kernel (and a split K's second kernel) with programmatic dependent launch; ``bk`` 64 runs the K
    loop in slots of 64 K (the same wgmmas in the same order)."""
    seed = {"early": 5, "frag": 6, "pdl": 7, "bk": 8}[option]
    _assert_same_bits(fmt, dtype, hints, _without(option, hints), m, fold, seed)


def _assert_same_bits(fmt, dtype, hints, without, m, fold, seed):
    """``hints`` and ``without`` (the same kernel without one option) give the same bits, on rows
    that fold or (``fold`` False) with a block that does not."""
    torch.manual_seed(seed)
    n, k = 256, 512
    w = torch.randn(n, k, device="cuda")
    if not fold:
        w[3, :32] *= 2.0**-60
    q = reference.quantize(w, fmt)
    x = torch.randn(m, k, device="cuda").to(getattr(torch, dtype))
    y0 = _run(fmt, x, q, dtype, without)
    y1 = _run(fmt, x, q, dtype, hints)
    assert torch.equal(y0.view(torch.int16), y1.view(torch.int16))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize(("hints", "m"), CVT_CASES)
@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_cvt_gives_the_same_bits(fmt, hints, m, fold, dtype):
    """``cvt`` (each fp16 pair of 8-bit float codes by one ``cvt.rn.f16x2``, bf16 then widened: the
    elements themselves, folded by a fold of true values and brought to scale without the out factor)
    gives the bits of the kernel that decodes pairs by shifts and masks, on rows that fold and with a
    block that does not."""
    _assert_same_bits(fmt, dtype, hints, dataclasses.replace(hints, cvt=0), m, fold, 8)


@pytest.mark.nvcc
def test_cvt_converts_each_pair_once(tmp_path):
    """The kernel's source holds the ``cvt.rn.f16x2`` of the format's fp8 pairs, in a multiple of a
    step's 8 pairs, and fewer byte permutes than the kernel that decodes by shifts and masks (one a
    pair there); in bf16 too; fp4 and integer codes take no ``cvt``."""
    import tvm

    from mxgemm.codegen import pairs
    from mxgemm.codegen.wgmma import TARGET

    hints = CVT_CASES[1][0]
    for fmt, dt in itertools.product(("mxfp8_e4m3", "mxfp8_e5m2"), ("float16", "bfloat16")):
        sources = []
        for i, h in enumerate((hints, dataclasses.replace(hints, cvt=0))):
            f = wgmma_w.kernel(formats.get(fmt), n=256, k=512, out_dtype=dt, bias=False, a_dtype=dt, hints=h)
            meta = builder.compile_export(tvm.IRModule({"main": f}), TARGET, tmp_path / f"{fmt}{dt}{i}.so")
            sources.append(meta["source"])
        assert f"cvt.rn.f16x2.{pairs.CVT[fmt]}" in sources[0] and "cvt.rn.f16x2" not in sources[1]
        cvt, plain = (src[src.index("__global__") :] for src in sources)
        calls = cvt.count("tvm_builtin_ptx_cvt_f16x2_f8x2")
        permutes = [src.count("__byte_perm(") + src.count("mxgemm_prmt(") for src in (cvt, plain)]
        assert calls and calls % 8 == 0 and (dt == "bfloat16" or permutes[0] < permutes[1])
    assert "take no cvt" in wgmma_w.applies(formats.get("mxint8"), 256, 512, "bfloat16", hints)
    assert "take no cvt" in wgmma_w.applies(formats.get("mxfp4"), 256, 512, "float16", hints)


@pytest.mark.nvcc
@pytest.mark.parametrize(("case", "scan_first"), [(0, True), (1, False), (2, True), (3, True)])
def test_pdl_waits_before_it_reads_activations(tmp_path, case, scan_first):
    """``pdl``: the kernels carry TVM's programmatic-dependent-launch tag; the main kernel prefetches
    its first slots' codes into L2 and (``early`` 0) scans its scale codes, then waits for the previous
    kernel before any load of activations (TMA or cp.async), and lets the next one start first (1) or
    after the wait (2); a split K's second kernel waits before it reads the partial sums."""
    import tvm

    from mxgemm.codegen import nvcc
    from mxgemm.codegen.wgmma import TARGET

    hints = PDL_CASES[case][0]
    f = wgmma_w.kernel(formats.get("mxfp4"), n=512, k=512, out_dtype="float16", bias=False, a_dtype="float16",
                       hints=hints)  # fmt: skip
    meta = builder.compile_export(tvm.IRModule({"main": f}), TARGET, tmp_path / "k.so")
    assert nvcc.PDL.encode() in (tmp_path / "k.so").read_bytes()
    starts = [m.start() for m in re.finditer("__global__", meta["source"])]
    bodies = [meta["source"][a:b] for a, b in zip(starts, [*starts[1:], None], strict=True)]
    bodies = [b for b in bodies if -1 < b.find("{") < b.find(";")]  # definitions, not declarations
    main = max(bodies, key=lambda b: b.count("wgmma"))
    at = main.find
    loads = [i for i in (at("cp_async_bulk_tensor"), at("cp_async_cg")) if i >= 0]
    trigger, wait = at("griddepcontrol_launch_dependents()"), at("griddepcontrol_wait()")
    assert -1 < at("prefetch_global_L2(") < wait and main.count("launch_dependents") == 1
    assert trigger < at("prefetch_global_L2(") if hints.pdl == 1 else wait < trigger
    assert at("griddepcontrol_wait()") < min(loads) and main.count("griddepcontrol_wait()") == 1
    assert (at("__vmaxu4") < at("griddepcontrol_wait()")) is scan_first
    others = [b for b in bodies if b is not main]
    assert len(others) == (hints.splits > 1 and not hints.cluster)
    assert all(-1 < b.find("griddepcontrol_wait()") < b.find("_ptr_1[") for b in others)  # (the sums)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("pdl", "m"), PDL_CASES)
def test_gpu_pdl_chain(dtype, pdl, m):
    """Six launches of a ``pdl`` kernel, each reading the output of the one before, captured in one
    CUDA graph (where a launch, and a split K's second kernel, may start before its predecessor ends)
    give the eager chain bit for bit, and each link of the eager chain the float64 reference."""
    torch.manual_seed(9)
    n = PDL_N
    q = reference.quantize(torch.randn(n, n, device="cuda") / n**0.5, "mxfp4")
    w = _dequant(q, "mxfp4").cuda()
    dt = getattr(torch, dtype)
    ys = [torch.randn(m, n, device="cuda").to(dt)]
    ys += [torch.full((m, n), float("nan"), dtype=dt, device="cuda") for _ in range(6)]
    func = wgmma_w.compiled("mxfp4", n, n, dtype, False, pdl)

    def chain():
        for a, b in itertools.pairwise(ys):
            func(a, q.blocks, q.scales, b)

    eager = chain_replays_eagerly(chain, ys[1:])
    for a, b in itertools.pairwise([ys[0], *eager]):
        want = a.double() @ w.T
        assert torch.allclose(b.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("cluster", "m", "k"), CLUSTER_CASES)
def test_gpu_cluster_gives_the_second_kernels_bits(fmt, dtype, cluster, m, k):
    """The splits' parts added in the cluster's shared memory give the bits of the second kernel that
    adds them from a workspace (the same split order, then the bias), folded rows and an unfolded one."""
    torch.manual_seed(4)
    n = 256
    w = torch.randn(n, k, device="cuda") * 0.05
    w[5] *= torch.exp2(torch.linspace(-28, 4, k // 32, device="cuda")).repeat_interleave(32)
    q = reference.quantize(w, fmt)
    dt = getattr(torch, dtype)
    x = torch.randn(m, k, device="cuda").to(dt)
    bias = torch.randn(n, device="cuda").to(dt)
    split = _run(fmt, x, q, dtype, dataclasses.replace(cluster, cluster=0), bias)
    y = _run(fmt, x, q, dtype, cluster, bias)
    assert torch.equal(y.view(torch.int16), split.view(torch.int16))


# ---- the rule (mxgemm.rules.wgmma_w): routed only where a tune record names it -----------------------


def _record(tmp_path, monkeypatch, fmt, n, k, m_bucket, hints):
    """A user tune log whose one record says ``wgmma_w`` with ``hints`` measured fastest."""
    log = tmp_path / "user.json"
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(log))
    versions = tunelog.rule_versions("wgmma_w", builder.versions(targets.cuda("sm_90")))
    config = hints.to_dict()
    rec = tunelog.Record(fmt, n, k, m_bucket, "float16", "sm_90", "wgmma_w", config, 1.0, "x", versions)
    tunelog.merge(log, [rec])
    ops.plan.cache_clear()  # decided once per layer shape and M


def test_the_rule_runs_where_a_record_names_it(tmp_path, monkeypatch):
    spec = builder.KernelSpec("mxfp4", 512, 1024, 128, "float16", "float16", False, 32, targets.cuda("sm_90"))
    rule = rules.get("wgmma_w")
    assert rule not in rules.route(spec) and rules.rivals(spec) == [rule]
    assert ops.plan(100, "sm_90", "mxfp4", 512, 1024, "float16") == ("decode", None)  # 128 rows: no record
    _record(tmp_path, monkeypatch, "mxfp4", 512, 1024, 128, wgmma_w.Hints(2, 4, 1, mt=64))
    assert ops.plan(100, "sm_90", "mxfp4", 512, 1024, "float16") == ("linear", 128)
    assert ops.plan(100, "sm_90", "mxfp4", 512, 1024, "bfloat16") == ("linear", 128)  # the fp16 record holds
    assert ops.plan(100, "sm_90", "mxfp4", 1024, 1024, "float16") == ("decode", None)  # another shape


def test_17_to_32_rows_run_as_64_until_the_log_holds_a_record_of_their_own(tmp_path, monkeypatch):
    """The 32-row bucket (M tiles of 16 or 32 rows on ``wgmma_w``) runs as the 64-row bucket does (its
    record, or the routed rule) where the log has no record of its own."""
    assert [builder.m_bucket_for(m, "cuda") for m in (16, 17, 32, 33)] == [16, 32, 32, 64]
    spec = builder.KernelSpec("mxfp4", 512, 1024, 32, "float16", "float16", False, 32, targets.cuda("sm_90"))
    mts = {h.mt for h in rules.get("wgmma_w").candidates(spec)}
    assert mts == {16, 32} and rules.get("mma").applies(spec)
    assert ops.plan(20, "sm_90", "mxfp4", 512, 1024, "float16") == ("linear", 64)  # no record: mma's 64
    _record(tmp_path, monkeypatch, "mxfp4", 512, 1024, 64, wgmma_w.Hints(2, 4, 1, mt=64))
    assert ops.plan(20, "sm_90", "mxfp4", 512, 1024, "float16") == ("linear", 64)
    _record(tmp_path, monkeypatch, "mxfp4", 512, 1024, 32, wgmma_w.Hints(2, 4, 1, mt=32))
    assert ops.plan(20, "sm_90", "mxfp4", 512, 1024, "float16") == ("linear", 32)
    assert ops.plan(40, "sm_90", "mxfp4", 512, 1024, "float16") == ("linear", 64)
    assert ops.plan(20, "sm_90", "mxfp4", 1024, 1024, "float16") == ("linear", 64)  # another shape


def test_the_rule_serves_257_to_4096_rows_where_a_record_names_it(tmp_path, monkeypatch):
    """Buckets of 128 rows from 257 to 1024 rows, then 2048 and 4096: decode + cuBLAS untuned (no routed
    rule serves them), the fused kernel where the log's record for that bucket says it measured faster;
    past 4096 rows decode + cuBLAS."""
    sm90 = targets.cuda("sm_90")
    for bucket in ops.WIDE:
        spec = builder.KernelSpec("mxfp4", 512, 1024, bucket, "float16", "float16", False, 32, sm90)
        assert rules.route(spec) == [rules.get("dlight")] and rules.tunable(spec) == [rules.get("wgmma_w")]
    rows = (256, 257, 384, 385, 1000, 1024, 1025, 2048, 2049, 4096, 4097)
    buckets = {m: builder.m_bucket_for(m, "cuda") for m in rows}
    assert [buckets[m] for m in rows] == [256, 384, 384, 512, 1024, 1024, 2048, 2048, 4096, 4096, None]
    assert ops.plan(300, "sm_90", "mxfp4", 512, 1024, "float16") == ("decode", None)
    _record(tmp_path, monkeypatch, "mxfp4", 512, 1024, 384, wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2))
    for m in (257, 300, 384):
        assert ops.plan(m, "sm_90", "mxfp4", 512, 1024, "float16") == ("linear", 384)
    for m in (256, 385, 1024, 1025, 4097):  # buckets without a record, and past the last
        assert ops.plan(m, "sm_90", "mxfp4", 512, 1024, "float16") == ("decode", None)


@pytest.mark.nvcc
def test_a_records_kernel_is_built_for_sm_90a(tmp_path, monkeypatch):
    """Built for the ``sm_90`` target the rules and the log know, compiled for ``sm_90a`` (ptxas
    rejects wgmma elsewhere): the record's M tile, wgmmas asynchronous, no spills."""
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path / "cache"))
    _record(tmp_path, monkeypatch, "mxfp4", 512, 1024, 128, wgmma_w.Hints(2, 4, 1, mt=64))
    kern = mxgemm.build("mxfp4", n=512, k=1024, m_bucket=128, target="sm_90")
    assert kern.rule == "wgmma_w" and kern.info["hints"] == wgmma_w.Hints(2, 4, 1, mt=64).to_dict()
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in kern.source
    ptxas.assert_wgmmas_async_no_spills(kern.source, tmp_path)
    with pytest.raises(subprocess.CalledProcessError) as e:  # what the arch attribute spares the rule
        ptxas.report(kern.source, tmp_path, arch="sm_90")
    assert "wgmma" in e.value.stderr


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("record", LINEARS)
def test_gpu_linear_runs_the_records_kernel(tmp_path, monkeypatch, dtype, record):
    """``mxgemm.linear`` with a ``wgmma_w`` record, at 100 rows (split K: its workspace comes from TVM's
    pool; or its parts added across a cluster of 2 blocks, launched as one, in a CUDA graph too), at
    300 (bucket 384, 256-row tiles), at 400 (bucket 512, 256-row tiles split in a cluster) and at 20
    (bucket 32, a part-filled 32-row tile): the
    record's kernel, against the oracle's float64 product, one-hot rows bit for bit, and a CUDA
    graph's replay equal to the eager call."""
    (fmt, n, k, bucket, hints), m = record, ROWS[record[3]]
    _record(tmp_path, monkeypatch, fmt, n, k, bucket, hints)
    dt = getattr(torch, dtype)
    torch.manual_seed(1)
    w = mxgemm.quantize(torch.randn(n, k, device="cuda") * 0.05, fmt)
    kern = mxgemm.build(fmt, n=n, k=k, m_bucket=bucket, a_dtype=dtype, target="cuda")
    assert kern.rule == "wgmma_w"
    x = (torch.randn(m, k, device="cuda") * 2).to(dt)
    y = mxgemm.linear(x, w).cpu().double()
    wd = _dequant(w, fmt)
    ref = x.cpu().double() @ wd.T
    rounding = 2.0 ** -(11 if dtype == "float16" else 8)
    assert ((y - ref).abs() <= x.cpu().double().abs() @ wd.abs().T * 2.0**-20 + ref.abs() * rounding).all()
    cols = torch.arange(m) * 7 % k
    onehot = torch.zeros(m, k, dtype=dt, device="cuda")
    onehot[torch.arange(m), cols] = 1.0
    assert torch.equal(mxgemm.linear(onehot, w).cpu(), wd[:, cols].T.to(dt))
    eager = mxgemm.linear(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mxgemm.linear(x, w)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
