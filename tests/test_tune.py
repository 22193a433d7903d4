"""`mxgemm tune`: shapes from a model config, tasks, deterministic valid candidates, and the whole
build → measure → merge flow end to end on this CPU (LLVM kernels, measured here), split and one-box."""

import dataclasses
import functools
import json

import pytest
import torch

import mxgemm
from mxgemm import cli, ops, rules, tune, tunelog
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets
from mxgemm.rules import gemv, mma, tensorcore

AVX2 = {"kind": "llvm", "mcpu": "znver3"}


@pytest.fixture(autouse=True)
def avx2_host(monkeypatch):
    """This machine's CPU target, for these tests, is an AVX2 one (any x86-64 box of ours runs its
    kernels): the CPU routes they check are the GEMV's and decode + torch's GEMM; `cpu_dot` (AVX-512)
    is tuned in test_cpu_dot.py."""
    from mxgemm import ops

    monkeypatch.setattr(targets, "cpu", lambda: AVX2)
    ops.clear_kernels()
    yield
    ops.clear_kernels()


@pytest.fixture(scope="module")
def cpu_arch():
    return builder.arch_name(AVX2)  # needs TVM's LLVM support: not at import (GPU boxes run tests too)


LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}


def test_model_shapes_from_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert tune.model_shapes(tmp_path) == [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(tune.TuneError, match="config.json: needs hidden_size"):
        tune.model_shapes(tmp_path)


def test_tasks_cover_the_tunable_buckets(cpu_arch):
    todo, notes = tune.tasks([(4096, 4096)], ["mxfp4"], (1, 2, 4, 16, 8192), "float16", "sm_90")
    assert [t.m_bucket for t in todo] == [1, 4, 16]  # what `mxgemm.linear` runs: the mma rule
    # 17-32 rows run as 64 until the log holds a 32-row record: the 32-row bucket is what is tuned
    assert ops.plan(20, "sm_90", "mxfp4", 2048, 4096, "float16") == ("linear", 64)
    todo, _ = tune.tasks([(2048, 4096)], ["mxfp4"], (20, 32, 64), "float16", "sm_90")
    assert [(t.m_bucket, tune.rule_of(t)) for t in todo] == [(32, "mma"), (64, "mma")]
    assert notes == ["4096,4096 M=8192: decode + cuBLAS, no hints to tune: skipped"]
    # 256 rows: decode + cuBLAS while the log has no fused record there; the fused rule is tuned
    # against it (a decode candidate); 257-1024 rows (buckets of 128 rows), 2048 and 4096 only wgmma_w,
    # which the router never tries untuned, against decode + cuBLAS; past 4096 rows decode + cuBLAS is
    # all there is (a shape with no record in the shipped log)
    ms = (16, 256, 300, 512, 1500, 4096, 8192)
    bf16, notes = tune.tasks([(2048, 4096)], ["mxfp4"], ms, "bfloat16", "sm_90")
    got = [(t.m_bucket, tune.rule_of(t)) for t in bf16]
    wide = [(b, "wgmma_w") for b in (384, 512, 2048, 4096)]
    assert got == [(16, "mma"), (256, "mma"), *wide]  # then the rival alone
    for m in (256, 300, 512, 1500, 4096):
        assert ops.plan(m, "sm_90", "mxfp4", 2048, 4096, "bfloat16", 32)[0] == "decode"
    # the rival's candidates, and decode + cuBLAS beside them
    assert {r for r, _ in tune.candidates(bf16[2], 4)} == {"wgmma_w"} and tune._decode_competes(bf16[2])
    assert notes == ["2048,4096 M=8192: decode + cuBLAS, no hints to tune: skipped"]
    cpu_tasks, notes = tune.tasks([(64, 256)], ["mxfp4"], (1, 4096), "float16", cpu_arch)
    assert [t.m_bucket for t in cpu_tasks] == [1] and tune.rule_of(cpu_tasks[0]) == "cpu_gemv"  # the GEMV
    assert notes == ["64,256 M=4096: decode + torch's GEMM, no hints to tune: skipped"]
    with pytest.raises(tune.TuneError, match="block size 32"):
        tune.tasks([(64, 100)], ["mxfp4"], (1,), "float16", "sm_90")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "bfp3"])
