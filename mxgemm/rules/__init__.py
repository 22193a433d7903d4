"""Schedule rules, one per module, each a :class:`~mxgemm.rules.base.Rule`; this is their registry
and router, which `mxgemm.ops.plan`, `mxgemm.build` and `mxgemm tune` all query.

:data:`RULES` names every rule and :func:`get` returns one. :func:`route` gives the rules that serve a
spec, in the order they are tried; :func:`rule_for` the tunable one among them (what `mxgemm tune`
tunes); :func:`rivals` the rules that serve it but that the router does not try untuned, which the
tuner measures beside it; :func:`schedule` makes the kernel, given a tune record's hints first
(typed by the rule the record names, never guessed from field names).
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

from mxgemm.rules.base import Make, Rule, Scheduled

log = logging.getLogger(__name__)


RULES = (
    "cpu_gemv", "cpu_dot", "cpu", "cpu_dequant", "mma", "wgmma_w", "gemv", "tensorcore", "dequant", "dlight"
)  # fmt: skip
# rules with hints (what a tune record may name)
TUNABLE = ("cpu_gemv", "cpu_dot", "cpu", "mma", "wgmma_w", "gemv", "tensorcore")
_CUDA_LINEAR = ("mma", "tensorcore", "gemv", "dlight")  # the router's order for a CUDA linear kernel


@functools.cache
def get(name: str) -> Rule:
    """The rule called ``name`` (one of :data:`RULES`; ``dlight.GEMV``-style names give dlight)."""
    base = name.split(".", maxsplit=1)[0] if isinstance(name, str) else name
    if base not in RULES:
        raise ValueError(f"no schedule rule {name!r}: rules are {', '.join(RULES)}")
    return importlib.import_module(f"mxgemm.rules.{base}").RULE


def name_of(hints: Any) -> str:
    """The name of the rule whose ``Hints`` class ``hints`` is an instance of."""
    for name in TUNABLE:
        if type(hints) is get(name).Hints:
            return name
    raise TypeError(f"{hints!r} is not a schedule rule's Hints (rules with hints: {', '.join(TUNABLE)})")


def route(spec: Any) -> list[Rule]:
    """The rules that make ``spec``'s kernel with their defaults, in the order they are tried: on CUDA
    ``mma`` (except for 8-bit codes at M=1, which ``gemv`` streams faster), ``tensorcore``, ``gemv``,
    then dlight; ``dequant`` then dlight for the standalone decode; ``cpu_gemv`` (buckets 1 and 4),
    ``cpu_dot`` (every M, one dynamic-M kernel; AVX-512), then ``cpu`` on an LLVM target,
    ``cpu_dequant`` for its standalone decode."""
    from mxgemm import formats
    from mxgemm.layout import plane_widths

    if spec.target["kind"] != "cuda":
        names: tuple[str, ...] = ("cpu_dequant",) if spec.op == "decode" else ("cpu_gemv", "cpu_dot", "cpu")
    elif spec.op == "decode":
        names = ("dequant", "dlight")
    else:
        names = _CUDA_LINEAR
        if plane_widths(formats.get(spec.fmt).bits)[0] == 8 and spec.m_bucket == 1:
            names = tuple(n for n in names if n != "mma")
    return [r for r in map(get, names) if r.routed and r.applies(spec)]


def tunable(spec: Any) -> list[Rule]:
    """The rules whose candidates the tuner measures for ``spec``: :func:`rule_for`'s (if any), then
    :func:`rivals` (a bucket that only a rival serves, e.g. ``wgmma_w``'s past 256 rows, has no routed
    one)."""
    routed = rule_for(spec)
    return [*([routed] if routed is not None else []), *rivals(spec)]


def rivals(spec: Any) -> list[Rule]:
    """The tunable rules that serve ``spec`` but that the router does not try untuned (``routed``
    False, e.g. ``wgmma_w``, or left out by its policy: ``mma`` for 8-bit codes at M=1), in
    :data:`TUNABLE` order: the tuner measures their candidates beside :func:`rule_for`'s, so a record
    names whichever measured fastest."""
    tried = route(spec)
    return [r for r in map(get, TUNABLE) if r not in tried and r.applies(spec)]


def rule_for(spec: Any) -> Rule | None:
    """The tunable rule that serves ``spec`` untuned (the first of :func:`route` with hints), or None
    (dlight or the decode: nothing to tune)."""
    return next((r for r in route(spec) if r.Hints is not None), None)


def schedule(
    spec: Any, make: Make, hints: dict[str, Any] | None = None, rule: str | None = None
) -> Scheduled:
    """The kernel of ``spec`` (a :class:`~mxgemm.codegen.build.KernelSpec`); ``make(decode_dtype)``
    gives its prim_func. ``hints`` of the rule named ``rule`` (a tune record's) go to that rule first,
    typed by its ``Hints``; hints that their rule refuses or that do not fit are logged and ignored,
    and the :func:`route` runs with its defaults. An LLVM kernel no rule takes is left unscheduled."""
    import tvm

    if hints:
        typed = _typed(rule, hints)
        got = get(rule).apply(spec, make, typed) if typed is not None else None
        if got is not None:
            return got
        if typed is not None:
            log.warning("ignoring tuned %s hints %s: they do not fit %s", rule, hints, spec)
    for r in route(spec):
        if (got := r.apply(spec, make, None)) is not None:
            return got
    if spec.target["kind"] != "cuda":
        return Scheduled("unscheduled", tvm.IRModule({"main": make("float32")}), None)
    raise RuntimeError(f"no GPU schedule rule applies to this kernel: {spec}")


def hints_problem(rule: str, config: Any) -> str | None:
    """Why ``config`` is not a hint set of ``rule`` (as a tune record names them), or None. A rule
    without hints takes the empty set (a record of it: that rule measured fastest, e.g. ``dequant``,
    decode + cuBLAS, where :func:`mxgemm.ops.plan` lets the log decide)."""
    if rule in RULES and rule not in TUNABLE and config == {}:
        return None
    if rule not in TUNABLE:
        return f"no rule {rule!r} with hints (tunable rules: {', '.join(TUNABLE)})"
    try:
        get(rule).typed(config)
    except (TypeError, ValueError) as e:
        return f"{rule} hints {config}: {e}"
    return None


def _typed(rule: str | None, hints: dict[str, Any]) -> Any:
    """``hints`` as rule ``rule``'s ``Hints``, or None (logged) when they are not."""
    if (why := hints_problem(rule, hints)) is not None:
        log.warning("ignoring tuned hints %s: %s", hints, why)
        return None
    return get(rule).typed(hints)
