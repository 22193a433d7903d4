"""Tune logs: read/write/merge, version skipping, corruption handling (CPU)."""

import json
import logging

import pytest

from mxgemm import tunelog
from mxgemm.tunelog import Record

V1 = {"mxgemm": "0.1.0", "tvm": "0.27.0.post1"}
V2 = {"mxgemm": "0.2.0", "tvm": "0.27.0.post1"}


def rec(us, versions=V1, n=4096, rule="gemv", **config):
    """A record built with the build ``versions`` (stored as the rule's versions, as `mxgemm tune` does)."""
    cur = tunelog.rule_versions(rule, versions)
    return Record("mxfp4", n, 4096, 1, "float16", "sm_90", rule, config, us, "NVIDIA H100", cur)


def test_merge_keeps_the_fastest_per_key_and_round_trips(tmp_path):
    p = tmp_path / "sm_90.json"
    tunelog.merge(p, [rec(20.0, rows=2), rec(30.0, n=8192)], V1)
    merged = tunelog.merge(p, [rec(15.0, rows=8), rec(40.0, n=8192)], V1)
    assert [(r.n, r.us, r.config) for r in merged] == [(4096, 15.0, {"rows": 8}), (8192, 30.0, {})]
    assert tunelog.read(p) == merged
    assert not list(tmp_path.glob(".sm_90.json.*"))  # the temp file was renamed into place


def test_a_replacing_merge_renews_its_keys_even_if_slower(tmp_path):
    """A re-tune (measured against the hints it replaces, in one run) replaces its keys' records; the
    log's other keys stay, and within the run the fastest record of a key still wins."""
    p = tmp_path / "sm_90.json"
    tunelog.merge(p, [rec(10.0, rows=2), rec(30.0, n=8192)], V1)
    merged = tunelog.merge(p, [rec(14.0, rows=4), rec(12.0, rows=8)], V1, replace=True)
    assert [(r.n, r.us, r.config) for r in merged] == [(4096, 12.0, {"rows": 8}), (8192, 30.0, {})]
    stale = tunelog.merge(p, [rec(5.0, versions=V2, n=8192, rows=1)], V1, replace=True)  # another source's
    assert [(r.n, r.us) for r in stale] == [(4096, 12.0), (8192, 30.0)]  # does not replace a current one


def test_current_versions_replace_old_ones_even_if_slower(tmp_path):
    p = tmp_path / "sm_90.json"
    tunelog.merge(p, [rec(10.0, versions=V1)], V1)
    merged = tunelog.merge(p, [rec(12.0, versions=V2)], V2)
    assert [(r.us, r.versions) for r in merged] == [(12.0, tunelog.rule_versions("gemv", V2))]


def test_lookup_skips_other_versions_and_prefers_the_fastest(tmp_path, caplog):
    shipped, user = tmp_path / "shipped.json", tmp_path / "user.json"
    tunelog.merge(shipped, [rec(20.0)], V1)
    tunelog.merge(user, [rec(18.0, rule="mma", nt=2)], V1)
    key = rec(1).key()
    assert tunelog.lookup(key, V1, [shipped, user]).rule == "mma"
    with caplog.at_level(logging.DEBUG, logger="mxgemm.tunelog"):
        assert tunelog.lookup(key, V2, [shipped, user]) is None
    assert "skipped" in caplog.text
    assert tunelog.lookup(rec(1, n=1).key(), V1, [shipped, user]) is None  # missing: default hints


def test_bf16_borrows_the_fp16_mma_record_and_nothing_else(tmp_path):
    """A bf16 key with no record of its own takes the fp16 key's record when its rule is mma (the same
    kernel but for one exact op per decoded pair); never a gemv record; its own record wins."""
    import dataclasses

    p = tmp_path / "sm_90.json"
    tunelog.merge(p, [rec(20.0, rule="mma", nt=2), rec(9.0, n=8192, rows=2)], V1)
    bf16 = dataclasses.replace(rec(1), a_dtype="bfloat16")
    assert tunelog.lookup(bf16.key(), V1, [p]).config == {"nt": 2}
    assert tunelog.lookup(dataclasses.replace(bf16, n=8192).key(), V1, [p]) is None  # gemv: not borrowed
    tunelog.merge(p, [dataclasses.replace(rec(25.0, rule="mma", nt=4), a_dtype="bfloat16")], V1)
    assert tunelog.lookup(bf16.key(), V1, [p]).config == {"nt": 4}


