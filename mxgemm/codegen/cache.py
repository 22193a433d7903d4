"""On-disk kernel cache: versioned keys, atomic writes under a file lock, checksummed entries.

Layout: ``<dir>/<key>.so`` (the exported TVM library) and ``<dir>/<key>.json`` (what was built, and
the SHA-256 of the .so). The JSON is written last, so a present JSON means a complete entry; an entry
whose checksum does not match is removed (where we may) and rebuilt, never loaded. The directory is
``$MXGEMM_CACHE_DIR`` or the user's cache dir (``platformdirs``), plus ``/kernels``.

Sharing: entries are written group- and world-readable (0644, folders 0755, lock files 0666), as pip's
cache is, so a team can share one cache. A cache that cannot be written (read-only, another user's
entries) is still read; new kernels then go to a private fallback folder. One that cannot be used at
all (a file in its place, no permission) is replaced by that fallback. Either way with one warning.

The checksum protects integrity (a torn or corrupted entry is never loaded), not authenticity: whoever
can write the cache folder can make this process load a library of theirs. Point ``MXGEMM_CACHE_DIR``
only at folders writable by people you trust.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import platformdirs
from filelock import FileLock

log = logging.getLogger(__name__)
ENV_VAR = "MXGEMM_CACHE_DIR"


def _wanted() -> Path:
    return Path(os.environ.get(ENV_VAR) or platformdirs.user_cache_dir("mxgemm")) / "kernels"


def _fallback() -> Path:
    """A private folder of this user's, for kernels the configured cache cannot take."""
    d = Path(tempfile.gettempdir()) / f"mxgemm-{os.getuid()}-cache" / "kernels"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


@functools.cache
def _layout(wanted: Path) -> tuple[tuple[Path, ...], Path]:
    """(folders to look entries up in, folder new entries go to) for the configured ``wanted`` folder;
    warns once when it is read-only or unusable."""
    try:
        wanted.mkdir(parents=True, exist_ok=True, mode=0o755)
        if not wanted.is_dir():
            raise NotADirectoryError(f"{wanted} is not a directory")
        fd, probe = tempfile.mkstemp(dir=wanted, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
        return (wanted,), wanted
    except OSError as e:
        fallback = _fallback()
        readable = wanted.is_dir() and os.access(wanted, os.R_OK | os.X_OK)
        use = "reading it, and building new kernels" if readable else "using"
        warnings.warn(f"kernel cache {wanted} is not writable ({e}); {use} {fallback} instead", stacklevel=3)
        return ((wanted, fallback) if readable else (fallback,)), fallback


def cache_dir() -> Path:
    """The folder new kernels are written to."""
    return _layout(_wanted())[1]


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
    """The entry's metadata if it is complete and intact, else ``None`` (and the entry is removed
    where this user may)."""
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
        try:
            p.unlink(missing_ok=True)
        except OSError:  # another user's entry, or a read-only cache: the rebuild goes elsewhere
            pass
    return None


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a shared cache must be readable by the team
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _lock(d: Path, key: str) -> FileLock | None:
    """The held build lock of ``key`` in ``d``, or None where this user cannot take it."""
    lock = FileLock(str(d / f"{key}.lock"), mode=0o666)
    try:
        lock.acquire()
    except OSError:
        return None
    return lock


def get_or_build(
    spec: dict[str, Any], build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """Path of the cached library for ``spec`` and its metadata, building it if needed.

    ``build(path)`` writes the library to ``path`` and returns extra metadata (JSON-able). Concurrent
    callers (threads or processes) for the same key build once; the others wait on the lock.
    """
    lookup, d = _layout(_wanted())
    key = key_of(spec)
    for where in lookup:
        info = _valid(where / f"{key}.so", where / f"{key}.json", spec)
        if info is not None:
            return where / f"{key}.so", info
    lock = _lock(d, key)
    if lock is None:  # another user's lock file in a shared cache
        d = _fallback()
        lock = _lock(d, key)
        if lock is None:
            raise PermissionError(f"cannot take a kernel build lock in {d}")
    lib, meta = d / f"{key}.so", d / f"{key}.json"
    try:
        info = _valid(lib, meta, spec)
        if info is not None:
            return lib, info
        extra: dict[str, Any] = {}
        _atomic_write(lib, lambda p: extra.update(build(p)))
        info = {"spec": json.loads(json.dumps(spec, default=str)), "sha256": _sha256(lib), **extra}
        _atomic_write(meta, lambda p: p.write_text(json.dumps(info, indent=1)))
    finally:
        lock.release()
    return lib, info
