"""Compilation targets: ``"llvm"`` (this CPU) and CUDA archs, as the dicts TVM 0.27 wants.

CUDA limits come from the arch so no GPU is needed to build (dlight needs
``max_shared_memory_per_block``, else it assumes 48 KB; the ``sm_90a`` tag disables dlight's tensor
cores, use ``sm_90``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

# Dynamic shared memory per block (bytes) by compute capability; 48 KB static.
_SMEM = {70: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
MIN_SM = 80  # bf16 and the async copies we rely on
# SMs of the arch's data-center part (A100, A10/A40 class, L40, H100 SXM): schedule hints only.
_SM_COUNT = {80: 108, 86: 84, 89: 142, 90: 132}


def sm_version(arch: str) -> int:
    """``"sm_90"`` → 90."""
    m = re.fullmatch(r"sm_(\d+)a?", arch)
    if not m:
        raise ValueError(f"CUDA arch must look like 'sm_80' or 'sm_90', got {arch!r}")
    return int(m.group(1))


# LLVM CPU features the kernels use -> the flag /proc/cpuinfo reports for each
HOST_FLAGS = {
    "avx512bf16": "avx512_bf16",
    "avx512bw": "avx512bw",
    "avx512f": "avx512f",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
}


@functools.cache
def cpu() -> dict[str, Any]:
    """LLVM target for this machine's CPU: its model (``mcpu``), less the features of
    :data:`HOST_FLAGS` that the model has but the running CPU does not report (``mattr``, where
    ``/proc/cpuinfo`` can be read): a VM may hide some, and LLVM names the CPU by its model. Those
    features are then neither emitted nor assumed by a rule, and the kernel cache keys differ."""
    from tvm.target import codegen

    from mxgemm import system

    target = {"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}
    flags = system.cpu_flags()
    feats = _features(target)
    hidden = sorted(f for f, flag in HOST_FLAGS.items() if flags and f in feats and flag not in flags)
    return {**target, "mattr": [f"-{f}" for f in hidden]} if hidden else target


def cuda(arch: str) -> dict[str, Any]:
    """CUDA target dict for ``arch`` (``sm_80``, ``sm_86``, ``sm_89``, ``sm_90``)."""
    sm = sm_version(arch)
    if sm < MIN_SM:
        raise ValueError(f"mxgemm CUDA kernels need sm_80 or newer (bf16, cp.async), got {arch!r}")
    if arch.endswith("a"):
        raise ValueError(
            f"use {arch[:-1]!r} instead of {arch!r}: the 'a' tag disables tensor cores in dlight"
        )
    return {
        "kind": "cuda",
        "arch": arch,
        "max_shared_memory_per_block": _SMEM.get(sm, 99 * 1024),
        "max_threads_per_block": 1024,
        "thread_warp_size": 32,
        "registers_per_block": 65536,
    }


def resolve(target: str | dict[str, Any]) -> dict[str, Any]:
    """``"llvm"``/``"cpu"``, ``"cuda"`` (arch of GPU 0), ``"sm_90"``, ``{"kind": "cuda", "arch": ...}``
    or an ``{"kind": "llvm", ...}`` dict → a complete target dict."""
    if isinstance(target, dict):
        kind = target.get("kind")
        if kind == "llvm":
            return {**cpu(), **target}
        if kind == "cuda":
            if "arch" not in target:
                raise ValueError(f"CUDA target needs an 'arch' such as 'sm_90': {target!r}")
            return {**cuda(target["arch"]), **target}
        raise ValueError(f"target kind must be 'llvm' or 'cuda', got {kind!r} in {target!r}")
    if target in ("llvm", "cpu"):
        return cpu()
    if target == "cuda":
        return cuda(device_arch())
    if isinstance(target, str) and target.startswith("sm_"):
        return cuda(target)
    raise ValueError(f"target must be 'llvm', 'cuda', 'sm_XY' or a target dict, got {target!r}")


def device_arch(index: int | None = None) -> str:
    """``sm_XY`` of a visible CUDA device (the current one by default)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible: build for an explicit arch such as 'sm_90' instead")
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def for_device(device: Any) -> dict[str, Any]:
    """The target of a torch device: its CUDA arch, or this CPU."""
    return cuda(device_arch(device.index)) if device.type == "cuda" else cpu()


def arch_of(target: dict[str, Any]) -> str:
    """``"sm_90"`` for a CUDA target, ``"llvm"`` for a CPU one (what :func:`mxgemm.ops.plan` takes)."""
    return target["arch"] if is_cuda(target) else "llvm"


def sm_count(arch: str) -> int:
    """Streaming multiprocessors to plan grids for (the arch's data-center part; a hint, not a limit)."""
    return _SM_COUNT.get(sm_version(arch), 108)


def is_cuda(target: dict[str, Any]) -> bool:
    return target["kind"] == "cuda"


@functools.cache
def _cpu_features(mcpu: str | None, mtriple: str | None, mattr: tuple[str, ...]) -> frozenset[str]:
    import tvm
    from tvm.target import codegen

    spec = {"kind": "llvm", "mcpu": mcpu, "mtriple": mtriple, "mattr": list(mattr)}
    return frozenset(codegen.llvm_get_cpu_features(tvm.target.Target({k: v for k, v in spec.items() if v})))


def _features(target: dict[str, Any]) -> frozenset[str]:
    """LLVM's CPU features of an LLVM target dict (its ``mcpu``, ``mtriple`` and ``mattr``)."""
    return _cpu_features(target.get("mcpu"), target.get("mtriple"), tuple(target.get("mattr") or ()))


def cpu_vectors(target: dict[str, Any]) -> tuple[int, int]:
    """(fp32 lanes of one vector register, vector registers) of an LLVM target, from the CPU features
    LLVM gives its ``mcpu``/``mattr``: AVX-512 (16, 32), AVX/AVX2 (8, 16), AArch64 (4, 32: NEON;
    SVE kernels are not emitted), else SSE (4, 16). The CPU rules size their register tiles by it:
    an AVX2 core has half the registers of an AVX-512 one, each of half the width. (LLVM's own
    ``llvm_get_vector_width`` says 512 for every x86 CPU, AVX2-only ones included.)"""
    feats = _features(target)
    if "avx512f" in feats:
        return 16, 32
    if "avx" in feats or "avx2" in feats:
        return 8, 16
    if "neon" in feats or str(target.get("mtriple", "")).startswith(("aarch64", "arm64")):
        return 4, 32
    return 4, 16


def cpu_converts_f16(target: dict[str, Any]) -> bool:
    """Whether an LLVM target converts fp16 vectors to fp32 in one instruction (x86 F16C, AArch64):
    elsewhere LLVM calls a library function per element."""
    if str(target.get("mtriple", "")).startswith(("aarch64", "arm64")):
        return True
    return "f16c" in _features(target)


def cpu_bf16_dots(target: dict[str, Any]) -> bool:
    """Whether an LLVM target has the x86 bf16 dot product (AVX512-BF16 ``vdpbf16ps``) and the 16-bit
    register table lookups (AVX512-BW ``vpermw``/``vpermi2w``) that the ``cpu_dot`` kernel is made of
    (this machine's: what its CPU reports, :func:`cpu`)."""
    return {"avx512bf16", "avx512bw"} <= _features(target)


def cpu_word_lookups(target: dict[str, Any]) -> bool:
    """Whether an LLVM target has AVX512-BW's 16-bit register table lookups (``vpermw``/``vpermi2w``)
    and AVX-512 fp32 vectors: the ``cpu_dot`` kernel with fp32 multiply-adds."""
    return {"avx512f", "avx512bw"} <= _features(target)
