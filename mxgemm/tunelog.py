"""Tune logs: offline tuning results, one JSON record per line, looked up at build time (never tuned there).

A record is keyed by (fmt, n, k, m_bucket, a_dtype, block_size, arch) and holds the schedule rule and
the config that won, its measured µs, the GPU, and the versions that built it (:func:`rule_versions`:
mxgemm, TVM, and a digest of the sources the rule's hints depend on, so editing one rule does not
throw away the other rules' records). Lookups read
the shipped log (``tune_logs/<arch>.json`` beside the package) and the user's log
(``$MXGEMM_TUNE_LOG`` or ``<user data dir>/tune_logs/<arch>.json``); a record from other versions is
skipped (debug message) and a corrupt line or file is skipped with a warning, never an error.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import platformdirs
from filelock import FileLock

from mxgemm.codegen import digest

log = logging.getLogger(__name__)
KEY_FIELDS = ("fmt", "n", "k", "m_bucket", "a_dtype", "block_size", "arch")
DECODE_RULE = "dequant"  # a record of it: decode + cuBLAS measured faster than the fused kernels


@dataclass(frozen=True)
class Key:
    """What a tune log is keyed by: (format, N, K, M bucket, activation dtype, block size, arch).
    ``block_size`` (keyword) defaults to the format's: records written before it was in the key were
    all tuned at that block size."""

    fmt: str
    n: int
    k: int
    m_bucket: int | None
    a_dtype: str
    arch: str
    block_size: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        if not self.block_size:
            from mxgemm import formats

            object.__setattr__(self, "block_size", formats.get(self.fmt).block_size)

    def key(self) -> tuple:
        return tuple(getattr(self, f) for f in KEY_FIELDS)


@dataclass(frozen=True)
class Record(Key):
    """One tuned :class:`Key`: the winning rule, its hints and its time."""

    rule: str
    config: dict[str, Any] = field(default_factory=dict, hash=False)
    us: float = 0.0
    gpu: str = ""
    versions: dict[str, str | None] = field(default_factory=dict, hash=False)

    @classmethod
    def from_dict(cls, d: Any) -> Record:
        """The record a JSON object describes; ValueError naming the first field of the wrong kind."""
        if not isinstance(d, dict):
            raise ValueError(f"a record is a JSON object, got {type(d).__name__}")
        missing = [f for f in (*KEY_FIELDS, "rule") if f not in d and f != "block_size"]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        for name, ok in _FIELD_CHECKS.items():
            if name in d and not ok(d[name]):
                raise ValueError(f"field {name} is {d[name]!r}")
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


_FIELD_CHECKS = {  # what each field must hold: a NaN, negative or string time would win every lookup
    "fmt": lambda v: isinstance(v, str),
    "n": _count,
    "k": _count,
    "m_bucket": lambda v: v is None or _count(v),
    "a_dtype": lambda v: v in ("float16", "bfloat16"),
    "block_size": _count,
    "arch": lambda v: isinstance(v, str),
    "rule": lambda v: isinstance(v, str),
    "config": lambda v: isinstance(v, dict),
    "us": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
    "gpu": lambda v: isinstance(v, str),
    "versions": lambda v: isinstance(v, dict),
}


def read(path: str | Path) -> list[Record]:
    """Records of a JSON-lines log; unreadable files and corrupt lines (not a record, a field of the wrong
    kind, hints outside their rule's space) are skipped with a warning (once per version of the file:
    its records are parsed again only when its text changes)."""
    return list(_parsed(Path(path))[0])


_PARSED: dict[Path, tuple[str, list[Record], dict[tuple, list[Record]]]] = {}


def _parsed(path: Path) -> tuple[list[Record], dict[tuple, list[Record]]]:
    """(records, records by key) of the log at ``path``, parsed again only when its text changed."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return [], {}
    except (OSError, UnicodeDecodeError) as e:
        warnings.warn(f"tune log {path} is unreadable ({e}); ignored", stacklevel=3)
        return [], {}
    hit = _PARSED.get(path)
    if hit is not None and hit[0] == text:
        return hit[1], hit[2]
    lines = text.splitlines()
    from mxgemm.rules import hints_problem

    out, by_key = [], {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = Record.from_dict(json.loads(line))
            if (why := hints_problem(r.rule, r.config)) is not None:
                raise ValueError(why)
            out.append(r)
            by_key.setdefault(r.key(), []).append(r)
        except (ValueError, TypeError) as e:
            warnings.warn(f"tune log {path}:{no} is corrupt ({e}); line ignored", stacklevel=3)
    _PARSED[path] = (text, out, by_key)
    return out, by_key


# What a rule's hints depend on, besides the rule's own file (rules/<rule>.py).
_RULE_INPUTS = ("codegen/prim_func.py", "codegen/decode.py", "formats.py", "layout.py")


# sources a rule has on top of _RULE_INPUTS
_RULE_EXTRA = {
    "mma": ("codegen/pairs.py", "codegen/wgmma.py", "codegen/mma.py"),
    "wgmma_w": ("codegen/pairs.py", "codegen/wgmma.py", "codegen/wgmma_w.py"),
    "cpu_dot": ("codegen/cpu_dot.py",),
}


@functools.cache
def _rule_digest(rule: str) -> str:
    name = rule.split(".", maxsplit=1)[0]
    rels = (*_RULE_INPUTS, *_RULE_EXTRA.get(name, ()), f"rules/{name}.py")
    return digest.sources(Path(__file__).resolve().parent, rels)


def rule_versions(rule: str, versions: dict[str, str | None]) -> dict[str, str | None]:
    """The versions a record of ``rule`` must carry to be current: the build ``versions`` (mxgemm,
    TVM; its whole-codegen digest left out) plus the digest of the prim_func, the decode, the
    formats, the layout and the rule's own source."""
    return {**{k: v for k, v in versions.items() if k != "codegen"}, "rule": _rule_digest(rule)}


def _is_current(r: Record, versions: dict[str, str | None] | None) -> bool:
    return versions is None or r.versions == rule_versions(r.rule, versions)


def merge(
    path: str | Path,
    records: list[Record],
    versions: dict[str, str | None] | None = None,
    replace: bool = False,
) -> list[Record]:
    """Add ``records`` to the log at ``path`` (atomic, under a file lock); per key the fastest current
    record (:func:`rule_versions` of the build ``versions``) wins, and records of other versions give
    way to current ones. ``replace``: the log's records of the keys that current ``records`` hold go
    first (a re-tune, measured in one run against the hints it replaces, on another card or day than
    theirs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        best: dict[tuple, Record] = {}
        renewed = {r.key() for r in records if _is_current(r, versions)} if replace else set()
        for r in [*(r for r in read(path) if r.key() not in renewed), *records]:
            old = best.get(r.key())
            current = _is_current(r, versions)
            old_current = old is not None and _is_current(old, versions)
            if old is None or (current and not old_current) or (current == old_current and r.us < old.us):
                best[r.key()] = r
        merged = sorted(best.values(), key=lambda r: tuple(str(v) for v in r.key()))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            f.writelines(json.dumps(asdict(r), sort_keys=True) + "\n" for r in merged)
        os.replace(tmp, path)
    return merged


def shipped_log(arch: str) -> Path:
    """The log shipped with mxgemm for ``arch`` (``tune_logs/`` in the repo, package data
    ``mxgemm/tune_logs/`` in the wheel)."""
    from importlib.resources import files

    try:
        return Path(str(files("mxgemm.tune_logs"))) / f"{arch}.json"
    except ModuleNotFoundError:  # a source tree on sys.path without installing
        return Path(__file__).resolve().parents[1] / "tune_logs" / f"{arch}.json"


def user_log(arch: str) -> Path:
    env = os.environ.get("MXGEMM_TUNE_LOG")
    return Path(env) if env else Path(platformdirs.user_data_dir("mxgemm")) / "tune_logs" / f"{arch}.json"


# rules whose records hold for fp16 and bf16 alike: mma's and wgmma_w's hints shape both kernels alike; a
# dequant record (decode + cuBLAS beat the fused kernels) times the same decode and a GEMM of the same speed
SHARED_ACROSS_DTYPES = ("mma", "wgmma_w", "dequant")


def lookup(key: tuple, versions: dict[str, str | None], paths: list[Path] | None = None) -> Record | None:
    """The fastest current record for ``key`` (see :data:`KEY_FIELDS`; current: its versions are
    :func:`rule_versions` of the build ``versions``), or None (then the rules' default hints apply).
    The user log is read after the shipped one. A bf16 key without a record takes the fp16 key's
    record of a rule in :data:`SHARED_ACROSS_DTYPES` (the same kernel but for one exact op per decoded
    pair: its tuned hints beat the defaults). ``$MXGEMM_TUNED=0`` turns lookups off (to measure the
    defaults)."""
    if os.environ.get("MXGEMM_TUNED", "1") == "0":
        return None
    found = _fastest(key, versions, paths)
    at = KEY_FIELDS.index("a_dtype")
    if found is None and key[at] == "bfloat16":
        twin = _fastest((*key[:at], "float16", *key[at + 1 :]), versions, paths)
        if twin is not None and twin.rule in SHARED_ACROSS_DTYPES:
            found = twin
    return found


def neighbours(
    key: tuple, versions: dict[str, str | None], paths: list[Path] | None = None, most: int = 8
) -> list[Record]:
    """For a ``key`` without a record of its own: the fastest current record of each other layer
    shape with the same format, M bucket, dtype, block size and arch, nearest shape first (by
    ``|ln(n/n')| + |ln(k/k')|``; ties by shape), at most ``most``. A bf16 key also takes the fp16
    records of a rule in :data:`SHARED_ACROSS_DTYPES`, after the bf16 ones of the same shape.
    ``$MXGEMM_TUNED=0`` or ``$MXGEMM_NEAREST=0``: none."""
    if os.environ.get("MXGEMM_TUNED", "1") == "0" or os.environ.get("MXGEMM_NEAREST", "1") == "0":
        return []
    at_n, at_k, at_dt = (KEY_FIELDS.index(f) for f in ("n", "k", "a_dtype"))
    rest = lambda kk: kk[:at_n] + kk[at_k + 1 : at_dt] + kk[at_dt + 1 :]  # noqa: E731
    dtypes = ("bfloat16", "float16") if key[at_dt] == "bfloat16" else (key[at_dt],)
    arch = key[KEY_FIELDS.index("arch")]
    logs = paths if paths is not None else [shipped_log(arch), user_log(arch)]
    shapes = {
        (kk[at_n], kk[at_k])
        for p in logs
        for kk in _parsed(Path(p))[1]
        if rest(kk) == rest(key) and kk[at_dt] in dtypes and (kk[at_n], kk[at_k]) != (key[at_n], key[at_k])
    }
    far = lambda s: abs(math.log(s[0] / key[at_n])) + abs(math.log(s[1] / key[at_k]))  # noqa: E731
    out = []
    for n, k in sorted(shapes, key=lambda s: (far(s), s)):
        for dt in dtypes:
            kk = list(key)
            kk[at_n], kk[at_k], kk[at_dt] = n, k, dt
            r = _fastest(tuple(kk), versions, paths)
            if r is not None and (dt == key[at_dt] or r.rule in SHARED_ACROSS_DTYPES):
                out.append(r)
                break
        if len(out) >= most:
            break
    return out


def _fastest(key: tuple, versions: dict[str, str | None], paths: list[Path] | None) -> Record | None:
    arch = key[KEY_FIELDS.index("arch")]
    found = None
    for p in paths if paths is not None else [shipped_log(arch), user_log(arch)]:
        for r in _parsed(Path(p))[1].get(key, ()):
            if not _is_current(r, versions):
                want = rule_versions(r.rule, versions)
                log.debug("tune log %s: record for %s is from %s, not %s; skipped", p, key, r.versions, want)
                continue
            if found is None or r.us < found.us:
                found = r
    return found