@pytest.mark.parametrize(
    ("m_bucket", "dtype", "rule"),
    [
        (1, "float16", mma),
        (16, "float16", mma),
        (64, "float16", mma),
        (1, "bfloat16", mma),
        (16, "bfloat16", mma),
    ],
)
def test_candidates_deterministic_and_valid(arch, fmt, m_bucket, dtype, rule):
    if m_bucket == 1 and fmt == "mxfp8_e4m3":
        rule = gemv  # 8-bit codes at M=1: gemv streams them faster
    task = tune.Task(fmt, 11008 if rule is gemv else 14336, 4096, m_bucket, dtype, arch)
    pairs = tune.candidates(task, 8)
    assert pairs == tune.candidates(task, 8)
    spec = task.spec()
    assert tune.rule_of(task) == rule.RULE.name
    cands = [h for r, h in pairs if r == rule.RULE.name]
    assert len(cands) == 8 and pairs[:8] == [(rule.RULE.name, h) for h in cands]  # the routed rule's first
    for r, h in pairs[8:]:  # then those of the rules the router does not pick untuned
        assert rules.get(r) in rules.rivals(spec) and rules.get(r).typed(h) in rules.get(r).candidates(spec)
    default = rule.RULE.default_hints(spec)
    assert cands[0] == default.to_dict() and len({json.dumps(c) for c in cands}) == 8
    f = mxgemm.formats.get(fmt)
    assert all(rule.fits(rule.Hints(**c), task.n, task.k, *([f] if rule is gemv else [])) for c in cands)


def test_the_records_of_the_buckets_beside_are_seeds():
    """A task's candidates hold, right after its own record, the hints of its rule's records for the
    M buckets just below and above (the shipped log's: mxfp4 14336×4096 at 1, 4 and 16 rows), where
    the rule offers them for the task; a bucket at the end of the range has one neighbour."""
    task = tune.Task("mxfp4", 14336, 4096, 4, "float16", "sm_90")
    rule, spec = rules.get("mma"), task.spec()
    own = tune._recorded(task, rule)
    near = [tune._recorded(dataclasses.replace(task, m_bucket=b), rule) for b in (1, 16)]
    assert own is not None and all(h is not None for h in near) and len({own, *near}) == 3
    got = [rule.typed(h) for r, h in tune.candidates(task, 8) if r == "mma"]
    assert got[: got.index(own) + 3] == list(dict.fromkeys([rule.default_hints(spec), own, *near]))
    assert all(h in rule.candidates(spec) for h in got)
    first = tune.Task("mxfp4", 14336, 4096, 1, "float16", "sm_90")
    assert tune._beside(first, rule) == [own]  # one row: only the 4-row bucket above


def test_a_faster_record_of_a_larger_bucket_is_a_seed(tmp_path, monkeypatch):
    """Where a larger bucket's record measured faster than the task's (a 384-row kernel that serves
    256 rows in less time than the 256-row record), its hints are among the task's seeds; a slower
    one beyond the neighbours is not."""
    rule = rules.get("wgmma_w")
    task = tune.Task("mxfp4", 6144, 4096, 256, "float16", "sm_90")
    spec = task.spec()
    offered = sorted(rule.candidates(spec), key=lambda h: rule.cost(spec, h))
    mine, fast, slow = offered[5], offered[9], offered[13]
    versions = tunelog.rule_versions("wgmma_w", tune._build_versions("sm_90"))
    rec = functools.partial(
        tunelog.Record, "mxfp4", 6144, 4096, a_dtype="float16", arch="sm_90", block_size=32,
        rule="wgmma_w", gpu="H200", versions=versions,
    )  # fmt: skip
    log = tmp_path / "mine.json"
    buckets = ((256, 50.0, mine), (512, 40.0, fast), (640, 60.0, slow))
    tunelog.merge(log, [rec(m_bucket=b, us=us, config=h.to_dict()) for b, us, h in buckets])
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(log))
    assert tune.faster_above(task) == [512]
    assert fast in tune._beside(task, rule) and slow not in tune._beside(task, rule)
    seeds = [rule.typed(h) for r, h in tune.candidates(task, 6) if r == "wgmma_w"]
    assert mine in seeds and fast in seeds and slow not in seeds


