"""`mxgemm bench --device cpu` runs every method at every cell and writes its results (timings are
not asserted: benchmarks are not tests)."""

import json

from mxgemm import bench_cpu
from mxgemm.cli import main


def test_cpu_bench_times_every_method_and_writes_results(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_cpu, "BUDGET_S", 0.01)
    monkeypatch.setattr(bench_cpu, "MAX_COPIES", 2)
    assert (
        main(
            [
                "bench",
                "--device",
                "cpu",
                "--shapes",
                "64,256",
                "--m",
                "1,3",
                "--formats",
                "mxfp4",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (path,) = tmp_path.glob("*/bench-cpu-*.json")
    res = json.loads(path.read_text())
    methods = {"torch_fp32", "torch_bf16", "torch_int4", "mxgemm_mxfp4"}
    assert {(r["m"], r["method"]) for r in res["rows"]} == {(m, x) for m in (1, 3) for x in methods}
    for r in res["rows"]:
        assert r["ms"] > 0 and r["weight_bytes"] > 0
        if r["method"] == "torch_bf16":
            assert r["vs_bf16"] == 1.0
    mx = next(r for r in res["rows"] if r["method"] == "mxgemm_mxfp4")
    assert mx["weight_bytes"] == 64 * 256 // 2 + 64 * 256 // 32  # 4-bit codes + one scale byte per 32
    assert "| mxgemm_mxfp4 |" in path.with_suffix(".md").read_text()
