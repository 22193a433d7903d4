"""Tune records for layer shapes the logs lack: the record of the nearest tuned shape, its hints fitted
to the new one.

The shipped log holds the shapes it was tuned on (Llama-style 4096–28672); a model of other widths
(Qwen2.5-7B's 3584 and 18944, Llama-2-13B's 5120 and 13824) would otherwise run the rules' defaults up
to 64 rows and decode + cuBLAS from 128 (where only a record lets a fused kernel run), at about half
cuBLAS's speed there. What measured fastest on a shape like it serves it better: the same rule, with
the fewest of its hints changed to tile the new shape (:meth:`mxgemm.rules.base.Rule.closest`).
``$MXGEMM_NEAREST=0`` (or ``$MXGEMM_TUNED=0``) turns it off; ``mxgemm tune`` still tunes such shapes
from scratch, seeded by their neighbours' records.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from mxgemm import tunelog

MOST_CHANGED = 2  # hint fields a borrowed record may change to fit the shape (more: another kernel)


def borrowed(
    key: tuple, spec: Any, versions: dict[str, str | None], paths: list[Path] | None = None
) -> tunelog.Record | None:
    """For a tune-log ``key`` without a record (:data:`mxgemm.tunelog.KEY_FIELDS`; ``spec``: its
    kernel's :class:`~mxgemm.codegen.build.KernelSpec`, ``versions`` its build versions): the record of
    the nearest layer shape of the same format, M bucket, dtype and block size
    (:func:`mxgemm.tunelog.neighbours`), its hints made a candidate of its rule for this shape with at
    most :data:`MOST_CHANGED` fields changed: the first neighbour whose hints fit as they are or with
    one field changed, else the nearest with the fewest changes; a decode + cuBLAS record fits any
    shape. None where no neighbour's does. ``paths``: the logs to read (default: the shipped one and
    the user's)."""
    from mxgemm import rules

    found = []
    for rec in tunelog.neighbours(key, versions, paths):
        if rec.rule == tunelog.DECODE_RULE:
            return rec
        rule = rules.get(rec.rule)
        near = rule.closest(spec, rule.typed(rec.config)) if rule.Hints is not None else None
        if near is not None and near[1] <= MOST_CHANGED:
            found.append((near[1], len(found), replace(rec, config=near[0].to_dict())))
            if near[1] <= 1:
                break
    return min(found, key=lambda f: f[:2])[2] if found else None
