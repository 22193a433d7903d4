"""What the wgmma kernels (:mod:`~mxgemm.codegen.wgmma_mx`, :mod:`~mxgemm.codegen.wgmma_w`) share:
the sm_90a target, shared-memory addresses in a ring of 16-byte elements, the 128-byte swizzle and
its matrix descriptor, guarded statements.

A tile in the 128-byte-swizzled K-major layout holds rows of 128 bytes (K-contiguous), 16-byte chunk
``c`` of row ``r`` at chunk ``c ^ (r % 8)``; 8-row groups are 1024 bytes apart and start 1024-byte
aligned (the swizzle atom). A wgmma reads K from byte ``32 u`` of the rows for its ``u``-th 32-byte
K slice: the descriptor's start moves, the hardware applies the swizzle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tvm import tirx

from mxgemm.codegen.decode import u32
from mxgemm.codegen.nvcc import ARCH_ATTR, PDL

ARCH = "sm_90a"  # wgmma is an sm_90a feature
TARGET = {"kind": "cuda", "arch": ARCH}
SMEM_MAX = 227 * 1024  # dynamic shared memory of one block on sm_90
ROW = 128  # bytes of a swizzled row


def smem_addr(T, ring, at):  # noqa: N803
    """Shared-state address (uint32) of byte ``at`` of ``ring`` (a ``uint32x4`` ``shared.dyn`` buffer),
    through the 16-byte element that holds it: an access TVM sees, so the allocation keeps its size."""
    addr = T.cuda.cvta_generic_to_shared(T.address_of(ring[at // 16]))
    rem = at % 16
    return addr if isinstance(rem, int) and rem == 0 else addr + tirx.Cast("uint32", rem)


def swizzled(row, chunk):
    """Byte offset of 16-byte chunk ``chunk`` (0..7) of ``row`` in a 128-byte-swizzled tile."""
    return row * ROW + tirx.bitwise_xor(chunk, row % 8) * 16


# a descriptor's fields but the start address (bits 0-13, in 16 bytes): leading byte offset 1 (unused),
# stride 1024 bytes (8-row groups), 128-byte swizzle
DESC = (1 << 16) | ((1024 // 16) << 32) | (1 << 62)


def descriptor(T, buf, which: int, start):  # noqa: N803
    """The wgmma matrix descriptor of a 128-byte-swizzled K-major tile from shared address ``start``
    (8-row groups 1024 bytes apart; the leading offset unused, 1), stored in ``buf[which]`` (a local
    uint64 buffer) and returned as its load."""
    addr = tirx.Cast("uint64", (start & u32(0x3FFFF)) >> u32(4))
    T.buffer_store(buf, addr | tirx.const(DESC, "uint64"), [which])
    return tirx.BufferLoad(buf, [which])


def main_args(T, names, bias: bool, pdl: bool = False):  # noqa: N803
    """Open the PrimFunc ``main`` (no aliasing, compiled for :data:`ARCH` even when built for an
    ``sm_90`` target; ``pdl``: its kernels launched with programmatic dependent launch): the dynamic
    row count ``m`` (int64) and the handles of the arguments ``names``, then ``Bias`` (if ``bias``,
    else None), then ``Y``."""
    T.func_name("main")
    attrs = {"global_symbol": "main", "tirx.noalias": True, ARCH_ATTR: ARCH}
    T.func_attr({**attrs, PDL: True} if pdl else attrs)
    handles = [T.arg(name, T.handle()) for name in names]
    bias_h = T.arg("Bias", T.handle()) if bias else None
    return tirx.Var("m", "int64"), handles, bias_h, T.arg("Y", T.handle())


def ring_turn(T, it, stages: int, ahead: int, iters: int, issue) -> None:  # noqa: N803
    """The head of iteration ``it`` of a ``cp.async`` ring run ``ahead`` slots in advance: wait for its
    copies, a block barrier (every thread's copies visible; the slot refilled next is free), refill
    with iteration ``it + ahead`` by ``issue(iteration, slot)``, commit."""
    T.evaluate(T.ptx["cp.async.wait_group"](ahead - 1))
    T.evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))
    with T.If(it + ahead < iters):
        with T.Then():
            issue(it + ahead, (it + ahead) % stages)
    T.evaluate(T.ptx["cp.async.commit_group"]())


# an empty asm that reads and writes 8 fragment registers: the compiler keeps their reads after the
# wgmma.wait_group before it (TVM's noop barrier takes its register by value, so it fences nothing)
FENCE8 = (
    "__device__ __forceinline__ void mxgemm_fence8(float& a, float& b, float& c, float& d, float& e, "
    "float& f, float& g, float& h) {\n"
    '  asm volatile("" : "+f"(a), "+f"(b), "+f"(c), "+f"(d), "+f"(e), "+f"(f), "+f"(g), "+f"(h)'
    ' :: "memory");\n'
    "}\n"
)


def fence_regs(T, regs) -> None:  # noqa: N803
    """Keep the compiler's reads of fragment registers ``regs`` (loads of a local float32 buffer, a
    multiple of 8) after the ``wgmma.wait_group`` that precedes this."""
    for i in range(0, len(regs), 8):
        T.evaluate(T.cuda.func_call("mxgemm_fence8", *regs[i : i + 8], source_code=FENCE8))


# out[0] += a * s in global memory through volatile asm: the compiler cannot keep ``out`` in registers
# across a loop (it does with plain loads and stores to a __restrict__ buffer, and spills them)
FMA_TO = (
    "__device__ __forceinline__ void mxgemm_fma_to(float* out, float a, float s) {\n"
    "  float v;\n"
    '  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(out) : "memory");\n'
    '  asm volatile("st.global.f32 [%0], %1;" :: "l"(out), "f"(fmaf(a, s, v)) : "memory");\n'
    "}\n"
)


def fma_to(T, out, a, s) -> None:  # noqa: N803
    """``out += a * s`` (one fma) for ``out`` a global float32 element (a BufferLoad), kept in memory."""
    T.evaluate(T.cuda.func_call("mxgemm_fma_to", tirx.address_of(out), a, s, source_code=FMA_TO))


# a named barrier of ``n`` threads (a multiple of 32), id ``i`` (0 is ``__syncthreads``'s)
BAR_SYNC = (
    "__device__ __forceinline__ void mxgemm_bar_sync(unsigned i, unsigned n) {\n"
    '  asm volatile("bar.sync %0, %1;" :: "r"(i), "r"(n) : "memory");\n'
    "}\n"
)

# every thread of the cluster arrives, then waits for all: shared-memory writes before it are seen by
# the cluster's reads after it (release / acquire)
CLUSTER_SYNC = (
    "__device__ __forceinline__ void mxgemm_cluster_sync() {\n"
    '  asm volatile("barrier.cluster.arrive.release;\\n\\tbarrier.cluster.wait.acquire;" ::: "memory");\n'
    "}\n"
)

# 4 floats at shared-state address ``addr`` of the cluster's block ``rank`` (``mapa``, then one
# ``ld.shared::cluster.v4``)
DSMEM_LD4 = (
    "__device__ __forceinline__ void mxgemm_dsmem_ld4(float& a, float& b, float& c, float& d, "
    "unsigned addr, unsigned rank) {\n"
    "  unsigned at;\n"
    '  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(at) : "r"(addr), "r"(rank));\n'
    '  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(a), "=f"(b), "=f"(c), '
    '"=f"(d) : "r"(at) : "memory");\n'
    "}\n"
)

ST_SHARED = (
    "__device__ __forceinline__ void mxgemm_st_shared_f32(unsigned addr, float v) {\n"
    '  asm volatile("st.shared.f32 [%0], %1;" :: "r"(addr), "f"(v) : "memory");\n'
    "}\n"
)


def bar_sync(T, i: int, n: int) -> None:  # noqa: N803
    """Named barrier ``i`` of ``n`` threads."""
    T.evaluate(T.cuda.func_call("mxgemm_bar_sync", u32(i), u32(n), source_code=BAR_SYNC))


def cluster_sync(T) -> None:  # noqa: N803
    """A barrier of the whole cluster, ordering shared-memory writes before it and reads after it."""
    T.evaluate(T.cuda.func_call("mxgemm_cluster_sync", source_code=CLUSTER_SYNC))


def dsmem_ld4(T, regs, addr, rank) -> None:  # noqa: N803
    """``regs`` (4 loads of a local float32 buffer) = the 4 floats at shared-state address ``addr``
    (uint32) of the cluster's block ``rank``."""
    T.evaluate(T.cuda.func_call("mxgemm_dsmem_ld4", *regs, addr, rank, source_code=DSMEM_LD4))


