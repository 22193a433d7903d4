"""Shapes the tune logs lack take the record of the nearest tuned shape, its hints fitted to theirs
(`mxgemm.tunelog.neighbours`, `mxgemm.nearest.borrowed`, `Rule.closest`); CPU, with a GPU test of
the kernels they build."""

import dataclasses

import pytest
import torch

import mxgemm
from mxgemm import nearest, ops, rules, tune, tunelog
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets
from mxgemm.rules import mma, wgmma_w
from tests.test_linear import _check, _weights

SM90 = targets.cuda("sm_90")
pytestmark = pytest.mark.usefixtures("borrowing")  # (the other tests run with borrowing off: conftest)
VERSIONS = builder.versions(SM90)


def _rec(n, k, bucket, rule, hints, us=10.0, a_dtype="float16", fmt="mxfp4"):
    config = {} if hints is None else hints.to_dict()
    cur = tunelog.rule_versions(rule, VERSIONS)
    return tunelog.Record(fmt, n, k, bucket, a_dtype, "sm_90", rule, config, us, "NVIDIA H200", cur)


def _key(n, k, bucket, a_dtype="float16", fmt="mxfp4"):
    return tunelog.Key(fmt, n, k, bucket, a_dtype, "sm_90").key()


def _spec(n, k, bucket, a_dtype="float16", fmt="mxfp4"):
    return builder.KernelSpec(fmt, n, k, bucket, a_dtype, a_dtype, False, 32, SM90)


def test_neighbours_are_other_shapes_of_the_key_nearest_first(tmp_path, monkeypatch):
    """Same format, bucket, dtype, block size and arch; the key's own shape and other buckets left
    out; nearest by |ln n/n'| + |ln k/k'|; a bf16 key also takes fp16 records of shared rules."""
    h = mma.Hints(1, 2, 4, 2)
    log = tmp_path / "sm_90.json"
    tunelog.merge(
        log,
        [
            _rec(4096, 4096, 16, "mma", h),
            _rec(14336, 4096, 16, "mma", h),
            _rec(14336, 4096, 16, "mma", h, us=5.0, a_dtype="bfloat16"),
            _rec(28672, 8192, 16, "mma", h),
            _rec(4096, 4096, 64, "dequant", None),  # another bucket
            _rec(18944, 3584, 16, "mma", h, fmt="mxfp8_e4m3"),  # another format
        ],
    )
    got = tunelog.neighbours(_key(18944, 3584, 16), VERSIONS, [log])
    assert [(r.n, r.k) for r in got] == [(14336, 4096), (28672, 8192), (4096, 4096)]
    assert tunelog.neighbours(_key(14336, 4096, 16), VERSIONS, [log])[0].n == 4096  # not its own
    bf16 = tunelog.neighbours(_key(18944, 3584, 16, "bfloat16"), VERSIONS, [log])
    assert [(r.n, r.a_dtype) for r in bf16] == [(14336, "bfloat16"), (28672, "float16"), (4096, "float16")]
    for off in ("MXGEMM_NEAREST", "MXGEMM_TUNED"):
        with monkeypatch.context() as m:
            m.setenv(off, "0")
            assert tunelog.neighbours(_key(18944, 3584, 16), VERSIONS, [log]) == []


def test_closest_keeps_a_fitting_record_and_changes_the_fewest_fields():
    rule = rules.get("mma")
    spec = _spec(18944, 3584, 1)  # K = 3584: 112 steps of 32, so kw × unroll must divide 112
    cands = set(rule.candidates(spec))
    fits = next(h for h in cands if h.kw == 2)
    assert rule.closest(spec, fits) == (fits, 0)
    tuned = mma.Hints(nt=1, kw=8, unroll=8, stages=2)  # 4096's: 64 does not divide 112
    assert tuned not in cands and mma.fits(tuned, 14336, 4096)
    near, changed = rule.closest(spec, tuned)
    assert near in cands and changed == 1
    assert sum(getattr(near, f.name) != getattr(tuned, f.name) for f in dataclasses.fields(tuned)) == 1


def test_borrowed_takes_the_nearest_record_fitted_to_the_shape(tmp_path):
    mma_rule = rules.get("mma")
    tuned = next(h for h in mma_rule.candidates(_spec(14336, 4096, 32)) if h.kw * h.unroll == 32)
    wide = wgmma_w.Hints(2, 4, 1, mt=128, ring=1, tma=2, prod=2)
    log = tmp_path / "sm_90.json"
    tunelog.merge(
        log,
        [
            _rec(14336, 4096, 1, "mma", mma.Hints(nt=1, kw=2, unroll=4, stages=2)),
            _rec(14336, 4096, 32, "mma", tuned),
            _rec(14336, 4096, 128, "wgmma_w", wide),
            _rec(14336, 4096, 1024, "dequant", None),
        ],
    )
    lent = lambda n, k, bucket: nearest.borrowed(_key(n, k, bucket), _spec(n, k, bucket), VERSIONS, [log])  # noqa: E731
    got = lent(18944, 3584, 32)  # K = 3584: 112 steps of 32, which 32 K-steps an iteration do not divide
    fitted = mma_rule.typed(got.config)
    assert got.rule == "mma" and got.n == 14336 and fitted != tuned
    assert fitted in mma_rule.candidates(_spec(18944, 3584, 32))
    got = lent(18944, 3584, 128)  # 3584 = 28 K steps of 128: fits as it is
    assert got.rule == "wgmma_w" and rules.get("wgmma_w").typed(got.config) == wide
    assert lent(18944, 3584, 1024).rule == "dequant"
    assert lent(18944, 3584, 64) is None  # no record of the bucket
    assert lent(40, 96, 128) is None  # nothing tiles 40 rows
    assert lent(18944, 3584, 1) is None  # below FROM_BUCKET: the routed rule's defaults
    tunelog.merge(
        log, [_rec(14336, 4096, 1, "mma", mma.Hints(nt=1, kw=2, unroll=4, stages=2), fmt="mxfp8_e4m3")]
    )
    e4m3 = nearest.borrowed(
        _key(18944, 3584, 1, fmt="mxfp8_e4m3"), _spec(18944, 3584, 1, fmt="mxfp8_e4m3"), VERSIONS, [log]
    )
    assert e4m3.rule == "mma"  # 8-bit codes at one row: the router runs gemv untuned, a record mma


