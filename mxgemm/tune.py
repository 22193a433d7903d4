"""`mxgemm tune`: offline autotuning of the schedule rules' hints; the winners go to a tune log.

Three steps, which one box runs back to back or two boxes split:

1. build (any machine with nvcc): per task — (format, N, K, M bucket, activation dtype, arch) — the
   rule's candidate hints, ranked by a simple cost model, top ``budget`` plus the defaults, are built
   into a kernel directory with a manifest (``tune_manifest.json``);
2. measure (the GPU box, TVM runtime only; or this CPU for LLVM targets): every candidate is timed the
   way ``mxgemm bench`` times (CUDA graphs over rotating weight copies; CPU: median wall time), results
   to ``tune_measurements.jsonl``;
3. merge: the fastest candidate per task goes into the tune log (`mxgemm.tunelog`).

Tasks the log already has (same versions) are skipped, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from mxgemm import formats, ops, tunelog
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets

log = logging.getLogger(__name__)
MANIFEST = "tune_manifest.json"
MEASUREMENTS = "tune_measurements.jsonl"
DECODE_RULE = ops.DECODE_RULE  # candidates of this rule: decode + cuBLAS (DecodeThenGemm)
CPU_CALLS = 40  # timed calls per CPU candidate (cycling the weight copies)


class TuneError(ValueError):
    """Bad tuning input (model dir, shapes, budget, kernel directory)."""


@dataclass(frozen=True)
class Task(tunelog.Key):
    """One tune log key to tune."""

    def target(self) -> dict[str, Any]:
        return _target(self.arch)

    def spec(self) -> builder.KernelSpec:
        """The kernel spec the rules are asked about (no bias, output in the activation dtype)."""
        dt = self.a_dtype
        return builder.KernelSpec(
            self.fmt, self.n, self.k, self.m_bucket, dt, dt, False, self.block_size, self.target()
        )


def _target(arch: str) -> dict[str, Any]:
    """The target dict of a tune-log arch: ``llvm-<cpu>`` (this CPU) or ``sm_XX``."""
    return targets.cpu() if arch.startswith("llvm") else targets.cuda(arch)


def model_shapes(model_dir: str | Path) -> list[tuple[int, int]]:
    """(N, K) of a decoder's projections from its ``config.json``: q, k, v, o, gate, up, down
    (lm_head excluded), deduplicated in that order."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
        h, inter, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    except (OSError, ValueError, KeyError) as e:
        raise TuneError(f"{path}: needs hidden_size, intermediate_size, num_attention_heads ({e})") from e
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or h // heads
    shapes = [(heads * hd, h), (kv * hd, h), (h, heads * hd), (inter, h), (h, inter)]
    return list(dict.fromkeys(shapes))


def tasks(shapes, fmts, ms, a_dtype: str, arch: str) -> tuple[list[Task], list[str]]:
    """(tasks with tunable hints, notes on what was left out and why)."""
    from mxgemm import rules
    from mxgemm.ops import plan

    cuda = not arch.startswith("llvm")
    out, notes = [], []
    for fmt in fmts:
        f = formats.get(fmt)
        for n, k in shapes:
            if k % f.block_size:
                raise TuneError(f"shape {n},{k}: k is not a multiple of {fmt}'s block size {f.block_size}")
            for m in ms:
                op, bucket = plan(m, arch if cuda else "llvm", fmt, n, k, a_dtype, f.block_size)
                decided = builder.m_bucket_for(m, "cuda") if cuda else None
                if op == "linear" and decided in ops.BORROWS:  # (its own bucket, not the one it borrows)
                    bucket = decided
                if op == "decode" and decided in ops.DECIDED_BUCKETS:
                    # decode + cuBLAS for want of a record: the fused rule against it, as a candidate
                    fused = Task(fmt, n, k, decided, a_dtype, arch)
                    if rules.tunable(fused.spec()):
                        op, bucket = "linear", decided
                task = Task(fmt, n, k, bucket, a_dtype, arch)
                if op == "decode" or not rules.tunable(task.spec()):
                    path = (
                        ("decode + cuBLAS" if cuda else "decode + torch's GEMM")
                        if op == "decode"
                        else "dlight"
                    )
                    notes.append(f"{n},{k} M={m}: {path}, no hints to tune: skipped")
                    continue
                out.append(task)
    return list(dict.fromkeys(out)), list(dict.fromkeys(notes))


