"""The protocol every schedule rule implements (:class:`Rule`), and the per-arch default tables that
rules read (``schedules/<arch>.json``).

A rule is asked about a *spec*: any object with the fields of
:class:`~mxgemm.codegen.build.KernelSpec` that a kernel depends on (``fmt`` name, ``n``, ``k``,
``m_bucket``, ``a_dtype``, ``out_dtype``, ``bias``, ``block_size``, ``target`` dict, ``op``). Its knobs
are a frozen ``Hints`` dataclass (None for rules without knobs), given to it typed, never as a dict.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

log = logging.getLogger(__name__)

Make = Callable[[str | None], Any]  # make(decode_dtype) -> the spec's prim_func (decode dtype None: a_dtype)


def per_spec(method: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``method(rule, spec)`` remembered for the last 256 specs (by their fields, the target dict's
    too): routing asks each rule's defaults many times a spec, and a rule that picks them from its
    whole hint space (``wgmma_w``: ~30000 sets) takes about a second each time."""
    seen: dict[tuple[str, str], Any] = {}

    @functools.wraps(method)
    def remembered(rule: Any, spec: Any) -> Any:
        fields = dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else vars(spec)
        key = (type(rule).__name__, json.dumps(fields, sort_keys=True, default=str))
        if key not in seen:
            if len(seen) >= 256:
                seen.pop(next(iter(seen)))
            seen[key] = method(rule, spec)
        return seen[key]

    return remembered


class Scheduled(NamedTuple):
    """What a rule made of a spec: the rule's name (``dlight.GEMV`` for the dlight rule it picked),
    the scheduled IRModule and the hints used (None for rules without knobs)."""

    rule: str
    mod: Any
    hints: Any


class Rule:
    """A schedule rule: when it applies, its hint space and defaults, and the kernel it makes.

    Subclasses set :attr:`name`, :attr:`Hints` (a frozen dataclass with ``to_dict``), and override
    :meth:`applies` and :meth:`apply`; rules with knobs also :meth:`default_hints`,
    :meth:`candidates` and :meth:`cost`."""

    name: ClassVar[str] = ""
    Hints: ClassVar[type | None] = None
    # False: the router never picks the rule untuned; it runs where a tune record names it (a rule that
    # wins on some shapes only; the tuner measures it beside the routed rule, :func:`mxgemm.rules.rivals`)
    routed: ClassVar[bool] = True
    # the hint fields that make a kernel's structure (tiles, warps, splits) rather than an option of
    # it: the tuner spends part of a budget on structures its seeds lack (() : every field whose
    # candidates take values other than 0 and 1)
    structure: ClassVar[tuple[str, ...]] = ()
    # hint fields an earlier version had, retired because every value of them built the same kernel
    # as the field's absence: a log's record that names one types without it
    retired: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "default_hints" in cls.__dict__:  # a rule's defaults depend on the spec alone
            cls.default_hints = per_spec(cls.__dict__["default_hints"])

    def applies(self, spec: Any) -> bool:
        """Whether the rule makes a kernel for ``spec`` (its real block size, target and bucket) with
        its default hints (for a rule with knobs: whether it has defaults for ``spec``)."""
        if self.Hints is None:
            raise NotImplementedError
        return self.default_hints(spec) is not None

    def default_hints(self, spec: Any) -> Any:
        """The hints the rule uses untuned for ``spec`` (a ``Hints``), None when nothing fits."""
        return None

    def candidates(self, spec: Any) -> list[Any]:
        """The tuner's space for ``spec``: every valid ``Hints`` that fits its shape (deterministic)."""
        return []

    def cost(self, spec: Any, hints: Any) -> float:
        """Relative cost of ``hints`` for ``spec`` (lower is better), to rank candidates unmeasured."""
        del spec, hints
        return 1.0

    def closest(self, spec: Any, hints: Any) -> tuple[Any, int] | None:
        """The candidate of ``spec`` nearest ``hints`` (a ``Hints`` of this rule, e.g. a tune record's
        of another layer shape) and how many fields it changes: ``hints`` itself (0) where it is a
        candidate, else one that differs in the fewest fields, the cheapest of those by :meth:`cost`
        (a record tuned for K = 4096 whose K loop does not divide 3584, its unroll halved); None where
        the rule has no candidates. (The candidates are remembered for the last specs asked.)"""
        cands = _candidate_set(self, spec)
        if hints in cands:
            return hints, 0
        if not cands:
            return None
        names = [f.name for f in dataclasses.fields(hints)]
        changed = {h: sum(getattr(h, f) != getattr(hints, f) for f in names) for h in cands}
        fewest = min(changed.values())
        best = min(
            (h for h, d in changed.items() if d == fewest), key=lambda h: (self.cost(spec, h), repr(h))
        )
        return best, fewest

    def twins(self, spec: Any, hints: Any) -> list[Any]:
        """Candidates the tuner measures beside ``hints`` whatever their cost: the same kernel with a
        new option on, so a re-tune compares it with what it would replace (none by default)."""
        del spec, hints
        return []

    def apply(self, spec: Any, make: Make, hints: Any = None) -> Scheduled | None:
        """The kernel of ``spec`` with ``hints`` (None: the defaults); None when they do not fit.
        ``make(decode_dtype)`` gives the spec's prim_func (:mod:`mxgemm.codegen.prim_func`)."""
        raise NotImplementedError

    def typed(self, config: dict[str, Any]) -> Any:
        """``config`` (a tune record's hints) as this rule's ``Hints``; TypeError / ValueError when it
        is not a hint set of this rule."""
        if self.Hints is None:
            raise TypeError(f"rule {self.name!r} takes no hints")
        if not isinstance(config, dict):
            raise TypeError(f"{self.name} hints are a JSON object, got {type(config).__name__}")
        return self.Hints(**{k: v for k, v in config.items() if k not in self.retired})

    def __repr__(self) -> str:
        return f"<rule {self.name}>"


