"""Keep a tune log's records across a refactor that does not change their kernels.

Records carry a digest of their rule's sources (`mxgemm.tunelog.rule_versions`), so any code change to
a rule or its inputs makes them stale. When the code change leaves every record's kernel the same,
their digests can be restated instead of re-measuring on a GPU:

    python benchmarks/restate_tune_log.py dump tune_logs/sm_90.json BEFORE_DIR   # on the old code
    python benchmarks/restate_tune_log.py dump tune_logs/sm_90.json AFTER_DIR    # on the new code
    python benchmarks/restate_tune_log.py restate tune_logs/sm_90.json BEFORE_DIR AFTER_DIR

``dump`` writes the scheduled TensorIR (TVMScript) of every record's kernel, as `mxgemm.build` would
schedule it with the record's hints (no nvcc, no GPU). ``restate`` rewrites the digests of the records
whose TIR is the same in both dumps, and lists the others (their records stay stale); it also writes
every record's ``block_size`` (part of the key; a record without one was tuned at its format's).
"""

from __future__ import annotations

import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _tir(rec: dict) -> tuple[str, str]:
    from mxgemm import tunelog
    from mxgemm.codegen import target as targets
    from mxgemm.codegen.build import KernelSpec, schedule

    r = tunelog.Record.from_dict(rec)
    tgt = targets.resolve(r.arch)
    dt = r.a_dtype
    if r.rule == "dequant":  # decode + cuBLAS: the record's kernel is the decode
        spec = KernelSpec(r.fmt, r.n, r.k, None, dt, dt, False, r.block_size, tgt, op="decode")
    else:
        spec = KernelSpec(r.fmt, r.n, r.k, r.m_bucket, dt, dt, False, r.block_size, tgt, r.rule, r.config)
    rule, mod, hints = schedule(spec)
    # the record's hints as the rule typed them (a field the record lacks: a later option, left out)
    used = {f: v for f, v in hints.to_dict().items() if f in r.config} if hints is not None else {}
    return _name(rec), f"# rule {rule} hints {json.dumps(used, sort_keys=True)}\n{mod.script()}"


def _name(rec: dict) -> str:
    key = [rec[f] for f in ("fmt", "n", "k", "m_bucket", "a_dtype", "arch")] + [rec.get("block_size", 32)]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]


def dump(log: str, out: str, jobs: int | str = 2) -> None:
    recs = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    Path(out).mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(int(jobs)) as pool:
        for i, (name, text) in enumerate(pool.map(_tir, recs, chunksize=4)):
            (Path(out) / f"{name}.tir").write_text(text)
            print(f"[{i + 1}/{len(recs)}]", end="\r", flush=True)
    print(f"dumped {len(recs)} kernels into {out}")


def restate(log: str, before: str, after: str) -> None:
    from mxgemm import tunelog
    from mxgemm.codegen.build import versions

    lines = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    same, differ = 0, []
    for rec in lines:
        name = _name(rec)
        rec["block_size"] = tunelog.Record.from_dict(rec).block_size  # the key's, filled when absent
        a, b = Path(before) / f"{name}.tir", Path(after) / f"{name}.tir"
        if a.exists() and b.exists() and a.read_text() == b.read_text():
            built = versions({"kind": "cuda", "arch": rec["arch"]})
            rec["versions"] = tunelog.rule_versions(rec["rule"], built)
            same += 1
        else:
            differ.append(rec)
    Path(log).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in lines))
    print(f"restated {same} of {len(lines)} records; {len(differ)} differ (left stale):")
    for rec in differ:
        print("  ", {k: rec[k] for k in ("fmt", "n", "k", "m_bucket", "a_dtype", "rule")})


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"dump": dump, "restate": restate}[cmd](*args)