def candidates(task: Task, budget: int) -> list[tuple[str, dict[str, Any]]]:
    """(rule, hints) to measure: the routed rule's defaults first, the hints of the logs' record for
    the task (a re-tune is measured against what it would replace, in the same run), for bf16 of the
    fp16 record, for a key the logs lack of the record it borrows (:func:`_lent`), and of the records
    of the M buckets beside the task's and of larger buckets that measured faster, and for the same
    bucket on other N of the same K, where the rule offers them (:func:`_beside`, :func:`_same_k`: a
    tile tuned for 1 row can be the best at 4, a 384-row kernel faster at 256 rows than the 256-row
    record, 14336×4096's tiles 1.1–1.44x on 11008×4096); then, in turns, a twin of those
    (:meth:`~mxgemm.rules.base.Rule.twins`: the same kernel with a new option on; the records' before
    the defaults') and the cheapest hints of a structure not taken yet
    (:attr:`~mxgemm.rules.base.Rule.structure`: tiles, warps, splits; cheapest by the rule's cost
    model), so a small budget tries new kernels as well as new options; then the rest, cheapest
    first; ``budget`` in all. Then as many of each rule that serves the task but that the router does
    not try untuned (:func:`mxgemm.rules.rivals`), chosen alike (deterministic)."""
    from mxgemm import rules

    spec = task.spec()
    lent = _lent(task)
    out = []
    for rule in rules.tunable(spec):
        default = rule.default_hints(spec)
        borrowed = rule.typed(lent.config) if lent is not None and lent.rule == rule.name else None
        tuned = [h for h in (_recorded(task, rule), _fp16_twin(task, rule), borrowed) if h is not None]
        offered = rule.candidates(spec)
        valid = set(offered)
        beside = [h for h in (*_beside(task, rule), *_same_k(task, rule)) if h in valid]
        seeds = list(dict.fromkeys(h for h in (default, *tuned, *beside) if h is not None))
        twins = [t for h in (*tuned, default) if h is not None for t in rule.twins(spec, h)]
        twins = [t for t in dict.fromkeys(twins) if t not in seeds]
        rest = sorted((h for h in offered if h not in seeds), key=lambda h: rule.cost(spec, h))
        out += [(rule.name, h.to_dict()) for h in _spread(rule, seeds, twins, rest, max(1, budget))]
    return out


def _spread(rule, seeds: list, twins: list, ranked: list, budget: int) -> list:
    """``seeds``, then a twin and a new structure in turns (the first of ``ranked``, cheapest first,
    whose :attr:`~mxgemm.rules.base.Rule.structure` fields no taken hints share), then the rest of
    ``ranked`` in order; ``budget`` in all, no hints twice. A rule without ``structure`` fields: its
    hints that take values other than 0 and 1 (on/off flags are options, not structure)."""
    fields = rule.structure or (
        [f for f in ranked[0].to_dict() if any(h.to_dict()[f] not in (0, 1) for h in ranked)]
        if ranked
        else []
    )

    def shape(h) -> tuple:
        return tuple(h.to_dict()[f] for f in fields)

    taken = seeds[:budget]
    twins, keyed = iter(twins), [(shape(h), h) for h in ranked]  # (each shape made once)
    while len(taken) < budget:
        twin = next((t for t in twins if t not in taken), None)
        if twin is not None:
            taken.append(twin)
        seen = {shape(h) for h in taken}
        fresh = next((h for s, h in keyed if s not in seen), None)
        if fresh is not None and len(taken) < budget:
            taken.append(fresh)
        if twin is None and fresh is None:
            break
    taken += [h for h in ranked if h not in taken][: budget - len(taken)]
    return taken


