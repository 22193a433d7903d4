"""Build an A/B round of one new option of a rule (``--rule``, ``wgmma_w`` by default) against the
log's records: per task whose record names the rule, the record's hints as they are and with
``--option NAME=VALUE`` (where the rule offers that), so ``mxgemm tune --measure DIR`` times the two in
one run and ``mxgemm tune --merge DIR --replace`` keeps the faster (decode + cuBLAS beside them where
the bucket decides between it and a fused kernel; ``--option lean=2,early=1``: several at once). With
``--twin NAME`` instead, the record against the rule's twins of it (``Rule.twins``) that differ in that
field (an option whose value depends on the hints, as ``mma``'s ``minb``). With ``--like FMT[,FMT...]``, the
kernel each task runs now against each ``FMT``'s record for the same key (formats whose codes are laid
out alike, as the 8-bit ones: a tile tuned for one fits the other; or, for a format new to a rule, as
mxfp6 between mxfp4 and mxfp8, the records of its neighbours, a ``wgmma_w`` record whose slots do not
fit its codes in slots of 64 K; ``--cheapest``: and the ``wgmma_w`` rule's cheapest hints). With
``--near``, the record against every candidate of its rule one field away from it (a local search
after a change to the kernels themselves, as a faster decode, that may move the best hints a step).
With ``--adjacent``, the record
against the records of the M buckets just below and above it and of larger buckets that measured
faster (a tile tuned for 64 rows, two tiles at 128; hints the tuner's sample may have missed); with
``--above``, against the faster records of larger buckets alone (a kernel that serves more rows in
less time); with ``--other-dtype``, a record against the other activation dtype's record's fused hints
for the same key.
With ``--resplit``, a ``wgmma_w`` record against
itself with K split 1, 2 (also in a cluster), 4 or 8 ways, stream-K off (the tuner samples a few
hundred of the rule's ~30000 candidates a task); an ``mma`` record against itself with K split over a
cluster of 2 or 4 blocks.

    python benchmarks/tune_option.py DIR --option pdl=2 [--rule mma --formats mxfp4 --dtypes float16
        --m 1,4,16 --shapes 4096,4096]
    python benchmarks/tune_option.py DIR --twin minb --rule mma --m 1,4,16
    python benchmarks/tune_option.py DIR --like mxfp8_e4m3 --formats mxfp8_e5m2,mxint8 --m 1,16,128
    python benchmarks/tune_option.py DIR --like mxfp4,mxfp8_e4m3 --cheapest --formats mxfp6_e2m3,mxfp6_e3m2 \
        --m 32,64,128,256,384,512,640,768,896,1024
    python benchmarks/tune_option.py DIR --near --dtypes float16 --m 32,64,128
    python benchmarks/tune_option.py DIR --adjacent --m 32,64,128,256
    python benchmarks/tune_option.py DIR --above --m 32,64,128,256,384,512,640,768,896
    python benchmarks/tune_option.py DIR --resplit --m 128,256
    python benchmarks/tune_option.py DIR --resplit --m 1,4,16
    python benchmarks/tune_option.py DIR --other-dtype --formats mxfp4,mxfp8_e4m3,mxfp6_e2m3 \
        --m 1,4,16,32,64,128,256,512,1024
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import rounds

from mxgemm import bench, rules, tune
from mxgemm.codegen.wgmma_w import BK
from mxgemm.rules.base import replaced


def pair(task: tune.Task, option: dict[str, int], rule=None) -> list[tuple[str, dict]]:
    """The log's record of ``rule`` (default ``wgmma_w``) for ``task`` and it with ``option``, where the
    rule offers both (else none: the record is another rule's, or the option does not go with it)."""
    rule = rule or rules.get("wgmma_w")
    recorded = tune._recorded(task, rule)  # noqa: SLF001
    if recorded is None:
        return []
    hints = [recorded, replaced(recorded, **option)]
    offered = set(rule.candidates(task.spec()))
    if hints[1] is None or hints[0] == hints[1] or not all(h in offered for h in hints):
        return []
    return [(rule.name, h.to_dict()) for h in hints]


def twins(task: tune.Task, field: str, rule) -> list[tuple[str, dict]]:
    """The log's record of ``rule`` for ``task`` and the rule's twins of it whose ``field`` differs
    (none where the record is another rule's or has no such twin)."""
    recorded = tune._recorded(task, rule)  # noqa: SLF001
    if recorded is None:
        return []
    other = [t for t in rule.twins(task.spec(), recorded) if getattr(t, field) != getattr(recorded, field)]
    return [(rule.name, h.to_dict()) for h in [recorded, *other]] if other else []


FUSED = ("mma", "wgmma_w")  # the rules whose records these rounds time against other hints


def fused_records(task: tune.Task) -> list[tuple[str, object]]:
    """(rule name, hints) of the log's fused records for ``task`` (none where it runs decode + cuBLAS)."""
    return [(name, h) for name in FUSED if (h := tune._recorded(task, rules.get(name))) is not None]  # noqa: SLF001


@functools.cache
def like(task: tune.Task, fmts: tuple[str, ...]) -> list[tuple[str, dict]]:
    """The kernel ``task`` runs now (its record, or the fp16 record a bf16 key borrows) and each of
    ``fmts``'s fused record's hints for the same key (``cvt`` off where the task's format takes none; a
    ``wgmma_w`` record whose slots do not fit the task's codes: in as many slots of 64 K as fit),
    where a fused rule offers them and one differs (none else)."""
    fused = [rules.get(name) for name in FUSED]
    mine = fused_records(task)
    out = list(mine)
    for fmt, rule in itertools.product(fmts, fused):
        theirs = tune._recorded(dataclasses.replace(task, fmt=fmt), rule)  # noqa: SLF001
        if theirs is None:
            continue
        offered = set(rule.candidates(task.spec()))
        theirs = theirs if theirs in offered or not theirs.cvt else replaced(theirs, cvt=0)
        if theirs not in offered and rule.name == "wgmma_w":
            halves = (replaced(theirs, bk=BK // 2, stages=s) for s in (8, 6, 5, 4))
            theirs = next((h for h in halves if h in offered), theirs)
        if theirs in offered and (rule.name, theirs) not in out:
            out.append((rule.name, theirs))
    return [(name, h.to_dict()) for name, h in out] if len(out) > len(mine) else []


def near(task: tune.Task) -> list[tuple[str, dict]]:
    """The log's record of a fused rule for ``task`` and the rule's candidates that differ from it in
    one field (none where the record is decode + cuBLAS or there is none)."""
    for rule in (rules.get("mma"), rules.get("wgmma_w")):
        recorded = tune._recorded(task, rule)  # noqa: SLF001
        if recorded is None:
            continue
        fields = [f.name for f in dataclasses.fields(recorded)]
        steps = [
            h for h in rule.candidates(task.spec())
            if sum(getattr(h, f) != getattr(recorded, f) for f in fields) == 1
        ]  # fmt: skip
        return [(rule.name, h.to_dict()) for h in [recorded, *steps]]
    return []


def _with_records(task: tune.Task, records) -> list[tuple[str, dict]]:
    """The kernel ``task`` runs now (its fused record; decode + cuBLAS rides along where the bucket
    decides between them) and the hints ``records(task, rule)`` gives for each fused rule, where the
    rule offers them for ``task`` (none where none is new)."""
    mine = fused_records(task)
    out = list(mine)
    for rule in (rules.get(name) for name in FUSED):
        theirs = [h for h in records(task, rule) if (rule.name, h) not in out]
        offered = set(rule.candidates(task.spec())) if theirs else set()
        out += [(rule.name, h) for h in dict.fromkeys(theirs) if h in offered]
    return [(name, h.to_dict()) for name, h in out] if len(out) > len(mine) else []


@functools.cache
def adjacent(task: tune.Task) -> list[tuple[str, dict]]:
    """The kernel ``task`` runs now and the fused records of the M buckets beside its own and of the
    larger buckets that measured faster (the tuner's seeds, ``tune._beside``)."""
    return _with_records(task, tune._beside)  # noqa: SLF001


@functools.cache
def above(task: tune.Task) -> list[tuple[str, dict]]:
    """The kernel ``task`` runs now and the fused records of the larger M buckets that measured
    faster than its record (:func:`mxgemm.tune.faster_above`)."""
    return _with_records(task, lambda t, rule: tune.at_buckets(t, rule, tune.faster_above(t)))


@functools.cache
def other_dtype(task: tune.Task) -> list[tuple[str, dict]]:
    """A task's kernel now and the fused hints of the other activation dtype's record for the same
    shape and bucket (bf16 layers should run within a few percent of fp16 ones; a record tuned for one
    dtype can trail the other's hints, which the tuner seeds bf16 tasks with but later rounds did not
    time again, and fp16 tasks not at all)."""
    other = dataclasses.replace(task, a_dtype=bench.other_dtype(task.a_dtype))

    def theirs(t: tune.Task, rule) -> list:
        h = tune._recorded(other, rule)  # noqa: SLF001  (typed by the rule already)
        return [] if h is None else [h]

    return _with_records(task, theirs)


def resplit(task: tune.Task) -> list[tuple[str, dict]]:
    """The log's ``wgmma_w`` record for ``task`` and it with K split otherwise: every split count the
    rule offers at the record's M tile (2: also in a cluster), stream-K off, warp 0 or a producer
    warpgroup refilling the ring; an ``mma`` record: it with K split over a cluster of 2 or 4 blocks
    (``ks``), each with the record's K warps or a ``1/ks`` of them (none where the record is another
    rule's or nothing differs)."""
    mma = rules.get("mma")
    if (recorded := tune._recorded(task, mma)) is not None:  # noqa: SLF001
        offered, out = set(mma.candidates(task.spec())), [recorded]
        for ks in (2, 4):
            for kw in dict.fromkeys((recorded.kw, max(1, recorded.kw // ks))):
                h = replaced(recorded, ks=ks, kw=kw, minb=0)
                out += [h] if h in offered and h not in out else []
        return [(mma.name, h.to_dict()) for h in out] if len(out) > 1 else []
    rule = rules.get("wgmma_w")
    recorded = tune._recorded(task, rule)  # noqa: SLF001
    if recorded is None:
        return []
    offered, out = set(rule.candidates(task.spec())), [recorded]
    for splits in (1, 2, 4, 8):
        for cluster in (0, 1) if splits == 2 else (0,):
            for prod in (1, 2):
                h = replaced(recorded, sk=0, splits=splits, cluster=cluster, prod=prod)
                out += [h] if h in offered and h not in out else []
    return [(rule.name, h.to_dict()) for h in out] if len(out) > 1 else []


def cheapest(task: tune.Task, pairs: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """``pairs`` (a task's candidates) and the ``wgmma_w`` rule's cheapest hints for ``task`` (its
    default), where the rule serves it; none where that adds nothing to the kernel it runs now."""
    rule = rules.get("wgmma_w")
    mine = fused_records(task)
    out = pairs or [(name, h.to_dict()) for name, h in mine]
    best = rule.default_hints(task.spec()) if rule.applies(task.spec()) else None
    if best is not None and (rule.name, best.to_dict()) not in out:
        out = [*out, (rule.name, best.to_dict())]
    return out if len(out) > len(mine) else []


def main() -> None:
    ap = rounds.arguments(__doc__, "32,64,128,256", (*rounds.SHAPES, (1024, 4096)))
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--option", help="NAME=VALUE[,NAME=VALUE...], fields of the rule's Hints")
    how.add_argument("--twin", help="NAME, a field of the rule's Hints its twins set")
    how.add_argument("--like", help="FORMAT[,FORMAT...], whose records' hints to time against each task's")
    how.add_argument("--near", action="store_true", help="the record and its rule's candidates a field away")
    how.add_argument(
        "--adjacent", action="store_true", help="the record and the records of the buckets beside"
    )
    how.add_argument(
        "--above", action="store_true", help="the record and the faster records of larger buckets"
    )
    how.add_argument("--resplit", action="store_true", help="the record and it with K split otherwise")
    how.add_argument(
        "--other-dtype", action="store_true", help="a record and the other dtype's record's hints"
    )
    ap.add_argument("--cheapest", action="store_true", help="with --like: and the wgmma_w rule's default")
    ap.add_argument("--rule", default="wgmma_w")
    a = ap.parse_args()
    rule = rules.get(a.rule)
    if a.like:
        fmts = tuple(a.like.split(","))
        rounds.build(a, lambda task: cheapest(task, like(task, fmts)) if a.cheapest else like(task, fmts))
        return
    if a.near:
        rounds.build(a, near)
        return
    if a.adjacent:
        rounds.build(a, adjacent)
        return
    if a.above:
        rounds.build(a, above)
        return
    if a.resplit:
        rounds.build(a, resplit)
        return
    if a.other_dtype:
        rounds.build(a, other_dtype)
        return
    if a.twin:
        rounds.build(a, lambda task: twins(task, a.twin, rule))
        return
    option = {name: int(value) for name, value in (kv.split("=") for kv in a.option.split(","))}
    rounds.build(a, lambda task: pair(task, option, rule))


if __name__ == "__main__":
    main()
