"""Build a leave-one-out round of borrowed records (`mxgemm.nearest.borrowed`): per task of a
shape the log holds, the kernel its own record runs, the kernel it would borrow from the nearest
other shape were its own records gone (the log read without that shape), and the rules' defaults
(what an untuned shape ran before borrowing: the routed rule's default hints up to 64 rows; decode +
cuBLAS rides along wherever the bucket decides, as the untuned path from 128 rows). ``mxgemm tune
--measure DIR`` times them in one run; ``--report DIR`` prints each task's three against each other.
Never merged into the log: it measures how well another shape's record serves a shape the log
lacks.

    python benchmarks/nearest_ab.py DIR --formats mxfp4,mxfp8_e4m3 --m 1,4,16,32,64,128,256,512,1024
    python benchmarks/nearest_ab.py DIR --report
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import rounds

from mxgemm import nearest, rules, tune, tunelog
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets

DECODE = tunelog.DECODE_RULE
VERSIONS = builder.versions(targets.cuda("sm_90"))


@functools.cache
def _log_without(n: int, k: int) -> Path:
    """The shipped sm_90 log without the records of ``[n, k]`` (a file that lives as long as the run)."""
    src = tunelog.shipped_log("sm_90")
    lines = [ln for ln in src.read_text().splitlines() if ln.strip()]
    keep = [ln for ln in lines if (json.loads(ln)["n"], json.loads(ln)["k"]) != (n, k)]
    path = Path(tempfile.mkdtemp()) / "sm_90.json"
    path.write_text("\n".join(keep) + "\n")
    return path


def variants(task: tune.Task) -> dict[str, tuple[str, dict] | None]:
    """``own``, ``borrowed`` and ``default``: (rule, hints dict) of each, None where it is decode +
    cuBLAS (or, for ``default``, where the untuned path is decode + cuBLAS)."""
    spec = task.spec()
    own = tunelog.lookup(task.key(), tune._build_versions(task.arch))  # noqa: SLF001
    lent = nearest.borrowed(task.key(), spec, VERSIONS, [_log_without(task.n, task.k)])
    routed = rules.rule_for(spec)
    untuned_decode = task.m_bucket is None or task.m_bucket >= 128 or routed is None
    default = None if untuned_decode else (routed.name, routed.default_hints(spec).to_dict())
    return {"own": _fused(own), "borrowed": _fused(lent), "default": default}


def _fused(rec: tunelog.Record | None) -> tuple[str, dict] | None:
    if rec is None or rec.rule == DECODE:
        return None
    return rec.rule, rules.get(rec.rule).typed(rec.config).to_dict()


def candidates(task: tune.Task) -> list[tuple[str, dict]]:
    """The task's distinct fused variants (decode + cuBLAS rides along where the bucket decides)."""
    seen: dict[str, tuple[str, dict]] = {}
    for v in variants(task).values():
        if v is not None:
            seen.setdefault(json.dumps(v, sort_keys=True), v)
    return list(seen.values())


def report(d: Path) -> None:
    """Per task: µs of its own record's kernel, the borrowed one and the untuned path, and the ratios."""
    meas = [json.loads(ln) for ln in (d / "tune_measurements.jsonl").read_text().splitlines() if ln.strip()]
    by_task: dict[tuple, dict[str, float]] = {}
    for r in meas:
        key = (r["fmt"], r["n"], r["k"], r["m_bucket"], r["a_dtype"])
        name = DECODE if r["rule"] == DECODE else json.dumps([r["rule"], r["config"]], sort_keys=True)
        by_task.setdefault(key, {})[name] = r["us"]
    gains, losses = [], []
    print("fmt dtype N K bucket | own borrowed untuned (us) | borrowed/own untuned/borrowed")
    for (fmt, n, k, b, dt), times in sorted(by_task.items(), key=str):
        task = tune.Task(fmt, n, k, b, dt, "sm_90")
        v = variants(task)
        us = {
            name: times.get(DECODE if x is None else json.dumps(list(x), sort_keys=True))
            for name, x in v.items()
        }
        if us["own"] is None or us["borrowed"] is None:
            continue
        untuned = us["default"] if v["default"] is not None else times.get(DECODE)
        if untuned is None:
            continue
        losses.append(us["borrowed"] / us["own"])
        gains.append(untuned / us["borrowed"])
        print(
            f"{fmt} {dt} {n} {k} {b} | {us['own']:.1f} {us['borrowed']:.1f} {untuned:.1f} | "
            f"{us['borrowed'] / us['own']:.2f} {untuned / us['borrowed']:.2f}"
        )
    geo = statistics.geometric_mean
    print(
        f"{len(gains)} tasks: borrowed/own time {geo(losses):.3f} geomean "
        f"({min(losses):.2f}-{max(losses):.2f}); "
        f"untuned/borrowed {geo(gains):.3f} geomean ({min(gains):.2f}-{max(gains):.2f})"
    )


if __name__ == "__main__":
    if "--report" in sys.argv:
        report(Path(sys.argv[1]))
    else:
        rounds.build(rounds.arguments(__doc__, "1,4,16,32,64,128,256,512,1024").parse_args(), candidates)