def test_records_of_other_n_of_the_same_k_are_seeds(tmp_path, monkeypatch):
    """A task's seeds hold its rule's records for the same format, dtype and bucket on other N of the
    same K, nearest N first; records of another K or bucket are not among them."""
    rule = rules.get("wgmma_w")
    task = tune.Task("mxfp4", 3072, 3072, 64, "float16", "sm_90")
    spec = task.spec()
    offered = sorted(rule.candidates(spec), key=lambda h: rule.cost(spec, h))
    near, far, other_k, other_m = offered[7], offered[11], offered[15], offered[19]
    versions = tunelog.rule_versions("wgmma_w", tune._build_versions("sm_90"))
    rec = functools.partial(
        tunelog.Record, "mxfp4", a_dtype="float16", arch="sm_90", block_size=32, rule="wgmma_w",
        gpu="H200", us=20.0, versions=versions,
    )  # fmt: skip
    found = (
        (8192, 3072, 64, far),
        (2048, 3072, 64, near),
        (2048, 4096, 64, other_k),
        (2048, 3072, 128, other_m),
    )
    log = tmp_path / "mine.json"
    tunelog.merge(log, [rec(n=n, k=k, m_bucket=m, config=h.to_dict()) for n, k, m, h in found])
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(log))
    assert tune._same_k(task, rule) == [near, far]
    seeds = [rule.typed(h) for r, h in tune.candidates(task, 6) if r == "wgmma_w"]
    assert near in seeds and far in seeds and other_k not in seeds and other_m not in seeds


@pytest.mark.parametrize(("m_bucket", "name"), [(512, "wgmma_w"), (16, "mma"), (64, "wgmma_w")])
def test_a_budget_spreads_over_new_structures_and_option_twins(tmp_path, monkeypatch, m_bucket, name):
    """After the defaults (no record: a shape the logs lack, nor any of its K, so no record seeds it),
    a budget alternates a twin of them (the same kernel with a new option on) and the cheapest hints
    of a structure not taken yet (its tiles, warps and splits: :attr:`Rule.structure`), so a small
    budget measures new kernels, not only the defaults' option flips; every candidate valid, none
    twice."""
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(tmp_path / "none.json"))
    task = tune.Task("mxfp4", 6144, 3072, m_bucket, "float16", "sm_90")
    spec, rule = task.spec(), rules.get(name)
    assert tunelog.lookup(task.key(), tune._build_versions("sm_90")) is None
    got = [rule.typed(h) for r, h in tune.candidates(task, 8) if r == name]
    assert len(got) == 8 and len(set(got)) == 8 and all(h in rule.candidates(spec) for h in got)
    shape = lambda h: tuple(getattr(h, f) for f in rule.structure)  # noqa: E731
    default = rule.default_hints(spec)
    twins = rule.twins(spec, default)
    assert got[0] == default and twins and rule.structure and got[1] == twins[0]
    ranked = sorted(rule.candidates(spec), key=lambda h: rule.cost(spec, h))
    assert got[2] == next(h for h in ranked if shape(h) not in {shape(got[0]), shape(got[1])})
    assert len({shape(h) for h in got}) >= 4 and sum(h in twins for h in got) >= min(len(twins), 3)


@pytest.mark.nvcc
def test_every_gemv_candidate_builds():
    task = tune.Task("mxfp8_e4m3", 256, 2048, 1, "bfloat16", "sm_90")  # gemv: 8-bit codes, one row
    cands = tune.candidates(task, 64)
    assert {r for r, _ in cands} == {"gemv", "mma"}  # mma: a rival the router leaves out at M=1
    for rule, hints in cands:
        if rule != "gemv":
            continue
        k = mxgemm.build(
            "mxfp8_e4m3",
            n=256,
            k=2048,
            m_bucket=1,
            a_dtype="bfloat16",
            target="sm_90",
            hints=hints,
            rule="gemv",
        )
        assert k.rule == "gemv" and k.info["hints"] == hints


@pytest.mark.nvcc
def test_every_mma_candidate_builds():
    task = tune.Task("mxfp6_e3m2", 256, 2048, 64, "float16", "sm_90")
    cands = tune.candidates(task, 64)
    assert {r for r, _ in cands} == {"mma", "wgmma_w"}  # 6-bit codes: two planes, which both read
    mma = [hints for r, hints in cands if r == "mma"]
    assert len(mma) > 20
    for hints in mma:
        k = mxgemm.build("mxfp6_e3m2", n=256, k=2048, m_bucket=64, target="sm_90", hints=hints, rule="mma")
        assert k.rule == "mma" and k.info["hints"] == hints and "mma.sync" in k.source