def test_bf16_borrows_an_fp16_record_with_its_hints(tmp_path):
    """A bf16 key without a record of its own borrows the fp16 record of a rule whose hints shape both
    kernels alike, every hint kept (``cvt`` included: fp8 pairs convert in both)."""
    import dataclasses

    p = tmp_path / "sm_90.json"
    tunelog.merge(p, [rec(20.0, rule="mma", nt=2, cvt=0), rec(9.0, n=8192, rule="wgmma_w", mt=64, cvt=1)], V1)
    bf16 = dataclasses.replace(rec(1), a_dtype="bfloat16")
    assert tunelog.lookup(bf16.key(), V1, [p]).config == {"nt": 2, "cvt": 0}
    assert tunelog.lookup(dataclasses.replace(bf16, n=8192).key(), V1, [p]).config == {"mt": 64, "cvt": 1}


@pytest.mark.nvcc
def test_a_bf16_layer_builds_on_an_fp16_cvt_record(tmp_path, monkeypatch):
    """A bf16 mxfp8_e4m3 layer whose shape has only an fp16 record with ``cvt`` builds its kernel with
    the record's hints: each pair converted to fp16, then widened to bf16."""
    import mxgemm
    from mxgemm.codegen import build as builder
    from mxgemm.rules import mma

    hints = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, cvt=1)
    versions = tunelog.rule_versions("mma", builder.versions({"kind": "cuda", "arch": "sm_90"}))
    fp16 = Record(
        "mxfp8_e4m3", 512, 2048, 1, "float16", "sm_90", "mma", hints.to_dict(), 5.0, "test", versions
    )
    log = tmp_path / "sm_90.json"
    tunelog.merge(log, [fp16], None)
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(log))
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path / "cache"))
    k = mxgemm.build("mxfp8_e4m3", n=512, k=2048, m_bucket=1, a_dtype="bfloat16", target="sm_90")
    assert k.rule == "mma" and k.info["hints"] == hints.to_dict()
    assert "cvt.rn.f16x2.e4m3x2" in k.source


def test_the_block_size_is_part_of_the_key(tmp_path):
    """A record tuned at block 64 is not used for block 32; a record written before the block size was
    in the key reads as its format's block size (what it was tuned at)."""
    p = tmp_path / "sm_90.json"
    at64 = Record(**{**rec(9.0).__dict__, "block_size": 64})
    tunelog.merge(p, [rec(20.0, rows=2), at64], V1)
    assert {r.block_size for r in tunelog.read(p)} == {32, 64}
    assert tunelog.lookup(rec(1).key(), V1, [p]).us == 20.0
    assert tunelog.lookup(at64.key(), V1, [p]).us == 9.0
    old = json.loads(p.read_text().splitlines()[0])
    del old["block_size"]
    p.write_text(json.dumps(old) + "\n")
    assert tunelog.read(p)[0].block_size == 32 and tunelog.read(p)[0].key() == rec(1).key()


def test_corrupt_lines_and_files_are_warnings_not_errors(tmp_path):
    p = tmp_path / "sm_90.json"
    tunelog.merge(p, [rec(20.0)], V1)
    p.write_text(p.read_text() + "{not json\n" + '{"fmt": "mxfp4"}\n')
    with pytest.warns(UserWarning) as w:
        records = tunelog.read(p)
    assert len(records) == 1 and len(w) == 2
    assert ":2 is corrupt" in str(w[0].message) and "missing field" in str(w[1].message)
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.warns(UserWarning, match="unreadable"):
        assert tunelog.read(p) == []
    assert tunelog.read(tmp_path / "absent.json") == []


