"""Build an A/B round of one new option of a rule (``--rule``, ``wgmma_w`` by default) against the
log's records: per task whose record names the rule, the record's hints as they are and with
``--option NAME=VALUE`` (where the rule offers that), so ``mxgemm tune --measure DIR`` times the two in
one run and ``mxgemm tune --merge DIR --replace`` keeps the faster (decode + cuBLAS beside them where
the bucket decides between it and a fused kernel).

    python benchmarks/tune_option.py DIR --option pdl=2 [--rule mma --formats mxfp4 --dtypes float16
        --m 1,4,16 --shapes 4096,4096]
"""

from __future__ import annotations

import dataclasses

import rounds

from mxgemm import rules, tune


def pair(task: tune.Task, option: dict[str, int], rule=None) -> list[tuple[str, dict]]:
    """The log's record of ``rule`` (default ``wgmma_w``) for ``task`` and it with ``option``, where the
    rule offers both (else none: the record is another rule's, or the option does not go with it)."""
    rule = rule or rules.get("wgmma_w")
    recorded = tune._recorded(task, rule)  # noqa: SLF001
    if recorded is None:
        return []
    try:
        hints = [recorded, dataclasses.replace(recorded, **option)]
    except ValueError:
        return []
    offered = set(rule.candidates(task.spec()))
    if hints[0] == hints[1] or not all(h in offered for h in hints):
        return []
    return [(rule.name, h.to_dict()) for h in hints]


def main() -> None:
    ap = rounds.arguments(__doc__, "32,64,128,256", (*rounds.SHAPES, (1024, 4096)))
    ap.add_argument("--option", required=True, help="NAME=VALUE, a field of the rule's Hints")
    ap.add_argument("--rule", default="wgmma_w")
    a = ap.parse_args()
    name, value = a.option.split("=")
    rounds.build(a, lambda task: pair(task, {name: int(value)}, rules.get(a.rule)))


if __name__ == "__main__":
    main()
