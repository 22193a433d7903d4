"""Facts about this machine's toolchain and GPUs (used by `mxgemm info` and the kernel cache key)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import torch

NVCC_WHEEL_DIRS = ("cu13", "cu12")  # where NVIDIA's pip wheels put the toolkit under ``nvidia/``


def find_nvcc() -> str | None:
    """The nvcc on PATH, else the one of NVIDIA's pip wheels (``pip install 'mxgemm[cuda]'``:
    nvidia-cuda-nvcc and the headers it needs, ``nvidia/cu13/bin/nvcc`` in site-packages), else None."""
    found = shutil.which("nvcc")
    if found is not None:
        return found
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for sub in NVCC_WHEEL_DIRS:
            nvcc = Path(root) / sub / "bin" / "nvcc"
            if nvcc.is_file() and os.access(nvcc, os.X_OK):
                return str(nvcc)
    return None


@functools.cache
def nvcc_version() -> str | None:
    """``"13.0"``-style release of :func:`find_nvcc`'s nvcc, or ``None`` if there is none."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--version"], check=False, capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


@functools.cache
def tvm_info() -> dict[str, str]:
    """TVM version and the codegens it was built with (imports TVM: ~3 s)."""
    import tvm

    libinfo = tvm.support.libinfo()
    return {
        "version": tvm.__version__,
        "llvm": "on" if tvm.runtime.enabled("llvm") else "off",
        "cuda codegen": libinfo.get("USE_CUDA", "?").lower(),
        "cuda runtime": "on" if tvm.runtime.enabled("cuda") else "off (no driver)",
    }


@functools.cache
def tvm_can_compile() -> bool:
    """Whether this TVM has its compiler library (False for the runtime-only install carried to a GPU
    box with prebuilt kernels, which can load and run them but not schedule or build)."""
    import tvm  # noqa: F401  (loads the libraries that register the compiler's functions)
    import tvm_ffi

    return tvm_ffi.get_global_func("ir.PrimType", allow_missing=True) is not None


def gpus() -> list[str]:
    """``"NAME (sm_XY)"`` for each visible CUDA device."""
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        out.append(f"{torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    return out


def check_device(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a torch.device, or ValueError when it names CUDA and this torch cannot reach one
    (a CPU build, or no GPU visible): one clear error instead of torch's assertion deep in a load."""
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "is a CPU build" if torch.version.cuda is None else "sees no CUDA GPU"
        raise ValueError(
            f"device={str(device)!r}, but this torch ({torch.__version__}) {why}: use device='cpu', or "
            "device='cuda' if torch.cuda.is_available() else 'cpu'"
        )
    return dev


@functools.cache
def cpu_threads() -> int:
    """Threads for TVM's CPU kernels: ``$TVM_NUM_THREADS`` if set, else torch's
    (``torch.get_num_threads()``), set before TVM starts its thread pool. (TVM's own default is half the
    logical CPUs, assuming two hyperthreads a core: one thread on a 2-core VM.) Returns the count.

    Also ``$TVM_THREAD_POOL_SPIN_COUNT`` defaults to 0: TVM's idle workers sleep at once instead of
    spinning, so they leave the cores to torch's OpenMP threads between kernels. When a TVM kernel
    and a torch op alternate (the CPU decode path: decode, then torch's GEMM), spinning workers made
    each switch wait for a scheduler time slice (4096², 16 rows: 32 ms against 2.2 ms; even a spin
    count of 1000 did). It costs ~10 µs of wake-up per kernel call."""
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    return int(os.environ.setdefault("TVM_NUM_THREADS", str(torch.get_num_threads())))


@functools.cache
def cpu_bf16_dot() -> bool:
    """Whether this CPU has bf16 dot-product instructions that torch's GEMM (oneDNN) uses: x86
    AVX512-BF16 or AMX-BF16, arm64 BF16 (read from ``/proc/cpuinfo``; False where it cannot be read).
    Without them a bf16 GEMM is emulated and slower than fp32."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The running CPU's feature flags as the kernel reports them (``/proc/cpuinfo``; empty where it
    cannot be read): what a VM really passes through, which a CPU model name does not tell."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()
