"""Rows split between two kernels (`mxgemm.ops.row_parts`): where the tune log's times say so, the first
rows of a call past 256 run on a whole bucket's kernel and the rest on theirs, each writing its slice of
one output."""

import functools

import pytest
import torch

import mxgemm
from mxgemm import ops, tunelog
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets
from mxgemm.rules import wgmma_w
from tests.test_linear import _check, _weights

N, K = 512, 1024  # a shape the shipped log holds no record of
SPLIT_SHAPE = ("mxfp4", 14336, 4096)  # GPU test: a shape whose shipped records split 300 rows
SPLIT_M = 300


def _log(tmp_path, monkeypatch, records):
    """A user tune log of ``records``: {bucket: (rule, hints, µs, gpu)} for mxfp4 [N, K] fp16 on sm_90."""
    log = tmp_path / "user.json"
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(log))
    recs = []
    for bucket, (rule, hints, us, gpu) in records.items():
        versions = tunelog.rule_versions(rule, builder.versions(targets.cuda("sm_90")))
        recs.append(tunelog.Record("mxfp4", N, K, bucket, "float16", "sm_90", rule, hints, us, gpu, versions))
    tunelog.merge(log, recs)
    ops.clear_kernels()  # plans and records are looked up once per process


def _parts(m, dtype="float16"):
    return ops.row_parts(m, "sm_90", "mxfp4", N, K, dtype)


def test_rows_split_where_the_logs_times_say_two_kernels_are_faster(tmp_path, monkeypatch):
    fused = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2).to_dict()
    _log(
        tmp_path,
        monkeypatch,
        {
            1: ("dequant", {}, 3.0, "H"),
            4: ("dequant", {}, 4.0, "H"),
            64: ("dequant", {}, 5.0, "H"),
            128: ("dequant", {}, 12.0, "H"),
            256: ("wgmma_w", fused, 10.0, "H"),
            384: ("dequant", {}, 20.0, "H"),
            512: ("wgmma_w", fused, 21.0, "H"),
        },
    )
    # the 384 bucket's decode + cuBLAS, 20 µs at 384 rows, is taken as 20 m / 384 at m rows: 256 + 64
    # rows (10 + 5 µs) beat it at 300 rows (15.6), 256 + 1 (13) at 257 (13.4), 256 + 4 (14) not at 260
    # (13.5), 256 + 128 (22) not at 384
    assert [_parts(m) for m in (257, 260, 300, 320, 384)] == [(256, 1), (260,), (256, 44), (256, 64), (384,)]
    # 385-512 rows: 256 + 256 rows (20 µs) beats the 512 bucket's fused 21 (part-filled tiles: 21 at
    # any of its rows); the 384 bucket's 20 + 16's (no record) is not compared
    assert _parts(400) == (256, 144) and _parts(512) == (256, 256)
    assert _parts(256) == (256,) and _parts(100) == (100,)  # only past 256 rows
    assert _parts(600) == (600,)  # no record of the 640 bucket: nothing to compare with
    assert _parts(300, "bfloat16") == (256, 44)  # bf16 takes the fp16 records of shared rules
    assert ops.row_parts(300, "llvm", "mxfp4", N, K, "float16") == (300,)
    # what is built for 300 rows: the 256 bucket's kernel and the 64 bucket's decode
    layer = dict(fmt="mxfp4", n=N, k=K, a_dtype="float16", target="sm_90")
    got = ops.build_args_all(300, **layer)
    assert [(a.get("op", "linear"), a["m_bucket"]) for a in got] == [("linear", 256), ("decode", None)]
    monkeypatch.setenv(ops.SPLIT_ENV, "0")
    assert ops.build_args_all(300, **layer) == [ops.build_args(300, **layer)]


def test_no_split_across_records_of_different_gpus(tmp_path, monkeypatch):
    """Times of another card are not compared: a split needs the records of one GPU."""
    _log(
        tmp_path,
        monkeypatch,
        {
            64: ("dequant", {}, 5.0, "H200"),
            256: ("dequant", {}, 10.0, "H100"),
            384: ("dequant", {}, 20.0, "H100"),
        },
    )
    assert _parts(300) == (300,)


