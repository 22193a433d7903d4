"""Shared test configuration: `gpu` tests skip where CUDA is absent; `nvcc` tests where nvcc is."""

import shutil

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "nvcc" in item.keywords and shutil.which("nvcc") is None:
            item.add_marker(no_nvcc)


@pytest.fixture(scope="session", autouse=True)
def kernel_cache_dir(tmp_path_factory):
    """Kernels built by the tests go to a fresh cache unless MXGEMM_CACHE_DIR names one (a GPU run
    carrying kernels prebuilt elsewhere)."""
    import os

    if os.environ.get("MXGEMM_CACHE_DIR"):
        yield os.environ["MXGEMM_CACHE_DIR"]
        return
    d = tmp_path_factory.mktemp("kernel-cache")
    os.environ["MXGEMM_CACHE_DIR"] = str(d)
    yield str(d)
    del os.environ["MXGEMM_CACHE_DIR"]


# the env var that turns borrowing off (`mxgemm.nearest`); the tests that borrow set it to "1"
NEAREST_ENV = "MXGEMM_NEAREST"


@pytest.fixture(scope="session", autouse=True)
def unborrowed_router():
    """The tests of routing and of the rules' kernels see the router as it runs without a record for
    their (untuned) shapes: borrowing the nearest tuned shape's record (`mxgemm.nearest`) is off, except
    in tests/test_nearest.py (`borrowing`) and where a test turns it on. `tests.prebuild_gpu` builds
    each set's kernels the same way."""
    import os

    old = os.environ.get(NEAREST_ENV)
    os.environ[NEAREST_ENV] = "0"
    yield
    if old is None:
        del os.environ[NEAREST_ENV]
    else:
        os.environ[NEAREST_ENV] = old


@pytest.fixture
def borrowing(monkeypatch):
    """Borrowing on for one test (the plans looked up before and after it forgotten)."""
    from mxgemm import ops

    monkeypatch.setenv(NEAREST_ENV, "1")
    ops.clear_kernels()
    yield
    ops.clear_kernels()
