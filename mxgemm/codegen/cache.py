"""On-disk kernel cache: versioned keys, atomic writes under a file lock, checksummed entries.

Layout: ``<dir>/<key>.so`` (the exported TVM library) and ``<dir>/<key>.json`` (what was built, and
the SHA-256 of the .so). The JSON is written last, so a present JSON means a complete entry; an entry
whose checksum does not match is removed and rebuilt, never loaded. The directory is
``$MXGEMM_CACHE_DIR`` or the user's cache dir (``platformdirs``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import platformdirs
from filelock import FileLock

log = logging.getLogger(__name__)
ENV_VAR = "MXGEMM_CACHE_DIR"


def cache_dir() -> Path:
    d = Path(os.environ.get(ENV_VAR) or platformdirs.user_cache_dir("mxgemm")) / "kernels"
    d.mkdir(parents=True, exist_ok=True)
    return d


def key_of(spec: dict[str, Any]) -> str:
    """Stable hash of a JSON-able kernel description (format, shapes, dtypes, schedule, target, versions)."""
    blob = json.dumps(spec, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _valid(lib: Path, meta: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The entry's metadata if it is complete and intact, else ``None`` (and the entry is removed)."""
    if not meta.exists():
        return None
    try:
        info = json.loads(meta.read_text())
        if info["spec"] == json.loads(json.dumps(spec, default=str)) and info["sha256"] == _sha256(lib):
            return info
        reason = "does not match its key or checksum"
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = f"is unreadable ({e})"
    log.warning("kernel cache entry %s %s; rebuilding", lib, reason)
    for p in (meta, lib):
        p.unlink(missing_ok=True)
    return None


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def get_or_build(
    spec: dict[str, Any], build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """Path of the cached library for ``spec`` and its metadata, building it if needed.

    ``build(path)`` writes the library to ``path`` and returns extra metadata (JSON-able). Concurrent
    callers (threads or processes) for the same key build once; the others wait on the lock.
    """
    d = cache_dir()
    key = key_of(spec)
    lib, meta = d / f"{key}.so", d / f"{key}.json"
    info = _valid(lib, meta, spec)
    if info is not None:
        return lib, info
    with FileLock(str(d / f"{key}.lock")):
        info = _valid(lib, meta, spec)
        if info is not None:
            return lib, info
        extra: dict[str, Any] = {}
        _atomic_write(lib, lambda p: extra.update(build(p)))
        info = {"spec": json.loads(json.dumps(spec, default=str)), "sha256": _sha256(lib), **extra}
        _atomic_write(meta, lambda p: p.write_text(json.dumps(info, indent=1)))
    return lib, info
