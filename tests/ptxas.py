"""ptxas's report on a kernel's CUDA source (nvcc -Xptxas -v), and its PTX, for the tests of hand-scheduled
kernels."""

import re
import subprocess


def report(src: str, tmp_path, arch: str = "sm_90a") -> str:
    """ptxas's verbose report (stderr) of compiling ``src`` for ``arch``."""
    cu, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    cu.write_text(src)
    cmd = ["nvcc", "-cubin", "-O3", "-std=c++17", f"-arch={arch}", "-Xptxas", "-v", "-o", str(cubin), str(cu)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stderr


def ptx(src: str, tmp_path, arch: str = "sm_90a", name: str = "k") -> str:
    """The PTX nvcc makes of ``src`` for ``arch`` (files ``name.cu`` / ``name.ptx`` in ``tmp_path``)."""
    cu, out = tmp_path / f"{name}.cu", tmp_path / f"{name}.ptx"
    cu.write_text(src)
    subprocess.run(["nvcc", "-ptx", "-O3", f"-arch={arch}", "-o", str(out), str(cu)], check=True)
    return out.read_text()


def assert_wgmmas_async_no_spills(src: str, tmp_path, spills: int = 0) -> None:
    """ptxas neither serializes the kernel's wgmmas (C7514/C7515: a fragment or operand register touched
    while a wgmma is in flight) nor spills registers (more than ``spills`` bytes stored and loaded)."""
    log = report(src, tmp_path)
    assert "C751" not in log and "serialized" not in log, log
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert found and all(int(a) <= spills and int(b) <= spills for a, b in found), log