def _beside(task: Task, rule) -> list:
    """The hints of ``rule``'s records for the M buckets just below and above the task's, then for
    every larger bucket whose record measured faster than the task's (:func:`faster_above`), not
    checked against the task's candidates."""
    buckets = [b for b in builder.M_BUCKETS if b is not None]
    if task.m_bucket not in buckets:
        return []
    at = buckets.index(task.m_bucket)
    near = [buckets[i] for i in (at - 1, at + 1) if 0 <= i < len(buckets)]
    near += [b for b in faster_above(task) if b not in near]
    return at_buckets(task, rule, near)


def at_buckets(task: Task, rule, buckets) -> list:
    """The hints of ``rule``'s records for ``task``'s key at each M bucket of ``buckets`` that has
    one (:func:`_recorded`), once each."""
    hints = (_recorded(replace(task, m_bucket=b), rule) for b in buckets)
    return list(dict.fromkeys(h for h in hints if h is not None))


def faster_above(task: Task) -> list[int]:
    """The M buckets above the task's whose record (any rule) measured faster than the task's record:
    their kernels serve the task's rows too (part-filled tiles), so the task's record missed them."""
    mine = tunelog.lookup(task.key(), _build_versions(task.arch))
    if mine is None or task.m_bucket is None:
        return []
    above = [b for b in builder.M_BUCKETS if b is not None and b > task.m_bucket]
    recs = {b: tunelog.lookup(replace(task, m_bucket=b).key(), _build_versions(task.arch)) for b in above}
    return [b for b, r in recs.items() if r is not None and r.us < mine.us]


def _same_k(task: Task, rule, most: int = 3) -> list:
    """The hints of ``rule``'s records (:func:`_recorded`) for the task's format, dtype, block size and
    bucket on other N of the same K, nearest N first (at most ``most``): a tile tuned for 14336×4096
    often fits 11008×4096 (not checked against the task's candidates)."""
    mine = (task.fmt, task.k, task.m_bucket, task.a_dtype, task.arch, task.block_size)
    logs = (tunelog.shipped_log(task.arch), tunelog.user_log(task.arch))
    ns = {
        r.n
        for path in logs
        for r in tunelog.read(path)
        if (r.fmt, r.k, r.m_bucket, r.a_dtype, r.arch, r.block_size) == mine
    }
    ns = sorted(ns - {task.n}, key=lambda n: (abs(math.log(n / task.n)), n))
    hints = (_recorded(replace(task, n=n), rule) for n in ns)
    return list(dict.fromkeys(h for h in hints if h is not None))[:most]


def _lent(task: Task) -> tunelog.Record | None:
    """For a task whose key the logs lack, the record it runs now: its nearest tuned shape's, fitted
    to it (:func:`mxgemm.nearest.borrowed`; tuning must not lose its hints), else None."""
    from mxgemm import nearest

    versions = _build_versions(task.arch)
    if tunelog.lookup(task.key(), versions) is not None:
        return None
    return nearest.borrowed(task.key(), task.spec(), versions)


def _fp16_twin(task: Task, rule) -> Any:
    """For a bf16 task, the hints of the fp16 record for the same shape and rule, which bf16 layers use
    while the log has no bf16 record (:func:`mxgemm.tunelog.lookup`): tuning bf16 must not lose them."""
    if task.a_dtype != "bfloat16":
        return None
    fp16 = _recorded(replace(task, a_dtype="float16"), rule)
    return None if fp16 is None else rule.typed(fp16.to_dict())


def _recorded(task: Task, rule) -> Any:
    """The hints of the logs' current record for ``task`` if it is ``rule``'s, else None."""
    rec = tunelog.lookup(task.key(), _build_versions(task.arch))
    if rec is None or rec.rule != rule.name:
        return None
    try:
        return rule.typed(rec.config)
    except (TypeError, ValueError):
        return None