def test_a_tail_of_17_to_32_rows_takes_the_64_row_record_without_one_of_its_own(tmp_path, monkeypatch):
    """The 32-row bucket runs as the 64-row one until the log holds a record of its own
    (`mxgemm.ops.BORROWS`), and the split's times follow the kernel that runs."""
    fused = wgmma_w.Hints(2, 3, 1, mt=256, ring=1, tma=2).to_dict()
    records = {
        64: ("dequant", {}, 3.0, "H"),
        256: ("wgmma_w", fused, 10.0, "H"),
        384: ("dequant", {}, 20.0, "H"),
    }
    _log(tmp_path, monkeypatch, records)
    assert _parts(280) == (256, 24)  # 10 + 3 µs against 20 × 280 / 384 = 14.6
    _log(tmp_path, monkeypatch, {**records, 32: ("dequant", {}, 5.0, "H")})
    assert _parts(280) == (280,)  # the 32-row bucket's own record: 10 + 5 µs


@pytest.fixture
def cut_at_64(monkeypatch):
    """Every call past 64 rows split at row 64 (the routes looked up afresh, and forgotten after the
    test even if it fails)."""
    monkeypatch.setattr(ops, "row_parts", _cut_at_64)
    ops.clear_kernels()
    yield
    ops.clear_kernels()


@functools.cache
def _cut_at_64(m, *layer):
    return (64, m - 64) if m > 64 else (m,)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_split_rows_write_their_slices(cut_at_64, dtype, bias):
    """The split route itself on this CPU's kernels (the CPU never splits: its kernels serve any M),
    rows cut at 64, a batch dimension, with and without bias: the product of the reference."""
    _split_matches_the_reference("cpu", dtype, bias)


FORCED = (40, 96, (64, 4))  # the forced split's shape and its two runs of rows (kernels: tests.prebuild_gpu)


def _split_matches_the_reference(device, dtype, bias, n=FORCED[0], k=FORCED[1]):
    dt = getattr(torch, dtype)
    q = _weights("mxfp4", n, k).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 34, k, generator=g).to(dt).to(device)  # 68 rows: 64 + 4
    b = torch.randn(n, generator=g).to(dt).to(device) if bias else None
    y = mxgemm.linear(x, q, b)
    route = next(v for key, v in ops._routes.items() if key[0] == 68 and key[1] == x.device)
    assert type(route) is tuple and [(r0, r1) for r0, r1, _ in route] == [(0, 64), (64, 68)]
    _check(x, q, b, y, cublas=device == "cuda" and any(kernel is None for *_, kernel in route))


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_split_rows_write_their_slices(cut_at_64, dtype, bias):
    """As the CPU test, on the GPU kernels."""
    _split_matches_the_reference("cuda", dtype, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_the_shipped_logs_split_runs(dtype):
    """A shape and M that the shipped log splits, as routed: against the reference, and one-hot rows
    (each output one decoded weight) bit for bit in both parts."""
    fmt, n, k = SPLIT_SHAPE
    ops.clear_kernels()
    assert len(ops.row_parts(SPLIT_M, targets.device_arch(), fmt, n, k, dtype)) == 2
    dt = getattr(torch, dtype)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02
    q = mxgemm.quantize(w, fmt).to("cuda")
    x = torch.randn(SPLIT_M, k, generator=torch.Generator().manual_seed(1)).to(dt).to("cuda")
    y = mxgemm.linear(x, q)
    route = ops._routes[(SPLIT_M, x.device, dt, fmt, n, k, False, 32, None)]
    _check(x, q, None, y, cublas=any(kernel is None for *_, kernel in route))
    cols = torch.arange(SPLIT_M) * 13 % k
    hot = torch.zeros(SPLIT_M, k, dtype=dt, device="cuda")
    hot[torch.arange(SPLIT_M), cols] = 1
    assert torch.equal(mxgemm.linear(hot, q), mxgemm.dequantize(q)[:, cols].T.to(dt))