def test_past_256_rows_a_record_whose_grid_would_lose_its_waves_is_not_borrowed(tmp_path):
    """4096²'s 256-row tiles at 1024 rows: 128 blocks, one wave on 132 SMs; on 3584² 112 (still one),
    on 5120² 160 (two waves for 1.2 waves' work): borrowed for the one, not the other (there decode +
    cuBLAS runs, as without a record)."""
    mine = tunelog.lookup(_key(4096, 4096, 1024), VERSIONS)
    assert mine is not None and mine.rule == "wgmma_w" and mine.config["mt"] == 256
    log = tmp_path / "sm_90.json"
    tunelog.merge(log, [mine])
    lent = lambda n, k: nearest.borrowed(_key(n, k, 1024), _spec(n, k, 1024), VERSIONS, [log])  # noqa: E731
    assert lent(3584, 3584).config == mine.config
    assert lent(5120, 5120) is None


def test_a_shape_the_shipped_log_lacks_runs_its_neighbours_kernels(monkeypatch):
    """Qwen2.5-32B's MLP (27648×5120): from 128 rows a fused record of a shape like it instead of
    decode + cuBLAS, at 32 and 64 the neighbours' kernels instead of the defaults, below 32 rows the
    defaults; without borrowing (``$MXGEMM_NEAREST=0``) as before."""
    shape = ("mxfp4", 27648, 5120, "float16")
    assert tunelog.lookup(_key(27648, 5120, 128), VERSIONS) is None
    assert ops.plan(128, "sm_90", *shape[:3], "float16") == ("linear", 128)
    assert builder.tuned_hints("mxfp4", 27648, 5120, 128, "float16", SM90, 32)[0] == "wgmma_w"
    assert builder.tuned_hints("mxfp4", 27648, 5120, 32, "float16", SM90, 32) is not None
    assert builder.tuned_hints("mxfp4", 27648, 5120, 16, "float16", SM90, 32) is None  # the defaults
    monkeypatch.setenv("MXGEMM_NEAREST", "0")
    ops.clear_kernels()  # (the fixture `borrowing` clears them again after the test)
    assert ops.plan(128, "sm_90", *shape[:3], "float16") == ("decode", None)
    assert builder.tuned_hints("mxfp4", 27648, 5120, 32, "float16", SM90, 32) is None
    assert ops.plan(20, "sm_90", *shape[:3], "float16") == ("linear", 64)  # 17-32 rows as 64


def test_the_tuner_measures_what_a_shape_the_logs_lack_runs_now():
    """`mxgemm tune` of such a shape seeds each rule with the record it borrows: a tuned record is
    then never slower than what ran before it (the same run times both)."""
    for bucket in (32, 128):
        task = tune.Task("mxfp4", 27648, 5120, bucket, "float16", "sm_90")
        rule, hints = builder.tuned_hints("mxfp4", 27648, 5120, bucket, "float16", SM90, 32)
        assert (rule, hints) in tune.candidates(task, 2)


GPU_SHAPE = (3584, 1536)  # a shape the shipped log lacks (N, K), its neighbours' tiles fitted to it
GPU_MS = (1, 16, 64, 128, 256)
GPU_FORMATS = ("mxfp4", "mxfp8_e4m3", "mxfp6_e2m3")


def gpu_cases(arch: str):
    """`mxgemm.build` arguments of the kernels :func:`test_borrowed_kernels_compute_the_product` runs."""
    n, k = GPU_SHAPE
    for fmt in GPU_FORMATS:
        for dt in ("float16", "bfloat16"):
            for m in GPU_MS:
                yield from ops.build_args_all(m, fmt=fmt, n=n, k=k, a_dtype=dt, target=arch)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", GPU_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_borrowed_kernels_compute_the_product(fmt, dtype):
    """The kernels a shape the logs lack runs on borrowed records: the product of the reference."""
    n, k = GPU_SHAPE
    q = _weights(fmt, n, k).to("cuda")
    dt = str(dtype).removeprefix("torch.")
    assert any(builder.tuned_hints(fmt, n, k, b, dt, SM90, 32) for b in (16, 64, 128)), (
        "no borrowed record: the test would not test borrowing"
    )
    g = torch.Generator().manual_seed(1)
    for m in GPU_MS:
        x = (torch.randn(m, k, generator=g) / 8).to("cuda", dtype)
        _check(x, q, None, mxgemm.linear(x, q))