@pytest.mark.nvcc
def test_tensorcore_candidates_build():
    """The tensor-core rule's cheapest candidates compile when a tune log's hints pin the rule."""
    spec = tune.Task("mxfp6_e2m3", 256, 2048, 64, "float16", "sm_90").spec()
    for h in sorted(tensorcore.RULE.candidates(spec), key=lambda h: tensorcore.RULE.cost(spec, h))[:6]:
        k = mxgemm.build("mxfp6_e2m3", n=256, k=2048, m_bucket=64, target="sm_90", hints=h)
        assert k.rule == "tensorcore" and k.info["hints"] == h.to_dict() and "mma_sync" in k.source


def _cli(*args):
    return cli.main(["tune", *args])


def test_tune_end_to_end_on_cpu(tmp_path, capsys, cpu_arch):
    """One box: build, measure, merge; a second run has nothing to do; the log steers `mxgemm.build`."""
    log = tmp_path / "log.json"
    args = ["--shapes", "64,256", "--format", "mxfp4", "--arch", cpu_arch, "--log", str(log), "--budget", "3"]
    assert _cli(*args, "--table", str(tmp_path / "t.md")) == 0
    out = capsys.readouterr().out
    assert "1 task(s) to tune" in out and "| mxfp4 | 64 | 256 | ≤ 1 |" in out
    assert "decode + torch's GEMM, no hints to tune: skipped" in out  # 2 rows and more
    recs = {r.m_bucket: r for r in tunelog.read(log)}
    assert (
        list(recs) == [1]
        and recs[1].rule == "cpu_gemv"
        and recs[1].config["lanes"] in (8, 16, 32)
        and recs[1].us > 0
    )
    for rec in recs.values():
        assert rec.versions == tunelog.rule_versions(rec.rule, builder.versions(targets.cpu()))
    assert _cli(*args) == 0 and "0 task(s) to tune" in capsys.readouterr().out


def test_build_uses_the_tuned_hints(tmp_path, monkeypatch, cpu_arch):
    """A current-version record's hints are used by `mxgemm.build`; a stale one is ignored."""
    log = tmp_path / "user.json"
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(log))
    tgt = targets.cpu()
    rec = tunelog.Record(
        "bfp4",
        48,
        128,
        None,
        "float16",
        cpu_arch,
        "cpu",
        {"n_tile": 4},
        1.0,
        "cpu",
        tunelog.rule_versions("cpu", builder.versions(tgt)),
    )
    stale = tunelog.Record(
        "bfp4", 48, 256, None, "float16", cpu_arch, "cpu", {"n_tile": 2}, 1.0, "cpu", {"mxgemm": "0"}
    )
    tunelog.merge(log, [rec, stale])
    assert mxgemm.build("bfp4", n=48, k=128).info["hints"] == {"n_tile": 4}
    assert mxgemm.build("bfp4", n=48, k=256).info["hints"] == {"n_tile": 16}  # the rule's defaults
    monkeypatch.setenv("MXGEMM_NEAREST", "1")  # borrowing: the current record of the nearest shape
    assert mxgemm.build("bfp4", n=48, k=256).info["hints"] == {"n_tile": 4}
    q = mxgemm.quantize(torch.randn(48, 128), "bfp4")
    x = torch.randn(3, 128, dtype=torch.float16)
    ref = x.float() @ mxgemm.dequantize(q).T
    torch.testing.assert_close(mxgemm.linear(x, q).float(), ref, rtol=2e-3, atol=1e-3)


def test_tune_split_build_measure_merge(tmp_path, capsys, cpu_arch):
    kdir, log = tmp_path / "kernels", tmp_path / "log.json"
    common = [
        "--shapes",
        "32,128",
        "--format",
        "bfp5",
        "--arch",
        cpu_arch,
        "--budget",
        "2",
        "--m",
        "1",
        "--log",
        str(log),
    ]
    assert _cli(*common, "--build-only", str(kdir)) == 0
    manifest = json.loads((kdir / tune.MANIFEST).read_text())
    assert len(manifest) == 2 and all((kdir / e["path"]).exists() for e in manifest)  # travels with DIR
    assert not log.exists()
    assert _cli(*common, "--measure", str(kdir)) == 0
    assert len((kdir / tune.MEASUREMENTS).read_text().splitlines()) == 2
    assert _cli(*common, "--merge", str(kdir)) == 0
    (rec,) = tunelog.read(log)
    assert rec.fmt == "bfp5" and rec.n == 32 and rec.k == 128


