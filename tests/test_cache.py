"""The kernel cache (`mxgemm.codegen.cache`) when it cannot be written: a file in its place, a read-only
or shared folder, another user's entries. Other users are real: as root the checks run in a child
process that has dropped to ``nobody``; otherwise a folder made read-only with chmod stands in."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import pytest

from mxgemm.codegen import cache

SPEC_A, SPEC_B = {"what": "test", "n": 1}, {"what": "test", "n": 2}
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _build(path):
    path.write_bytes(b"library-bytes")
    return {"rule": "x"}


@pytest.fixture
def area(monkeypatch):
    """A folder every user can reach (pytest's tmp_path is root-only), with a private temp dir inside
    (where fallbacks go), and a fresh lookup of the configured cache folder."""
    root = Path(tempfile.mkdtemp(prefix="mxgemm-cache-test-"))
    root.chmod(0o755)
    tmp = root / "tmp"
    tmp.mkdir()
    tmp.chmod(0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    cache._layout.cache_clear()
    yield root
    cache._layout.cache_clear()
    for p in root.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(root)


def test_entries_are_readable_by_the_team(area, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(area / "shared"))
    lib, _ = cache.get_or_build(SPEC_A, _build)
    d = lib.parent
    assert stat.S_IMODE(lib.stat().st_mode) == 0o644
    assert stat.S_IMODE(lib.with_suffix(".json").stat().st_mode) == 0o644
    assert stat.S_IMODE((d / (lib.stem + ".lock")).stat().st_mode) == 0o666
    assert stat.S_IMODE(d.stat().st_mode) & 0o755 == 0o755


def test_a_file_in_place_of_the_cache_falls_back_with_one_warning(area, monkeypatch):
    blocker = area / "not-a-dir"
    blocker.write_text("mine")
    monkeypatch.setenv(cache.ENV_VAR, str(blocker))
    with pytest.warns(UserWarning, match="not writable") as record:
        lib, info = cache.get_or_build(SPEC_A, _build)
        assert cache.get_or_build(SPEC_B, _build)[0].parent == lib.parent
    assert len(record) == 1
    assert lib.read_bytes() == b"library-bytes" and info["rule"] == "x"
    assert lib.is_relative_to(area / "tmp") and blocker.read_text() == "mine"


_CHILD = textwrap.dedent(
    """
    import json, os, sys, tempfile, warnings
    from mxgemm.codegen import cache  # imported first: nobody may not read this Python's files
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)  # nobody
    tempfile.tempdir = sys.argv[1]
    built = []

    def build(path):
        built.append(path.name)
        path.write_bytes(b"built-by-" + str(os.getuid()).encode())
        return {"rule": "child"}

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = {k: str(cache.get_or_build(json.loads(k), build)[0]) for k in sys.argv[2:]}
    print(json.dumps({"paths": out, "built": built, "warnings": [str(x.message) for x in w]}))
    """
)


def _as_other_user(tmp, *specs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp), *map(json.dumps, specs)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_cache_this_user_cannot_write_is_read_and_new_kernels_go_elsewhere(area, monkeypatch):
    shared = area / "shared"
    monkeypatch.setenv(cache.ENV_VAR, str(shared))
    lib_a, _ = cache.get_or_build(SPEC_A, _build)  # the team's entry
    if not ROOT:
        lib_a.parent.chmod(0o555)  # read-only for this user too
    try:
        got = _as_other_user(area / "tmp", SPEC_A, SPEC_B)
    finally:
        lib_a.parent.chmod(0o755)
    assert got["paths"][json.dumps(SPEC_A)] == str(lib_a)  # a hit, read from the shared cache
    assert len(got["built"]) == 1  # only B was built ...
    assert not got["paths"][json.dumps(SPEC_B)].startswith(str(shared))  # ... outside the shared cache
    assert len(got["warnings"]) == 1 and "not writable" in got["warnings"][0]


@pytest.mark.skipif(not ROOT, reason="needs a second user: runs as root, which can become nobody")
def test_another_users_private_entries_are_rebuilt_elsewhere_not_crashed_on(area, monkeypatch):
    shared = area / "shared"
    monkeypatch.setenv(cache.ENV_VAR, str(shared))
    lib_a, _ = cache.get_or_build(SPEC_A, _build)
    for p in lib_a.parent.iterdir():
        p.chmod(0o600)  # as an older mxgemm wrote them
    lib_a.parent.chmod(0o711)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _as_other_user(area / "tmp", SPEC_A)
    assert got["built"] and not got["paths"][json.dumps(SPEC_A)].startswith(str(shared))
    assert lib_a.read_bytes() == b"library-bytes"  # the owner's entry is left alone


@pytest.mark.parametrize(
    ("rule", "m_bucket"), [(None, 16), ("tensorcore", 16), ("gemv", 1), ("mma", 16), ("wgmma_w", 128)]
)
def test_a_miss_under_a_runtime_only_tvm_names_the_kernel_and_the_way_out(tmp_path, rule, m_bucket):
    """On a GPU box carrying prebuilt kernels and TVM without its compiler library (the device kit), a
    kernel missing from the cache is one clear error naming it, the cache and how to build it, not
    TVM's ImportError or AttributeError from deep in its script parser or schedule, whichever rule."""
    import tvm

    runtime = tmp_path / "site"
    shutil.copytree(Path(tvm.__file__).parent, runtime / "tvm", symlinks=True, copy_function=os.symlink)
    (runtime / "tvm" / "lib" / "libtvm_compiler.so").unlink()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(runtime), *sys.path]))
    env[cache.ENV_VAR] = str(tmp_path / "cache")
    asked = f", rule={rule!r}, hints={{}}" if rule else ""
    child = f"import mxgemm; mxgemm.build('mxfp4', n=256, k=256, m_bucket={m_bucket}, target='sm_90'{asked})"
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    head = f"RuntimeError: Kernel(linear mxfp4, n=256, k=256, m_bucket={m_bucket}"
    assert last.startswith(head), proc.stderr
    assert f"rule={rule or 'default'}" in last
    assert "is not in the kernel cache" in last and "--build-only" in last
    assert "During handling" not in proc.stderr and "direct cause" not in proc.stderr  # one error
