"""Build a re-tune of the wide buckets (384 ... 1024 rows) with the ``wgmma_w`` options that came after
their last round (two splits added in a cluster, ``lean`` 2, ``early``): per task the log's record, and
256- and 128-row tiles unsplit and split in a cluster of 2 (where the rule offers it), the ring refilled
by a producer warpgroup (0.89-0.94x the time of every thread refilling it), and 128-row tiles on stream-K
(256-row ones took 1.3-1.9x the time there); decode + cuBLAS beside them. The tuner's own pick
(``mxgemm tune``) spends its budget on the default's twins, which differ in flags only; this round
wants the tiles and splits. ``--bk 64``: the same tiles in slots of 64 K instead (5 or 6 of 256 rows,
8 of 128; no stream-K), beside the record. ``--narrow``: the record and three tiles alone (256 rows in
5 slots of 64 K, unsplit and split in a cluster of 2; 128 rows in 4 of 128 K), ``cvt`` for fp16 rows
of 8-bit float codes: a round a third the size, for the 8-bit formats. Measure and merge with
``mxgemm tune --measure DIR`` / ``--merge DIR``.

    python benchmarks/tune_wide.py DIR [--formats mxfp4 --dtypes bfloat16 --m 384,512 --shapes 1024,4096]
    python benchmarks/tune_wide.py DIR --bk 64 --formats mxfp8_e4m3 --m 256,512,1024
    python benchmarks/tune_wide.py DIR --narrow --formats mxfp8_e4m3
    python benchmarks/tune_wide.py DIR --m 2048,4096        # the prefill buckets (1025-4096 rows)
"""

from __future__ import annotations

import dataclasses

import rounds

from mxgemm import formats, tune
from mxgemm.codegen import pairs
from mxgemm.codegen.wgmma_w import BK, Hints
from mxgemm.rules import wgmma_w

BASE = Hints(wg=2, stages=3, double=1, mt=256, splits=1, ring=1, tma=2, prod=2, lean=2, early=1)


def grid(bk: int = BK) -> list[Hints]:
    """The hint sets tried at every task (those the rule does not offer for it are dropped), each also
    with 8-bit float codes into fp16 by ``cvt``; in slots of ``bk`` K."""
    out = []
    tiles = ((256, 3), (128, 4)) if bk == BK else ((256, 5), (256, 6), (128, 8))
    for mt, stages in tiles:
        h = dataclasses.replace(BASE, mt=mt, stages=stages, bk=bk)
        out += [h, dataclasses.replace(h, splits=2, cluster=1)]
    out += [dataclasses.replace(BASE, mt=128, stages=4, prod=1, sk=1, early=0)] if bk == BK else []
    return [*out, *(dataclasses.replace(h, cvt=1) for h in out)]


def narrow(task: tune.Task) -> list[Hints]:
    """``--narrow``'s three tiles, with ``cvt`` for fp16 rows of 8-bit float codes."""
    cvt = task.a_dtype == "float16" and pairs.cvt_supported(formats.get(task.fmt), task.a_dtype)
    h = dataclasses.replace(BASE, stages=5, bk=BK // 2, cvt=int(cvt))
    return [h, dataclasses.replace(h, splits=2, cluster=1), dataclasses.replace(h, mt=128, stages=4, bk=BK)]


def candidates(task: tune.Task, bk: int = BK, small: bool = False) -> list[tuple[str, dict]]:
    """The log's ``wgmma_w`` record for ``task`` (if any; past 1024 rows also the 1024-row bucket's)
    and :func:`grid` (``small``: :func:`narrow`), as the rule offers them."""
    spec = task.spec()
    offered = set(wgmma_w.RULE.candidates(spec))
    own = [task, *([dataclasses.replace(task, m_bucket=1024)] if task.m_bucket > 1024 else [])]
    recorded = [h for t in own if (h := tune._recorded(t, wgmma_w.RULE))]  # noqa: SLF001
    tiles = narrow(task) if small else grid(bk)
    hints = [h for h in dict.fromkeys([*recorded, *tiles]) if h in offered]
    return [("wgmma_w", h.to_dict()) for h in hints]


def main() -> None:
    ap = rounds.arguments(__doc__, "384,512,640,768,896,1024")
    ap.add_argument("--bk", type=int, default=BK, choices=(BK, BK // 2), help="K of a ring slot")
    ap.add_argument("--narrow", action="store_true", help="the record and three tiles alone")
    a = ap.parse_args()
    rounds.build(a, lambda task: candidates(task, a.bk, a.narrow))


if __name__ == "__main__":
    main()