def test_tune_bad_input(tmp_path, capsys, cpu_arch):
    assert _cli("--model", str(tmp_path), "--arch", cpu_arch) == 2
    assert "config.json" in capsys.readouterr().err
    assert _cli("--measure", str(tmp_path)) == 2
    assert "no readable tune manifest" in capsys.readouterr().err
    assert _cli("--merge", str(tmp_path)) == 2
    assert "no measurements" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _cli("--shapes", "64,256", "--budget", "lots")
    if not torch.cuda.is_available():
        assert _cli("--shapes", "64,256", "--arch", "sm_90", "--log", str(tmp_path / "l.json")) == 2
        err = capsys.readouterr().err
        assert "needs a CUDA GPU: measure through RPC servers" in err and "--build-only DIR" in err


def test_tune_arch_llvm_means_this_cpu(tmp_path, capsys, cpu_arch):
    log = tmp_path / "log.json"
    assert (
        _cli("--shapes", "32,64", "--format", "bfp4", "--arch", "llvm", "--budget", "1", "--log", str(log))
        == 0
    )
    assert {r.arch for r in tunelog.read(log)} == {cpu_arch}


def test_measure_checks_each_candidate_against_the_reference(tmp_path, cpu_arch, caplog):
    """A candidate that computes wrong values gets no record: here the manifest claims bfp4 for
    mxfp4 kernels (same bits, other values)."""
    todo, _ = tune.tasks([(64, 256)], ["mxfp4"], [1], "bfloat16", cpu_arch)
    entries = tune.build(todo, 2, tmp_path)
    good = builder.Kernel(
        todo[0].spec(),
        tmp_path / entries[0]["path"],
        {"rule": entries[0]["rule"], "hints": entries[0]["hints"]},
    )
    assert tune.check(good, todo[0], torch.device("cpu")) is None
    wrong = dataclasses.replace(todo[0], fmt="bfp4")
    assert "against the reference" in tune.check(good, wrong, torch.device("cpu"))
    manifest = json.loads((tmp_path / tune.MANIFEST).read_text())
    (tmp_path / tune.MANIFEST).write_text(
        json.dumps([{**e, "task": {**e["task"], "fmt": "bfp4"}} for e in manifest])
    )
    assert tune.measure(tmp_path) == []
    assert sum("is wrong, not timed" in m for m in caplog.messages) == len(manifest)


def test_candidates_include_the_records_hints(tmp_path, monkeypatch):
    """bf16 layers run the fp16 record's hints while the log has no bf16 record, and a re-tuned fp16
    task would replace its record: tuning measures those hints (second, after the defaults), so its
    winner is never slower than what ran before."""
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(tmp_path / "none.json"))
    shape = {"fmt": "mxfp4", "n": 14336, "k": 4096, "m_bucket": 16, "arch": "sm_90", "block_size": 32}
    fp16 = tune.Task(**shape, a_dtype="float16")  # the shipped log: an mma record, none in bf16
    rec = tunelog.lookup(fp16.key(), tune._build_versions("sm_90"), [tunelog.shipped_log("sm_90")])
    assert rec is not None and rec.rule == tune.rule_of(fp16)
    recorded = rules.get(rec.rule).typed(rec.config).to_dict()
    bf16 = [h for r, h in tune.candidates(tune.Task(**shape, a_dtype="bfloat16"), 3) if r == rec.rule]
    assert bf16[1] == recorded and len(bf16) == 3 and len({json.dumps(c, sort_keys=True) for c in bf16}) == 3
    assert tune.candidates(fp16, 3)[1] == (rec.rule, recorded)


@pytest.mark.nvcc
def test_mid_m_tasks_time_decode_then_cublas_too(tmp_path, monkeypatch):
    """In the buckets where the log decides between the fused kernel and decode + cuBLAS
    (`ops.DECIDED_BUCKETS`), a task's candidates include the decode kernel (rule dequant, no hints);
    elsewhere they do not."""
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path / "cache"))
    mid = tune.Task("mxfp4", 256, 512, 64, "float16", "sm_90", block_size=32)
    low = dataclasses.replace(mid, m_bucket=16)
    entries = tune.build([mid, low], 2, tmp_path)
    decode = [e for e in entries if e["rule"] == tune.DECODE_RULE]
    assert [e["task"]["m_bucket"] for e in decode] == [64] and decode[0]["hints"] == {}
    rules_64 = [e["rule"] for e in entries if e["task"]["m_bucket"] == 64]
    assert sorted(rules_64) == ["dequant", "mma", "mma", "wgmma_w", "wgmma_w"]  # and the unrouted rule's
    assert all(e["rule"] == "mma" for e in entries if e["task"]["m_bucket"] == 16)


