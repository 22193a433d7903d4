"""Tune records for layer shapes the logs lack: the record of the nearest tuned shape, its hints fitted
to the new one.

The shipped log holds the shapes it was tuned on (Llama-style 4096–28672); a model of other widths
(Qwen2.5-7B's 3584 and 18944, Llama-2-13B's 5120 and 13824) would otherwise run the ``mma`` rule's
defaults at 32–64 rows and decode + cuBLAS from 128 (where only a record lets a fused kernel run), at
0.44–0.82x cuBLAS's speed there (H200, mxfp4). What measured fastest on a shape like it serves it
better: the same rule, with the fewest of its hints changed to tile the new shape
(:meth:`mxgemm.rules.base.Rule.closest`).
``$MXGEMM_NEAREST=0`` (or ``$MXGEMM_TUNED=0``) turns it off; ``mxgemm tune`` still tunes such shapes,
the borrowed record among its seeds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from mxgemm import tunelog
from mxgemm.codegen.shapes import WIDE_M_BUCKETS

# the M buckets from which records are borrowed: where the log decides between fused kernels and decode
# + cuBLAS (32-1024 rows), the path without a record is slow (decode + cuBLAS at 0.43-0.6x cuBLAS to 256
# rows, the mma rule's defaults at 32-64: the neighbours' records took 0.54-0.74x its time, geomean of
# each bucket, H200); below it the router's own rule with its defaults (its sm_90 table) served as well
# as the neighbours' records of that rule (0.89-1.09x at 1-16 rows), so there only a record of another
# rule is borrowed (8-bit codes at one row: the mma kernels of a neighbour, 0.62-0.78x the time of the
# gemv rule's defaults; benchmarks/README.md)
FROM_BUCKET = 32
MOST_CHANGED = 2  # hint fields a borrowed record may change to fit the shape (more: another kernel)
# past 256 rows, where the path without a record (decode + cuBLAS) runs at 0.75-0.85x cuBLAS, a fused
# record is borrowed only where its rule's cost model (the grid's waves) rates its hints on the new
# shape at most this much above the record's own: the 256-row tiles of 4096² (128 blocks, one wave)
# make 160 on 5120² (two waves, 1.6x), and took 1.3-1.4x decode + cuBLAS's time there
GRID_SLACK = 1.25


def borrowed(
    key: tuple, spec: Any, versions: dict[str, str | None], paths: list[Path] | None = None
) -> tunelog.Record | None:
    """For a tune-log ``key`` without a record (:data:`mxgemm.tunelog.KEY_FIELDS`; ``spec``: its
    kernel's :class:`~mxgemm.codegen.build.KernelSpec`, ``versions`` its build versions): the record of
    the nearest layer shape of the same format, M bucket, dtype and block size
    (:func:`mxgemm.tunelog.neighbours`), its hints made a candidate of its rule for this shape with at
    most :data:`MOST_CHANGED` fields changed: the first neighbour whose hints fit as they are or with
    one field changed, else the nearest with the fewest changes; a decode + cuBLAS record fits any
    shape; past 256 rows only where the rule's cost on the new shape is within :data:`GRID_SLACK` of
    the record's on its own; below :data:`FROM_BUCKET` rows only a record of another rule than the one
    the router runs untuned. None where no neighbour's does. ``paths``: the logs to read (default:
    the shipped one and the user's)."""
    from mxgemm import rules

    few = spec.m_bucket is not None and spec.m_bucket < FROM_BUCKET
    wide = spec.m_bucket in WIDE_M_BUCKETS
    untuned = next((r.name for r in rules.route(spec)), None) if few else None
    found = []
    for rec in tunelog.neighbours(key, versions, paths):
        if rec.rule == tunelog.DECODE_RULE and not few:
            return rec
        rule = rules.get(rec.rule)
        if rule.Hints is None or (few and rec.rule == untuned):
            continue
        hints = rule.typed(rec.config)
        near = rule.closest(spec, hints)
        if near is None or near[1] > MOST_CHANGED:
            continue
        own = replace(spec, n=rec.n, k=rec.k)  # (the record's shape)
        if wide and rule.cost(spec, near[0]) > GRID_SLACK * rule.cost(own, hints):
            continue
        found.append((near[1], len(found), replace(rec, config=near[0].to_dict())))
        if near[1] <= 1:
            break
    return min(found, key=lambda f: f[:2])[2] if found else None
