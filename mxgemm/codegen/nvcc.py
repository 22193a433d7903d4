"""Ahead-of-time CUDA compilation: TVM codegen → nvcc fatbin, with or without a GPU driver.

``tvm.compile`` hands CUDA source to a factory that lives in ``libtvm_runtime_cuda.so``, which links
the driver ``libcuda.so.1``; on a GPU-less box that library fails to load silently and the module
keeps *source* instead of a binary. We load a stub driver there (every call
fails with "no device"; it is only needed to build), then the CUDA runtime library, and register our
own nvcc callback: a fatbin with SASS for the target arch plus its PTX, without ``--use_fast_math``
(which would flush the 2**-127 scale to zero).
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

FATBIN_MAGIC = bytes.fromhex("50ed55ba")
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo")


def gencode(arch: str) -> list[str]:
    """SASS for ``arch`` plus its PTX (JIT-compiled by newer GPUs' drivers)."""
    sm = arch.removeprefix("sm_")
    return ["-gencode", f"arch=compute_{sm},code=sm_{sm}", "-gencode", f"arch=compute_{sm},code=compute_{sm}"]


def compile_fatbin(code: str, arch: str) -> bytes:
    """CUDA source → fatbin bytes for ``arch`` (raises RuntimeError with nvcc's message on failure)."""
    from mxgemm import system

    nvcc = system.find_nvcc()
    if nvcc is None:
        raise RuntimeError(
            "CUDA kernels need nvcc: the CUDA toolkit on PATH, or pip install 'mxgemm[cuda]'; CPU kernels "
            "work without it"
        )
    with tempfile.TemporaryDirectory(prefix="mxgemm-nvcc-") as d:
        src, out = Path(d) / "kernel.cu", Path(d) / "kernel.fatbin"
        src.write_text(code)
        cmd = [nvcc, "-fatbin", *NVCC_FLAGS, *gencode(arch), "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
        return out.read_bytes()


def _driver_available() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def _load_stub_driver() -> None:
    from mxgemm.codegen.cache import cache_dir

    so = cache_dir().parent / "libcuda_stub" / "libcuda.so.1"
    if not so.exists():
        so.parent.mkdir(parents=True, exist_ok=True)
        src = Path(__file__).with_name("libcuda_stub.c")
        tmp = so.with_name(f".{os.getpid()}.so")
        cmd = ["gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"building the CUDA driver stub failed ({' '.join(cmd)}): {proc.stderr}")
        os.replace(tmp, so)
    ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)


@functools.cache
def load_cuda_runtime() -> None:
    """Load TVM's CUDA runtime (module loader + codegen factory), which ``import tvm`` may not do;
    on a machine without a driver, behind the stub driver (idempotent)."""
    import tvm
    import tvm_ffi

    if "ffi.Module.create.cuda" not in tvm_ffi.registry.list_global_func_names():
        if not _driver_available():
            _load_stub_driver()
        lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
        try:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise RuntimeError(
                f"cannot load TVM's CUDA runtime {lib}: {e} (is the CUDA 13 runtime installed?)"
            ) from e


@functools.cache
def enable() -> None:
    """Make ``tvm.compile`` emit CUDA modules holding nvcc fatbins (idempotent)."""
    import tvm
    import tvm_ffi

    load_cuda_runtime()

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code: str, *_: Any) -> bytes:
        return compile_fatbin(code, str(tvm.target.Target.current().arch))


PDL = "tirx.use_programtic_dependent_launch"  # TVM's launch tag (sic) for programmatic dependent launch


def pdl_around_wait(T, pdl: int, before) -> None:  # noqa: N803
    """Emit into the IR builder ``T`` a kernel's start under programmatic dependent launch (``pdl`` 1 or
    2, a :data:`PDL`-tagged PrimFunc): ``before()`` (work that reads nothing the previous kernel
    writes), the wait for the previous kernel (``griddepcontrol.wait``), and the next kernel let in
    (``griddepcontrol.launch_dependents``) before it all (1) or after the wait (2: one kernel ahead at
    most; with 1, on a grid short of the SMs the kernels after it start too)."""
    if pdl == 1:
        T.evaluate(T.ptx.griddepcontrol.launch_dependents())
    before()
    T.evaluate(T.ptx.griddepcontrol.wait())
    if pdl == 2:
        T.evaluate(T.ptx.griddepcontrol.launch_dependents())


MIN_BLOCKS = "mxgemm.min_blocks"  # a PrimFunc attribute: its kernels' minimum blocks an SM (launch bounds)
ARCH_ATTR = "mxgemm.arch"  # a PrimFunc attribute naming the arch to compile for (``sm_90a`` for wgmma)


def compile_module(mod: Any, target: dict[str, Any]) -> Any:
    """``tvm.compile`` of a scheduled IRModule for a CUDA target; the device code is a fatbin, for the
    target's arch or the one a PrimFunc's :data:`ARCH_ATTR` names (wgmma kernels: ``sm_90a``, while
    the rules and the tune log know the arch as ``sm_90``). A PrimFunc with the :data:`PDL` attribute
    has its kernels launched with programmatic stream serialization, one with :data:`MIN_BLOCKS` has
    them compiled for that many blocks an SM (TVM drops a PrimFunc's attributes when it splits host
    from device code: they are put on the kernels here, as a launch tag and TVM's launch bounds)."""
    import tvm
    from tvm.tirx.build import split_host_device_mods, tir_to_runtime

    enable()
    archs = {str(f.attrs[ARCH_ATTR]) for f in mod.functions.values() if f.attrs and ARCH_ATTR in f.attrs}
    if len(archs) > 1:
        raise ValueError(f"one module, one arch: its functions ask for {sorted(archs)}")
    tgt = tvm.target.Target({**target, "arch": archs.pop()} if archs else target)
    attrs = [f.attrs for f in mod.functions.values() if f.attrs]
    pdl = any(a.get(PDL) for a in attrs)
    min_blocks = max((int(a[MIN_BLOCKS]) for a in attrs if MIN_BLOCKS in a), default=0)
    if not (pdl or min_blocks):
        with tgt:
            return tvm.compile(mod, target=tgt)
    with tgt:  # tvm.tirx.build's steps, with the kernels amended
        tgt = tgt.with_host("llvm") if tgt.host is None else tgt
        mod = tvm.tirx.transform.BindTarget(tgt)(mod)
        pipeline, host_passes, device_passes = tvm.tirx.get_default_tir_pipeline(tgt)
        host, devices = split_host_device_mods(pipeline(mod))
        for dev in devices.values():
            for gv, func in list(dev.functions.items()):
                tags, f = list(func.attrs.get("tirx.kernel_launch_params", [])), func
                if tags and pdl:  # the dynamic shared memory tag must stay last
                    at = len(tags) - (tags[-1] == "tirx.use_dyn_shared_memory")
                    f = f.with_attr("tirx.kernel_launch_params", [*tags[:at], PDL, *tags[at:]])
                if tags and min_blocks:
                    f = f.with_attr("tirx.launch_bounds_min_blocks_per_sm", min_blocks)
                dev[gv] = f
        devices = {t: device_passes()(d) for t, d in devices.items()}
        return tvm.runtime.Executable(tir_to_runtime(host_passes()(host), devices, tgt.host))