def st_shared(T, addr, val) -> None:  # noqa: N803
    """The float32 ``val`` to shared-state address ``addr`` (uint32)."""
    T.evaluate(T.cuda.func_call("mxgemm_st_shared_f32", addr, val, source_code=ST_SHARED))


def when(T, conds, stmt) -> None:  # noqa: N803
    """``stmt`` under the conjunction of ``conds`` (none: unconditionally)."""
    if not conds:
        T.evaluate(stmt)
        return
    cond = conds[0]
    for c in conds[1:]:
        cond = tirx.And(cond, c)
    with T.If(cond):
        with T.Then():
            T.evaluate(stmt)


_kernels: dict[str, Any] = {}
_lock = threading.Lock()


def cached(spec: dict[str, Any], make: Callable[[], Any]):
    """The loaded kernel of ``spec`` (JSON-able: what the kernel is), built by ``make()`` (a PrimFunc)
    into the kernel cache once; a TVM without its compiler (a GPU box that runs prebuilt kernels)
    raises a RuntimeError naming the spec when the cache lacks it."""
    from mxgemm.codegen import build as builder
    from mxgemm.codegen import cache

    spec = {**spec, "target": TARGET, "versions": builder.versions(TARGET)}
    key = repr(sorted(spec.items(), key=lambda kv: kv[0]))
    with _lock:
        if key in _kernels:
            return _kernels[key]

    def build(out: Path) -> dict[str, Any]:
        import tvm

        try:
            func = make()
        except ImportError as e:
            raise RuntimeError(
                f"kernel {spec} is not in the kernel cache, and this TVM cannot build it ({e})"
            ) from e
        return builder.compile_export(tvm.IRModule({"main": func}), TARGET, out)

    path, _ = cache.get_or_build(spec, build)
    func = builder.load_main(path, TARGET)
    with _lock:
        return _kernels.setdefault(key, func)