def test_log_locations(monkeypatch, tmp_path):
    assert tunelog.shipped_log("sm_90").parent.name == "tune_logs"
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(tmp_path / "mine.json"))
    assert tunelog.user_log("sm_90") == tmp_path / "mine.json"


def test_rule_versions_follow_only_the_rules_own_sources(tmp_path, monkeypatch):
    """A record stays current when another rule's source changes, or its own only in docstrings,
    comments or layout, and goes stale when its own code does."""
    v = {**V1, "codegen": "whole-tree-digest"}
    gemv, tc = tunelog.rule_versions("gemv", v), tunelog.rule_versions("tensorcore", v)
    assert "codegen" not in gemv and gemv["mxgemm"] == "0.1.0" and gemv["rule"] != tc["rule"]
    assert tunelog.rule_versions("dlight.GEMV", v)["rule"] == tunelog.rule_versions("dlight", v)["rule"]
    assert tunelog.rule_versions("gemv", {**v, "codegen": "other"}) == gemv  # other sources: same
    fake = tmp_path / "mxgemm"
    (fake / "rules").mkdir(parents=True)
    monkeypatch.setattr(tunelog, "__file__", str(fake / "tunelog.py"))
    tunelog._rule_digest.cache_clear()
    try:
        (fake / "rules" / "gemv.py").write_text("A = 1\n")
        before = tunelog.rule_versions("gemv", v)["rule"]
        (fake / "rules" / "gemv.py").write_text('"""Reworded."""\n\nA = (  # a comment\n    1\n)\n')
        tunelog._rule_digest.cache_clear()
        assert tunelog.rule_versions("gemv", v)["rule"] == before  # docstrings, comments, layout: same
        (fake / "rules" / "gemv.py").write_text("A = 2\n")
        tunelog._rule_digest.cache_clear()
        assert tunelog.rule_versions("gemv", v)["rule"] != before
    finally:
        tunelog._rule_digest.cache_clear()


def _line(r: Record, **change) -> str:
    from dataclasses import asdict

    return json.dumps({**asdict(r), **change}, allow_nan=True)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"rule": None}, "field rule"),
        ({"rule": ["cpu"]}, "field rule"),
        ({"rule": "fastest"}, "no rule 'fastest'"),
        ({"us": "fast"}, "field us"),
        ({"us": float("nan")}, "field us"),
        ({"us": -1.0}, "field us"),
        ({"n": "4096"}, "field n"),
        ({"config": {"rows": 3}}, "gemv hints"),
        ({"config": {"nonsense": 1}}, "gemv hints"),
        ({"config": [1]}, "field config"),
    ],
)
def test_a_bad_record_is_skipped_with_one_warning_and_never_hides_a_good_one(tmp_path, change, why):
    """A bad user record faster than the shipped one must not win, crash the lookup, or hide it."""
    shipped, user = tmp_path / "shipped.json", tmp_path / "user.json"
    good = rec(20.0, rows=2)
    tunelog.merge(shipped, [good], V1)
    user.write_text(_line(rec(1.0, rows=8), **change) + "\n" + json.dumps("a string line") + "\n")
    with pytest.warns(UserWarning) as w:
        found = tunelog.lookup(good.key(), V1, [shipped, user])
    assert found == good
    assert len(w) == 2 and why in str(w[0].message) and "a record is a JSON object" in str(w[1].message)


def test_the_shipped_log_is_current_for_this_code():
    """Every shipped record matches this code's rule digests: a change to a rule (or its inputs) that
    leaves its kernels' TIR unchanged must restate them (benchmarks/restate_tune_log.py), else every
    GPU kernel silently falls back to its rule's default hints."""
    from mxgemm.codegen.build import versions

    records = tunelog.read(tunelog.shipped_log("sm_90"))
    assert len(records) > 400
    built = versions({"kind": "cuda", "arch": "sm_90"})
    stale = [r for r in records if r.versions != tunelog.rule_versions(r.rule, built)]
    assert not stale, f"{len(stale)} stale records, e.g. {stale[0]}"
