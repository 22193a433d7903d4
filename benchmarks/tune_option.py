"""Build an A/B round of one new ``wgmma_w`` option against the log's records: per task whose record
names ``wgmma_w``, the record's hints as they are and with ``--option NAME=VALUE`` (where the rule offers
that), so ``mxgemm tune --measure DIR`` times the two in one run and ``mxgemm tune --merge DIR --replace``
keeps the faster (decode + cuBLAS beside them where the bucket decides between it and a fused kernel).

    python benchmarks/tune_option.py DIR --option pdl=1 [--formats mxfp4 --dtypes float16 --m 32,64
        --shapes 4096,4096]
"""

from __future__ import annotations

import dataclasses

import rounds

from mxgemm import tune
from mxgemm.rules import wgmma_w


def pair(task: tune.Task, option: dict[str, int]) -> list[tuple[str, dict]]:
    """The log's ``wgmma_w`` record for ``task`` and it with ``option``, where the rule offers both
    (else none: the record is another rule's, or the option does not go with it)."""
    recorded = tune._recorded(task, wgmma_w.RULE)  # noqa: SLF001
    if recorded is None:
        return []
    try:
        hints = [recorded, dataclasses.replace(recorded, **option)]
    except ValueError:
        return []
    offered = set(wgmma_w.RULE.candidates(task.spec()))
    if hints[0] == hints[1] or not all(h in offered for h in hints):
        return []
    return [("wgmma_w", h.to_dict()) for h in hints]


def main() -> None:
    ap = rounds.arguments(__doc__, "32,64,128,256", (*rounds.SHAPES, (1024, 4096)))
    ap.add_argument("--option", required=True, help="NAME=VALUE, a field of wgmma_w's Hints")
    a = ap.parse_args()
    name, value = a.option.split("=")
    rounds.build(a, lambda task: pair(task, {name: int(value)}))


if __name__ == "__main__":
    main()