@per_spec
def _candidate_set(rule: Rule, spec: Any) -> frozenset:
    return frozenset(rule.candidates(spec))


# ---- per-arch default tables ------------------------------------------------------------------


def _schedules_dir() -> Path:
    """``schedules/`` in the repo; package data ``mxgemm/schedules/`` in the wheel."""
    from importlib.resources import files

    try:
        return Path(str(files("mxgemm.schedules")))
    except ModuleNotFoundError:  # a source tree on sys.path without installing
        return Path(__file__).resolve().parents[2] / "schedules"


@functools.cache
def table(arch: str) -> dict[str, Any]:
    """The default-hint table of ``arch`` (``schedules/<arch>.json``: per rule, rows of ``when`` and
    ``prefer``, measured on that arch), {} when there is none: the rules then pick by their cost
    model. A corrupt table is a clear error naming the file."""
    path = _schedules_dir() / f"{arch}.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        rows = [v for k, v in data.items() if k != "measured"] if isinstance(data, dict) else None
        if rows is None or not all(isinstance(v, list) for v in rows):
            raise ValueError("expected an object of rule name -> list of rows")
    except (OSError, ValueError) as e:
        raise RuntimeError(f"schedule table {path} is unusable: {e}") from e
    return data


def preferred(rule: str, arch: str, facts: dict[str, int]) -> dict[str, Any] | None:
    """The first row of ``rule`` in ``arch``'s table whose ``when`` holds for ``facts`` (each
    condition ``<fact>_max``: fact ≤ value, ``<fact>_below``: fact < value), or None."""
    for row in table(arch).get(rule, []):
        conds = row.get("when", {})
        if all(_holds(facts, cond, v) for cond, v in conds.items()):
            return row
    return None


def _holds(facts: dict[str, int], cond: str, value: int) -> bool:
    fact, _, op = cond.rpartition("_")
    if fact not in facts or op not in ("max", "below"):
        raise RuntimeError(f"schedule table condition {cond!r}: facts are {sorted(facts)} with _max/_below")
    return facts[fact] <= value if op == "max" else facts[fact] < value


def cuda_linear(
    spec: Any, m_tiles: tuple[int, ...], a_dtypes: tuple[str, ...] = ("float16", "bfloat16")
) -> bool:
    """Whether ``spec`` is a decode-fused CUDA linear kernel of a bucket in ``m_tiles`` and an
    activation dtype in ``a_dtypes``."""
    return (
        spec.target["kind"] == "cuda"
        and spec.op == "linear"
        and spec.m_bucket in m_tiles
        and spec.a_dtype in a_dtypes
    )


def replaced(hints: Any, **changes: int) -> Any:
    """``hints`` (a rule's frozen ``Hints``) with ``changes``, or None where they make no valid hint set
    (its ``__post_init__`` raises ValueError): how a rule derives twins of a record."""
    try:
        return dataclasses.replace(hints, **changes)
    except ValueError:
        return None


def cheapest(rule: Rule, spec: Any) -> Any:
    """The candidate of ``rule`` with the lowest cost for ``spec``, None when nothing fits."""
    cands = rule.candidates(spec)
    return min(cands, key=lambda h: rule.cost(spec, h)) if cands else None
