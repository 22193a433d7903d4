"""`mxgemm.build`: prim_func → schedule rule → compiled library (LLVM or CUDA via nvcc) → `Kernel`.

CUDA kernels are compiled ahead of time by nvcc into a fatbin (SASS for the arch + PTX), so a kernel
built on a GPU-less machine runs on a GPU machine that has only the TVM runtime.
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import mxgemm
from mxgemm import formats, system
from mxgemm.codegen import cache
from mxgemm.codegen import target as targets
from mxgemm.codegen.shapes import CPU_M_BUCKETS, WIDE_M_BUCKETS, check_shape, dtype_name

M_BUCKETS = (1, 4, 16, 32, 64, 128, 256, *WIDE_M_BUCKETS, None)  # None: no upper bound
OPS = ("linear", "decode")


def m_bucket_for(m: int, target_kind: str) -> int | None:
    """The kernel bucket that serves ``m`` rows: the smallest bucket ≥ m, on CPU of
    :data:`~mxgemm.codegen.shapes.CPU_M_BUCKETS` (static-M kernels, rows padded up to it) and else one
    dynamic-M kernel (None)."""
    buckets = M_BUCKETS if target_kind == "cuda" else (*CPU_M_BUCKETS, None)
    return next(b for b in buckets if b is None or m <= b)


@dataclass(frozen=True)
class KernelSpec:
    """Everything that determines a kernel (the cache key adds the tool versions)."""

    fmt: str
    n: int
    k: int
    m_bucket: int | None
    a_dtype: str
    out_dtype: str
    bias: bool
    block_size: int
    target: dict[str, Any] = field(hash=False)
    rule: str | None = None  # the rule ``hints`` belong to (None: the routing's rule, its defaults)
    hints: dict[str, Any] = field(default_factory=dict, hash=False)  # that rule's hints, as a dict
    op: str = "linear"  # "linear": the decode-fused matmul; "decode": W alone (decode_func)

    def key(self) -> dict[str, Any]:
        return {**asdict(self), "versions": versions(self.target)}


@functools.cache
def _tvm_version() -> str:
    import tvm

    return tvm.__version__


@functools.cache
def _codegen_digest() -> str:
    """Digest of the code that shapes a kernel (codegen + rules; :mod:`~mxgemm.codegen.digest`), so a
    schedule change is a new key and a reworded docstring is not."""
    from mxgemm.codegen import digest

    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("codegen/*.py"), *root.glob("codegen/*.c"), *root.glob("rules/*.py")]
    files += [root / "formats.py", root / "layout.py"]
    return digest.sources(root, sorted(str(f.relative_to(root)) for f in files))


def versions(target: dict[str, Any]) -> dict[str, str | None]:
    """What a kernel of ``target`` depends on besides its spec: mxgemm, the codegen digest, TVM. Not
    the nvcc that compiles it (its version is kept in the entry's metadata): another nvcc makes other
    SASS of the same kernel, so kernels and tune records stay usable on a box with another toolkit,
    or none (a GPU box that runs cached kernels)."""
    del target
    return {"mxgemm": mxgemm.__version__, "codegen": _codegen_digest(), "tvm": _tvm_version()}


class Kernel:
    """A compiled decode-fused matmul.

    Call ``kernel(x, *planes, scales, bias, out)``: ``x`` ``a_dtype [m, k]`` (m within the bucket),
    ``planes`` the uint8 code planes of :func:`mxgemm.layout.to_planes` (one plane, the portable
    ``[n, k*bits/8]`` bytes, for 8/4/2-bit formats), ``scales`` uint8 ``[n, k/block]``, ``bias``
    ``out_dtype [n]`` (only if built with bias), ``out`` ``out_dtype [m, n]``, all contiguous on the
    target's device. An ``op="decode"`` kernel is called ``kernel(*planes, scales, w)`` and writes
    ``w``: ``out_dtype [n, k]`` (CPU: in the K order of :func:`mxgemm.layout.k_permuted`).
    """

    def __init__(self, spec: KernelSpec, path: Path, info: dict[str, Any]):
        self.spec, self.path, self.info = spec, path, info
        self._func = None
        self._lock = threading.Lock()

    @property
    def source(self) -> str:
        """The generated CUDA source (CUDA targets) or LLVM IR (CPU targets)."""
        return self.info["source"]

    @property
    def rule(self) -> str:
        """Name of the schedule rule that produced the kernel."""
        return self.info["rule"]

    def _load(self):
        with self._lock:
            if self._func is None:
                self._func = load_main(self.path, self.spec.target)
        return self._func

    def loaded(self):
        """The library's entry function, loaded on first use: called as the kernel is, one Python call
        fewer."""
        return self._func or self._load()

    def __call__(self, *args: torch.Tensor) -> None:
        (self._func or self._load())(*args)

    def __repr__(self) -> str:
        s = self.spec
        hints = ", ".join(f"{k}={v}" for k, v in self.info.get("hints", {}).items())
        return (
            f"Kernel({s.op} {s.fmt}, n={s.n}, k={s.k}, m_bucket={s.m_bucket}, {s.a_dtype}->{s.out_dtype}, "
            f"bias={s.bias}, block={s.block_size}, {_target_name(s.target)}, rule={self.rule}"
            + (f" [{hints}]" if hints else "")
            + ")"
        )


NO_NVCC = (
    "this CUDA kernel is not in the kernel cache and building it needs nvcc: the CUDA toolkit on PATH, or "
    "NVIDIA's pip wheels (pip install 'mxgemm[cuda]'); "
    "cached kernels run without it, and CPU kernels never need it; or set MXGEMM_BACKEND=emulated "
    "(dequantize + F.linear, no generated kernels: slow)"
)


def _target_name(target: dict[str, Any]) -> str:
    return f"{target['kind']}:{target.get('arch') or target.get('mcpu')}"


def load_main(path: Path, target: dict[str, Any]):
    """The ``main`` function of the library at ``path``, built for ``target`` (CUDA: TVM's CUDA
    runtime loaded first; CPU: TVM's thread pool set up as :func:`mxgemm.system.cpu_threads` says)."""
    import tvm

    if targets.is_cuda(target):
        from mxgemm.codegen import nvcc

        nvcc.load_cuda_runtime()
    else:
        system.cpu_threads()
    return tvm.runtime.load_module(str(path))["main"]


def launch(kernel, args: list[torch.Tensor]) -> None:
    """Run ``kernel(*args)`` on the tensors' device (CUDA: on that device's current torch stream, which
    tvm-ffi reads from the torch tensors it is given; the device is made current only when it is not)."""
    dev = args[0].device
    if dev.type == "cuda" and dev.index != torch.cuda.current_device():
        with torch.cuda.device(dev):
            kernel(*args)
    else:
        kernel(*args)


def compile_export(mod: Any, target: dict[str, Any], out: Path) -> dict[str, Any]:
    """Compile the scheduled IRModule ``mod`` for ``target`` (CUDA: nvcc) and export it to ``out``;
    returns metadata (source, and the nvcc that built a CUDA library)."""
    import tvm

    from mxgemm.codegen.nvcc import compile_module

    extra = {}
    if targets.is_cuda(target):
        if system.nvcc_version() is None:
            raise RuntimeError(NO_NVCC)
        ex = compile_module(mod, target)
        source = ex.mod.imports[0].inspect_source("cuda")
        extra["nvcc"] = system.nvcc_version()
    else:
        ex = tvm.compile(mod, target=target)
        source = ex.mod.inspect_source("ll")
    ex.export_library(str(out))
    return {"source": source, **extra}


def _compile(spec: KernelSpec, out: Path) -> dict[str, Any]:
    """Schedule, compile and export ``spec`` to ``out``; returns metadata (rule, hints, source).
    RuntimeError naming the kernel where this TVM cannot compile (a runtime-only install, as carried
    to a GPU box with prebuilt kernels)."""
    if not system.tvm_can_compile():
        name = Kernel(spec, out, {"rule": spec.rule or "default", "hints": spec.hints})
        raise RuntimeError(
            f"{name!r} is not in the kernel cache ({cache.cache_dir()}) and this TVM cannot compile it "
            "(a runtime-only install, without libtvm_compiler): build it where the full apache-tvm is "
            "installed, from the same sources and tune logs (`mxgemm bench --build-only`, `mxgemm tune "
            "--build-only`, `python -m tests.prebuild_gpu`), and point $MXGEMM_CACHE_DIR at that cache"
        )
    rule, mod, hints = schedule(spec)
    info = compile_export(mod, spec.target, out)
    return {"rule": rule, "hints": hints.to_dict() if hints is not None else {}, **info}


def schedule(spec: KernelSpec):
    """The :class:`~mxgemm.rules.base.Scheduled` kernel of ``spec`` (rule, IRModule, hints), not
    compiled: its ``hints`` of rule ``rule`` first, else the routed rule's defaults
    (:func:`mxgemm.rules.schedule`)."""
    from mxgemm import rules
    from mxgemm.codegen.prim_func import decode_func, prim_func

    def make(decode_dtype: str | None):
        if spec.op == "decode":
            return decode_func(spec.fmt, n=spec.n, k=spec.k, dtype=spec.out_dtype, block_size=spec.block_size)
        return prim_func(
            spec.fmt,
            n=spec.n,
            k=spec.k,
            m=1 if spec.m_bucket == 1 else None,
            a_dtype=spec.a_dtype,
            out_dtype=spec.out_dtype,
            bias=spec.bias,
            block_size=spec.block_size,
            decode_dtype=decode_dtype,
        )

    return rules.schedule(spec, make, spec.hints or None, spec.rule)


_loaded: dict[str, Kernel] = {}
_loaded_lock = threading.Lock()


def build(
    fmt: str | formats.Format,
    *,
    n: int,
    k: int,
    m_bucket: int | None = None,
    a_dtype: str | torch.dtype = "float16",
    target: str | dict[str, Any] = "llvm",
    out_dtype: str | torch.dtype | None = None,
    bias: bool = False,
    block_size: int | None = None,
    op: str = "linear",
    hints: Any = None,
    rule: str | None = None,
) -> Kernel:
    """Build (or fetch from the cache) the kernel for one layer shape and M bucket.

    Args:
        fmt: weight format name. n, k: output / input features (k a multiple of the block size).
        m_bucket: rows served: 1, 4, 16, 32, 64, 128, 256, 384 ... 1024 (128-row steps), 2048, 4096
            or None (any M). CPU kernels: 1 or 4 (the GEMV, exactly that many rows) or any M.
        a_dtype, out_dtype: ``"float16"`` or ``"bfloat16"`` (or the torch dtypes); out defaults to a_dtype.
        target: ``"llvm"``, ``"cuda"`` (arch of the current GPU), ``"sm_80"``/``"sm_90"``, or a dict.
        bias: add a ``[n]`` bias in the epilogue. block_size: elements per scale (default 32).
        op: ``"linear"`` (the decode-fused matmul) or ``"decode"`` (W alone, ``out_dtype [n, k]``,
            ``out_dtype`` a_dtype or, on CPU, ``"float32"``; no M bucket or bias; CPU kernels write
            it in the K order of :func:`mxgemm.layout.k_permuted`).
        hints: schedule hints (tuning): a rule's ``Hints`` object (``mxgemm.rules.mma.Hints(...)``),
            or a dict of them with ``rule`` naming their rule; None: the tune logs' hints for this
            shape, else the routed rule's defaults.
        rule: the rule (``mxgemm.rules.RULES``) that dict ``hints`` belong to.
    """
    f = formats.get(fmt)
    bs = formats.check_block_size(block_size, f)
    tgt = targets.resolve(target)
    a = dtype_name(a_dtype, "a_dtype")
    wide = ("float32",) if op == "decode" and not targets.is_cuda(tgt) else ()  # a CPU decode may write fp32
    o = dtype_name(out_dtype, "out_dtype", wide) if out_dtype is not None else a
    if m_bucket not in M_BUCKETS:
        raise ValueError(f"m_bucket must be one of {M_BUCKETS}, got {m_bucket!r}")
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if op == "decode" or not (targets.is_cuda(tgt) or m_bucket in CPU_M_BUCKETS):
        m_bucket = None  # CPU kernels: the few-row GEMV's static buckets, else one dynamic-M kernel
    if op == "decode" and (bias or o not in (a, "float32")):
        raise ValueError(
            "op='decode' writes W in a_dtype (or float32 on CPU): it takes no bias and no other out_dtype"
        )
    check_shape(n, k, bs)
    rule, hints = _typed(hints, rule)
    if hints is None and op == "linear":
        rule, hints = tuned_hints(f.name, n, k, m_bucket, a, tgt, bs) or (None, None)
    spec = KernelSpec(f.name, n, k, m_bucket, a, o, bias, bs, tgt, rule, dict(hints or {}), op)
    skey = json.dumps(spec.key(), sort_keys=True, default=str)
    with _loaded_lock:
        kernel = _loaded.get(skey)
    if kernel is None:
        path, info = cache.get_or_build(spec.key(), lambda p: _compile(spec, p))
        kernel = Kernel(spec, path, info)
        with _loaded_lock:
            kernel = _loaded.setdefault(skey, kernel)
    return kernel


def arch_name(target: dict[str, Any]) -> str:
    """The tune-log name of a target: ``sm_90`` or ``llvm-<cpu>``."""
    return target["arch"] if targets.is_cuda(target) else f"llvm-{target.get('mcpu') or 'generic'}"


def tuned_hints(
    fmt: str,
    n: int,
    k: int,
    m_bucket: int | None,
    a_dtype: str,
    target: dict[str, Any],
    block_size: int,
    borrow: bool = True,
) -> tuple[str, dict[str, Any]] | None:
    """(rule, hints) of the tune-log record (shipped log, then the user's) for this layer shape and
    bucket and block size, built with the current versions; for a shape the logs lack (``borrow``),
    the record of the nearest shape, its hints fitted to this one (:func:`mxgemm.nearest.borrowed`);
    None when there is neither (the rule's defaults apply)."""
    from mxgemm import tunelog

    key = tunelog.Key(fmt, n, k, m_bucket, a_dtype, arch_name(target), block_size=block_size).key()
    rec = tunelog.lookup(key, versions(target))
    if rec is None and borrow:
        from mxgemm import nearest

        spec = KernelSpec(fmt, n, k, m_bucket, a_dtype, a_dtype, False, block_size, target)
        rec = nearest.borrowed(key, spec, versions(target))
    return _typed(dict(rec.config), rec.rule) if rec is not None else None


def _typed(hints: Any, rule: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """(rule, hints as a dict) from a rule's ``Hints`` object, or a dict with the rule named; the dict
    of every field (a record or dict that leaves out a field added since is the same kernel, the
    same cache entry, as one with its default)."""
    if hints is None:
        return rule, None
    from mxgemm import rules

    if isinstance(hints, dict):
        if rule is None:
            raise ValueError(
                "hints given as a dict need rule= (the rule they belong to); or pass the rule's Hints"
            )
        r = rules.get(rule)
        return rule, (r.typed(hints).to_dict() if r.Hints is not None else hints)
    name = rules.name_of(hints)
    if rule is not None and rule != name:
        raise ValueError(f"hints {hints!r} belong to rule {name!r}, not {rule!r}")
    return name, hints.to_dict()