@pytest.mark.gpu
def test_gpu_decode_candidate_is_checked_and_timed():
    """Decode + cuBLAS as a tune candidate: checked against the reference and timed like a kernel."""
    from mxgemm import ops

    task = tune.Task("mxfp4", 256, 2048, 64, "bfloat16", "sm_90", block_size=32)
    rows = ops.decode_chunk_rows(task.n, task.k)
    kernel = mxgemm.build("mxfp4", n=rows, k=task.k, a_dtype="bfloat16", target="sm_90", op="decode")
    candidate = tune.DecodeThenGemm(task, kernel.path)
    assert tune.check(candidate, task, torch.device("cuda")) is None
    assert 0 < tune._time(candidate, task) < 1e4


@pytest.mark.parametrize(("fused", "kept"), [(36.0, True), (37.0, False), (30.5, True)])
def test_a_wide_bucket_keeps_the_candidate_with_the_least_mean_over_its_rows(monkeypatch, fused, kept):
    """Past 256 rows the candidate kept is the one whose mean over the bucket's two ends is least:
    decode + cuBLAS here takes 30 µs at the first row, 513, and 43 at the last, 640 (a mean of 36.5);
    a fused kernel flat at ``fused`` µs; a second one faster at the last row (34) but slower at the
    first (40, a mean of 37) is not kept. The others get no time, so no record. (Times stand in for
    the GPU's; the decision is the tuner's own.)"""
    task = tune.Task("mxfp4", 4096, 4096, 640, "float16", "sm_90", block_size=32)
    times = {("decode", 513): 30.0, ("decode", 640): 43.0, ("flat", 513): fused, ("flat", 640): fused}
    times |= {("steep", 513): 40.0, ("steep", 640): 34.0}
    monkeypatch.setattr(tune, "_time", lambda kernel, t: times[kernel, t.m_bucket])
    group = [
        {"rule": "wgmma_w", "hints": {}},
        {"rule": "wgmma_w", "hints": {}},
        {"rule": tune.DECODE_RULE, "hints": {}},
    ]
    kernels = ["flat", "steep", "decode"]
    us = [times[name, 640] for name in kernels]
    tune._whole_bucket(task, group, kernels, us)
    assert us == ([fused, None, None] if kept else [None, None, 43.0])
    narrow = dataclasses.replace(task, m_bucket=256)  # (not a wide bucket: the last row alone decides)
    us = [times[name, 640] for name in kernels]
    tune._whole_bucket(narrow, group, kernels, us)
    assert us == [fused, 34.0, 43.0]


def test_merge_keeps_a_borrowing_bucket_on_the_lent_kernel_where_that_is_faster(tmp_path):
    """A 32-row task's best candidate goes into the log only where it beats the 64-row bucket's record
    that 17-32 rows run on without one (same GPU); the other buckets merge as measured."""
    versions = tunelog.rule_versions("mma", tune._build_versions("sm_90"))
    task = dict(fmt="mxint8", n=320, k=640, a_dtype="float16", arch="sm_90", block_size=32, rule="mma")
    rec = functools.partial(tunelog.Record, **task, config={"nt": 1}, gpu="H100", versions=versions)
    log = tmp_path / "log.json"
    tunelog.merge(log, [rec(m_bucket=64, us=10.0)])
    key32 = tunelog.Key("mxint8", 320, 640, 32, "float16", "sm_90", block_size=32).key()
    for us, gpu, merged in ((12.0, "H100", False), (12.0, "H200", True), (8.0, "H100", True)):
        kdir = tmp_path / f"{us}-{gpu}"
        kdir.mkdir()
        tune.write_measurements(kdir, [rec(m_bucket=32, us=t, gpu=gpu) for t in (us + 1, us)])
        assert [r.us for r in tune.merge(kdir, log)] == ([us] if merged else [])
        found = tunelog.lookup(key32, tune._build_versions("sm_90"), [log])
        assert (found is not None and found.us == us) is merged, (us, gpu)
        log.write_text("")
        tunelog.merge(log, [rec(m_bucket=64, us=10.0)])
    kdir = tmp_path / "m64"
    kdir.mkdir()
    tune.write_measurements(kdir, [rec(m_bucket=64, us=30.0)])  # not a borrowing bucket: merged as is
    assert [r.us for r in tune.merge(kdir, log, replace=True)] == [30.0]
