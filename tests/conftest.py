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