def rule_of(task: Task) -> str:
    """The name of the rule whose hints :func:`candidates` gives first for ``task`` (the router's, or
    where none serves the bucket untuned, the first rival's)."""
    from mxgemm import rules

    served = rules.tunable(task.spec())
    if not served:
        raise TuneError(f"{task}: no rule with hints serves it")
    return served[0].name


# ---- step 1: build ---------------------------------------------------------------------------------


def _decode_competes(task: Task) -> bool:
    """Whether decode + cuBLAS is a candidate of ``task`` (a CUDA bucket where the log decides between
    it and the fused kernels: :data:`mxgemm.ops.DECIDED_BUCKETS`)."""
    return not task.arch.startswith("llvm") and task.m_bucket in ops.DECIDED_BUCKETS


def _build_one(item: tuple[Task, str | None, dict[str, Any] | None]) -> dict[str, Any] | None:
    """Build one candidate (``rule``'s ``hints``; None, None: the decode kernel of decode + cuBLAS)
    into the cache."""
    task, rule, hints = item
    t0 = time.perf_counter()
    try:
        if hints is None:  # W decoded in chunks of rows by the kernel of op "decode", then cuBLAS
            rows = ops.decode_chunk_rows(task.n, task.k)
            kern = builder.build(
                task.fmt, n=rows, k=task.k, a_dtype=task.a_dtype, target=task.target(),
                block_size=task.block_size, op="decode",
            )  # fmt: skip
            return _entry(task, {}, kern, t0)
        kern = builder.build(
            task.fmt, n=task.n, k=task.k, m_bucket=task.m_bucket, a_dtype=task.a_dtype, target=task.target(),
            block_size=task.block_size, hints=hints, rule=rule,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 (a candidate the compiler rejects is skipped, not fatal)
        log.warning("candidate %s for %s does not build: %s", hints, task, str(e).strip().splitlines()[-1])
        return None
    if kern.rule != rule or kern.info.get("hints") != hints:  # the defaults instead: not this candidate
        return None
    return _entry(task, hints, kern, t0)


def _entry(task: Task, hints: dict[str, Any], kern: builder.Kernel, t0: float) -> dict[str, Any]:
    return {
        "task": asdict(task),
        "hints": hints,
        "rule": kern.rule,
        "path": str(kern.path),
        "versions": tunelog.rule_versions(kern.rule, builder.versions(kern.spec.target)),
        "build_s": time.perf_counter() - t0,
    }


def build(todo: list[Task], budget: int, out_dir: Path, jobs: int = 2, progress=None) -> list[dict[str, Any]]:
    """Build every candidate of ``todo`` into the kernel cache; write the manifest to ``out_dir``."""
    from concurrent.futures import ProcessPoolExecutor

    items = [
        (t, r, h) for t in todo for r, h in (*candidates(t, budget), *[(None, None)] * _decode_competes(t))
    ]
    entries = []
    with ProcessPoolExecutor(jobs) as pool:
        for e in pool.map(_build_one, items):
            if e is not None:
                entries.append(e)
            if progress:
                progress(e)
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    for e in entries:  # paths relative to the kernel directory, so the directory can travel
        p = Path(e["path"]).resolve()
        e["path"] = str(p.relative_to(root.resolve())) if p.is_relative_to(root.resolve()) else str(p)
    (root / MANIFEST).write_text(json.dumps(entries, indent=1))
    return entries


# ---- step 2: measure -------------------------------------------------------------------------------


def _inputs(task: Task, device: torch.device, copies: int, kernel: builder.Kernel | None = None):
    """Activations ``[M bucket (64 if unbounded), k]``, ``copies`` copies of a random weight's code
    planes + scales (quantized on ``device``) in the layout ``kernel`` reads (None: the GPU kernels'),
    an output buffer, and the weight's bytes."""
    from mxgemm.layout import transform_weight
    from mxgemm.reference import quantize

    g = torch.Generator(device).manual_seed(task.n * 31 + task.k)
    q = quantize(
        torch.randn(task.n, task.k, generator=g, device=device) * 0.02, task.fmt, block_size=task.block_size
    )
    weights = [[t.clone() for t in transform_weight(q, kernel)] for _ in range(copies)]
    m = task.m_bucket or 64
    x = torch.randn(m, task.k, generator=g, device=device).to(getattr(torch, task.a_dtype))
    y = torch.empty(m, task.n, dtype=x.dtype, device=device)
    return x, weights, y, q.nbytes


def _time(kernel: builder.Kernel, task: Task) -> float:
    """Median µs of one CUDA launch: a graph of launches over rotating weight copies, as `mxgemm bench`."""
    from mxgemm import bench

    nbytes = task.n * task.k * formats.get(task.fmt).bits // 8
    x, weights, y, _ = _inputs(task, torch.device("cuda"), bench._copies(nbytes))
    calls = [lambda w=w: kernel(x, *w, y) for w in weights]
    import tvm_ffi

    with tvm_ffi.use_torch_stream():
        return bench._time_graph(bench._cycle(calls))


def _time_cpu(kernels: list[builder.Kernel], task: Task, seconds: float | None) -> list[float]:
    """Median µs of one call of each CPU kernel (the candidates of ``task``), their calls interleaved
    round by round (a drift of the machine's speed, large on shared VMs, hits every candidate alike),
    every call on the next of weight copies cycled past the last-level cache (a model's layers come
    from DRAM; the fastest hints differ from L3-resident ones, as `mxgemm bench --device cpu` times
    them). :data:`CPU_CALLS` rounds, fewer when ``seconds`` runs out (at least 5)."""
    from mxgemm import bench_cpu
    from mxgemm.layout import kernel_layout

    if not kernels:
        return []
    nbytes = task.n * task.k * formats.get(task.fmt).bits // 8
    copies = bench_cpu._copies(nbytes)
    layouts = {}  # the weight copies of each layout the candidates read (`layout.kernel_layout`)
    for kernel in kernels:
        if kernel_layout(kernel) not in layouts:
            layouts[kernel_layout(kernel)] = _inputs(task, torch.device("cpu"), copies, kernel)
    x, _, y, _ = next(iter(layouts.values()))
    for kernel in kernels:
        for w in layouts[kernel_layout(kernel)][1]:
            kernel(x, *w, y)
    times: list[list[float]] = [[] for _ in kernels]
    start = time.perf_counter()
    for i in range(max(CPU_CALLS, copies)):
        if i >= 5 and seconds is not None and time.perf_counter() - start > seconds:
            break
        for j, (kernel, ts) in enumerate(zip(kernels, times, strict=True)):
            weights = layouts[kernel_layout(kernel)][1]
            w = weights[(i * len(kernels) + j) % len(weights)]  # the least recently read copy
            t0 = time.perf_counter()
            kernel(x, *w, y)
            ts.append((time.perf_counter() - t0) * 1e6)
    return [statistics.median(ts) for ts in times]


def check(kernel: builder.Kernel, task: Task, device: torch.device) -> str | None:
    """Run ``kernel`` once on seeded inputs (:func:`_inputs`, the weight in the kernel's own layout)
    and compare with ``x @ dequantize(W).T`` in fp32; None if it agrees (within 1% of the output's
    largest magnitude: the activation-dtype output's rounding), else what is wrong."""
    from mxgemm.layout import transform_weight
    from mxgemm.reference import dequantize, quantize

    g = torch.Generator(device).manual_seed(task.n * 31 + task.k + 1)
    q = quantize(
        torch.randn(task.n, task.k, generator=g, device=device) * 0.02, task.fmt, block_size=task.block_size
    )
    m = task.m_bucket or 64
    x = torch.randn(m, task.k, generator=g, device=device).to(getattr(torch, task.a_dtype))
    y = torch.full((m, task.n), torch.nan, dtype=x.dtype, device=device)
    kernel(x, *transform_weight(q, kernel), y)
    want = x.float() @ dequantize(q).T
    err = (y.float() - want).abs().max().item()
    bound = 0.01 * want.abs().max().item() + 1e-6
    return None if err <= bound else f"max error {err:.3g} > {bound:.3g} against the reference"


def device_name(task: Task) -> str:
    """What measures ``task`` here: the GPU's name, or ``cpu``."""
    return "cpu" if task.arch.startswith("llvm") else torch.cuda.get_device_name()


def read_manifest(kernel_dir: str | Path) -> tuple[Path, dict[Task, list[dict[str, Any]]]]:
    """(the kernel directory, its manifest's entries grouped by task, in manifest order)."""
    root = Path(kernel_dir)
    try:
        entries = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise TuneError(
            f"{root / MANIFEST}: no readable tune manifest ({e}); run `mxgemm tune --build-only`"
        ) from e
    by_task: dict[Task, list[dict]] = {}
    for e in entries:
        by_task.setdefault(Task(**e["task"]), []).append(e)
    return root, by_task


def measure_task(
    task: Task, group: list[dict[str, Any]], root: Path, seconds: float | None
) -> list[float | None]:
    """Check, then time, the candidates ``group`` (manifest entries; relative paths under ``root``) of
    ``task`` on this machine: median µs per entry, None for one that failed its check (logged) or that
    the time budget left out (the default candidate, first, is always timed)."""
    cpu = task.arch.startswith("llvm")
    if not cpu and not torch.cuda.is_available():
        raise TuneError(f"{task.arch} kernels need a CUDA GPU to measure")
    device = torch.device("cpu" if cpu else "cuda")
    kernels: list[Any] = []
    for e in group:
        path = Path(e["path"]) if Path(e["path"]).is_absolute() else root / e["path"]
        if e["rule"] == DECODE_RULE:
            kernels.append(DecodeThenGemm(task, path))
        else:
            kernels.append(builder.Kernel(task.spec(), path, {"rule": e["rule"], "hints": e["hints"]}))
    ok = []
    for e, kernel in zip(group, kernels, strict=True):
        wrong = check(kernel, task, device)
        if wrong:
            log.warning("candidate %s for %s is wrong, not timed: %s", e["hints"], task, wrong)
        ok.append(wrong is None)
    us: list[float | None] = [None] * len(group)
    good = [i for i, k in enumerate(ok) if k]
    if cpu:
        for i, t in zip(good, _time_cpu([kernels[i] for i in good], task, seconds), strict=True):
            us[i] = t
    else:
        t0 = time.perf_counter()
        for i in good:
            if any(u is not None for u in us) and seconds is not None and time.perf_counter() - t0 > seconds:
                break
            us[i] = _time(kernels[i], task)
        _whole_bucket(task, group, kernels, us)
    return us


def _whole_bucket(task: Task, group: list[dict[str, Any]], kernels: list, us: list[float | None]) -> None:
    """In a bucket past 256 rows (:data:`mxgemm.ops.WIDE`), the candidate kept is the one with the least
    mean over the bucket's rows, decode + cuBLAS among them (``us`` set to None for every other: they
    get no record). The bucket's record serves every row of it but is timed at its last; each
    candidate is timed again at the bucket's first row and the two ends averaged (decode + cuBLAS's
    time grows with the rows, a fused kernel's steps with its M tiles; a part-filled 256-row tile
    often costs more than a full one: H200, mxfp4, median 1.05x, up to 1.5x). Until ``f2adc53`` a
    fused candidate had to win at the first row as well, which had left 4096² fp16 at 512 rows on
    decode + cuBLAS, 35.8 µs, where the bf16 record's fused kernel took 28.8; the fastest at the
    last row is not always the best over the bucket either."""
    timed = [i for i, u in enumerate(us) if u is not None]
    at = next((i for i in timed if group[i]["rule"] == DECODE_RULE), None)
    if task.m_bucket not in ops.WIDE or at is None:  # (decode + cuBLAS not timed: nothing to weigh)
        return
    first = replace(task, m_bucket=builder.M_BUCKETS[builder.M_BUCKETS.index(task.m_bucket) - 1] + 1)
    ends = {i: (_time(kernels[i], first), us[i]) for i in timed}
    best = min(timed, key=lambda i: sum(ends[i]))
    for i in timed:
        if i != at:
            log.info("%s %s: %.1f / %.1f µs at %d / %d rows, decode + cuBLAS %.1f / %.1f: %s", task,
                     group[i]["hints"], *ends[i], first.m_bucket, task.m_bucket, *ends[at],
                     "kept" if i == best else "no record")  # fmt: skip
        us[i] = us[i] if i == best else None


class DecodeThenGemm:
    """Decode + cuBLAS as a candidate of ``task``: the decode kernel at ``path`` writes W in the
    activations' dtype a chunk of rows at a time, cuBLAS multiplies (:func:`mxgemm.ops._decode_then_cublas`);
    called as the fused kernels are, ``(x, *planes, scales, y)``, cuBLAS writing into ``y`` (a copy of
    its output into ``y``, which ``linear`` does not make, took 5% of its time on average and up to
    11% at 384-1024 rows on an H100: fused candidates won records they lose through ``linear``)."""

    rule = DECODE_RULE

    def __init__(self, task: Task, path: Path) -> None:
        self.task = task
        rows = ops.decode_chunk_rows(task.n, task.k)
        dt = task.a_dtype
        spec = builder.KernelSpec(
            task.fmt, rows, task.k, None, dt, dt, False, task.block_size, task.target(), op="decode"
        )
        self.kernel = builder.Kernel(spec, path, {"rule": DECODE_RULE, "hints": {}})

    def __call__(self, x: torch.Tensor, *args: torch.Tensor) -> None:
        *planes, scales, y = args
        t = self.task
        ops._decode_then_cublas(x, planes, scales, None, t.fmt, t.block_size, t.n, t.k, self.kernel, out=y)


def records(task: Task, timed: list[tuple[dict[str, Any], float]], device: str) -> list[tunelog.Record]:
    """Tune log records of ``task``'s timed manifest entries (µs each), measured on ``device``."""
    return [
        tunelog.Record(
            **asdict(task), rule=e["rule"], config=e["hints"], us=us, gpu=device, versions=e["versions"]
        )
        for e, us in timed
    ]


def write_measurements(root: Path, recs: list[tunelog.Record]) -> None:
    with open(root / MEASUREMENTS, "w") as f:
        f.writelines(json.dumps(asdict(r), sort_keys=True) + "\n" for r in recs)


def measure(kernel_dir: str | Path, seconds: float | None = None, progress=None) -> list[tunelog.Record]:
    """Check and time every candidate of the manifest in ``kernel_dir`` (:func:`measure_task`: at most
    ``seconds`` per task, the default candidate always; CPU candidates of a task interleaved,
    :func:`_time_cpu`); also written to its measurements file. A candidate that computes a wrong
    result gets no record."""
    root, by_task = read_manifest(kernel_dir)
    out = []
    for task, group in by_task.items():
        us = measure_task(task, group, root, seconds)
        recs = records(
            task, [(e, t) for e, t in zip(group, us, strict=True) if t is not None], device_name(task)
        )
        out += recs
        if progress:
            for r in recs:
                progress(r)
    write_measurements(root, out)
    return out


# ---- step 3: merge ---------------------------------------------------------------------------------


def merge(kernel_dir: str | Path, log_path: str | Path, replace: bool = False) -> list[tunelog.Record]:
    """The fastest measured candidate per task, merged into the log at ``log_path`` (``replace``: in
    place of the log's records of those tasks, :func:`mxgemm.tunelog.merge`) where it beats the kernel
    its bucket borrows (:func:`_beats_the_lent_kernel`); returns the merged ones."""
    measured = tunelog.read(Path(kernel_dir) / MEASUREMENTS)
    if not measured:
        raise TuneError(
            f"{Path(kernel_dir) / MEASUREMENTS}: no measurements; run `mxgemm tune --measure` first"
        )
    best: dict[tuple, tunelog.Record] = {}
    for r in measured:
        if r.key() not in best or r.us < best[r.key()].us:
            best[r.key()] = r
    winners = [r for r in best.values() if _beats_the_lent_kernel(r, Path(log_path))]
    if not winners:
        return []
    stale = [r for r in winners if r.versions != tunelog.rule_versions(r.rule, _build_versions(r.arch))]
    if stale:  # measured kernels of other sources: keep the log's current records over them
        log.warning("%d measured records are from other sources than this checkout's", len(stale))
    tunelog.merge(log_path, winners, _build_versions(winners[0].arch), replace)
    return winners


def _beats_the_lent_kernel(r: tunelog.Record, log_path: Path) -> bool:
    """Whether ``r``, the fastest candidate measured for its task, beats what its bucket runs without a
    record of its own: a bucket of :data:`mxgemm.ops.BORROWS` runs the kernel of the bucket it borrows,
    whose record (in ``log_path`` or the shipped log, timed on the same GPU) holds its µs at that
    bucket's own, larger M, an upper bound of its cost at ``r``'s. The tuner's candidates for the
    bucket do not include that kernel, so a winner slower than it would make the route slower; such a
    winner is left out (logged), and the bucket keeps borrowing."""
    lent = ops.BORROWS.get(r.m_bucket)
    if lent is None or not r.arch.startswith("sm_"):
        return True
    key = replace(r, m_bucket=lent).key()
    paths = list(dict.fromkeys([tunelog.shipped_log(r.arch), log_path]))
    rec = tunelog.lookup(key, _build_versions(r.arch), paths)
    if rec is None or rec.gpu != r.gpu or r.us < rec.us:
        return True
    log.warning(
        "%s %d,%d %s, bucket %d: the best candidate (%.1f us) is slower than the %d-row bucket's record "
        "(%.1f us) it runs on now; not merged",
        r.fmt, r.n, r.k, r.a_dtype, r.m_bucket, r.us, lent, rec.us,
    )  # fmt: skip
    return False


def _build_versions(arch: str) -> dict[str, str | None]:
    return builder.versions(_target(arch))


def summary(records: list[tunelog.Record]) -> str:
    """Markdown table per task: default hints' µs, the best µs, the gain and the winning hints (the
    first record of a task is its default candidate)."""
    rows = [
        "| format | N | K | M bucket | default µs | tuned µs | gain | hints |",
        "|---|---|---|---|---|---|---|---|",
    ]
    seen: dict[tuple, list[tunelog.Record]] = {}
    for r in records:
        seen.setdefault(r.key(), []).append(r)
    for rs in seen.values():
        d, b = rs[0], min(rs, key=lambda r: r.us)
        hints = (
            " ".join(f"{k}={v}" for k, v in b.config.items()) if b.rule != DECODE_RULE else "decode + cuBLAS"
        )
        gain = d.us / b.us
        rows.append(
            f"| {d.fmt} | {d.n} | {d.k} | {_bucket(d.m_bucket)} | {d.us:.1f} | {b.us:.1f} | {gain:.2f}x "
            f"| {hints} |"
        )
    return "\n".join(rows)


def _bucket(m_bucket: int | None) -> str:
    return "any M (one dynamic-M kernel)" if m_bucket is None else f"≤ {m_bucket}"


def pending(todo: list[Task], log_path: Path) -> list[Task]:
    """Tasks the log has no current-version record for (resumability)."""
    done = set()
    for t in todo:
        versions = builder.versions(t.target())
        if tunelog.lookup(t.key(), versions, [log_path]) is not None:
            done.add(t)
    return [t for t in todo if t not in done]
