"""`mxgemm.linear`: ``y = x @ W.T (+ bias)`` with W an `MxWeight`, on the generated kernels.

Registered as the torch custom op ``mxgemm::linear`` (with a fake implementation), so it traces under
torch.compile without graph breaks. CPU tensors run the LLVM kernel; CUDA tensors run the CUDA kernel
for the device's arch on the current torch stream. ``$MXGEMM_BACKEND=emulated`` runs no generated
kernel at all: W is dequantized by the torch reference and multiplied by ``F.linear`` in fp32 (slow;
for debugging, and for machines that can neither compile nor find a cached kernel).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable

import torch

from mxgemm import formats, layout, tunelog
from mxgemm.codegen import build as builder
from mxgemm.codegen import target as targets
from mxgemm.codegen.shapes import WIDE_M_BUCKETS
from mxgemm.config import A_DTYPES
from mxgemm.weight import MxWeight

ACT_DTYPES = tuple(A_DTYPES.values())
_DTYPE_NAMES = {v: k for k, v in A_DTYPES.items()}  # torch.float16 -> "float16"
FP16_MAX = 65504.0
DECODE_ABOVE = 4  # CUDA, more rows than this: decode W in 16 bits, then cuBLAS (see `plan`)
# CUDA M buckets where decode + cuBLAS competes with the fused kernel and the tune log decides (a
# record of rule DECODE_RULE: decode + cuBLAS measured fastest); from 128 rows: fused only where a record
# says so
WIDE = WIDE_M_BUCKETS  # 257-4096 rows: decode + cuBLAS unless a fused record wins
DECIDED_BUCKETS, FUSED_IF_TUNED = (32, 64, 128, 256, *WIDE), (128, 256, *WIDE)
# CUDA buckets that run as the next one does (its record, or its route) where the tune log has no record
# of their own: 17-32 rows on the 64-row bucket's kernel, as before the 32-row bucket was tuned
BORROWS = {32: 64}
DECODE_RULE = tunelog.DECODE_RULE  # the rule of the standalone decode kernel
CPU_FUSED_UP_TO = 4  # CPU, up to this many rows: the few-row GEMV (cpu_gemv), where it tiles the shape
CPU_CHUNK_MB = 4.0  # CPU: MB of decoded weights per chunk (L2/L3-resident when the GEMM reads them)
BACKEND_ENV = "MXGEMM_BACKEND"
SPLIT_ENV = "MXGEMM_SPLIT_M"  # "0": never split a call's rows between two kernels (see `row_parts`)
BACKENDS = ("kernels", "emulated")  # the generated kernels (default); dequantize + F.linear
# $MXGEMM_BACKEND as a call reads it: os.environ's own bytes (POSIX; os.environ.get encodes the name and
# decodes the value, which costs more than the rest of a call's key), else os.environ
_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None
_BACKEND_KEY = os.environ.encodekey(BACKEND_ENV) if _ENVIRON is not None else BACKEND_ENV


def decode_chunk_rows(n: int, k: int, default_mb: float = 0.0, row_bytes: int | None = None) -> int:
    """Rows of W decoded per step on the decode + cuBLAS path: all of them (default), or, with
    ``$MXGEMM_DECODE_CHUNK_MB`` set, about that many MB of 16-bit weights at a time, which caps the
    temporary buffer (a multiple of 64 rows that divides ``n``, for aligned slices; else all of ``n``).
    Chunks the size of L2 were meant to keep W out of HBM in 16 bits but measured slower on an H100
    (the extra launches and narrower GEMMs cost more: ``benchmarks/README.md``). The CPU path passes
    its own default (:data:`CPU_CHUNK_MB`) and the bytes of one decoded row."""
    mb = float(os.environ.get("MXGEMM_DECODE_CHUNK_MB", default_mb))
    target = int(mb * (1 << 20)) // (row_bytes or 2 * k)
    if target <= 0 or n <= target:
        return n
    rows = next((r for r in range(target - target % 64, 0, -64) if n % r == 0), 0)
    return rows if rows * 4 >= target else n


@functools.lru_cache(maxsize=4096)  # on the forward path: decided once per layer shape and M
def plan(
    m: int, arch: str, fmt: str, n: int, k: int, a_dtype: str, block_size: int | None = None
) -> tuple[str, int | None]:
    """How ``m`` rows of an ``[n, k]`` ``fmt`` weight run on ``arch`` (``"llvm"``, or a CUDA arch such
    as ``"sm_90"``): ``("linear", bucket)``, the decode-fused kernel of that M bucket, or
    ``("decode", None)``: W decoded by a generated kernel, then cuBLAS (CUDA, 16 bits) or torch's GEMM
    (CPU, in row chunks; :func:`_decode_then_gemm_cpu`). CPU: on x86 CPUs with AVX-512 (bf16 dot
    products for bf16 rows where the CPU has AVX512-BF16, else fp32 multiply-adds) the decode-fused
    ``cpu_dot`` GEMM runs at every M where it applies (2-core Zen 5, bf16, weights from DRAM,
    4096² mxfp4, µs: 1 row 213 against the GEMV's 534, 4 rows 342 against 738, 16 rows 800 against
    4600 decoded, 64 rows 2650 against 5800; on 576×576 17 against 16 at 1 row, 23 against 31 at 4);
    else the few-row GEMV (``cpu_gemv``, buckets 1 and 4, rows padded up to the bucket) up to
    :data:`CPU_FUSED_UP_TO` rows where it tiles the shape; else from 2 rows the decode, where its K
    groups tile K; else the fused dynamic-M kernel. (2-core
    Zen 5, 4096² mxfp4, bf16: 2 rows 9.5 ms dynamic-M, 3.5 decoded, 1.0 GEMV; a 16-row GEMV bucket
    took 7.2 ms against 2.2 decoded: it streams the 16 rows of activations from L2 once per output.)
    CUDA, asking the rules (:mod:`mxgemm.rules`) which apply, by what measured fastest on an H100
    (``benchmarks/README.md``): ``mma`` wherever it applies (fp16 or bf16, up to 256 rows; past 16 rows
    with the activations in its ring); else the small-M rules up to ``DECODE_ABOVE`` rows (up to 2 for
    sub-byte codes when ``tensorcore`` applies: it wins from 3 rows there); ``tensorcore`` up to 64
    rows; decode + cuBLAS beyond. A bucket of :data:`BORROWS` without a record of its own runs as the
    next bucket does. In the buckets :data:`DECIDED_BUCKETS` the tune log decides: a
    :data:`DECODE_RULE` record (decode + cuBLAS timed faster than every fused candidate) routes to the
    decode, a record of a fused rule to that kernel (``wgmma_w`` runs only so), and the buckets from 128
    rows up (:data:`WIDE` past 256) run fused only where such a record says so."""
    from mxgemm import rules
    from mxgemm.layout import plane_widths
    from mxgemm.rules.tensorcore import M_TILES as TC_TILES

    cuda = arch.startswith("sm_")
    bucket = builder.m_bucket_for(m, "cuda" if cuda else "llvm")
    f = formats.get(fmt)
    tgt = targets.cuda(arch) if cuda else targets.cpu()

    def spec(b: int | None) -> builder.KernelSpec:
        return builder.KernelSpec(fmt, n, k, b, a_dtype, a_dtype, False, block_size or f.block_size, tgt)

    if not cuda:
        if rules.get("cpu_dot").applies(spec(None)):
            return "linear", None
        if m <= CPU_FUSED_UP_TO and rules.get("cpu_gemv").applies(spec(bucket)):
            return "linear", bucket
        group, _, _ = layout.cpu_group(f.bits, block_size or f.block_size)
        return ("decode", None) if m >= 2 and k % group == 0 else ("linear", 1 if m == 1 else None)
    if m == 1:
        return "linear", bucket

    bucket = _runs_as(fmt, n, k, bucket, a_dtype, arch, block_size)
    if bucket in DECIDED_BUCKETS:
        rec = builder.tuned_hints(fmt, n, k, bucket, a_dtype, tgt, block_size or f.block_size)
        if (rec[0] if rec else None) == DECODE_RULE or (rec is None and bucket in FUSED_IF_TUNED):
            return "decode", None
        if rec is not None:  # a fused rule measured fastest (the router may not pick it untuned)
            return "linear", bucket
    if rules.get("mma").applies(spec(bucket)):
        return "linear", bucket
    tc_bucket = next((b for b in TC_TILES if m <= b), None)
    tc = tc_bucket is not None and rules.get("tensorcore").applies(spec(tc_bucket))
    if m <= (DECODE_ABOVE if plane_widths(f.bits)[0] == 8 or not tc else 2):
        return "linear", bucket
    return ("linear", tc_bucket) if tc else ("decode", None)


@functools.lru_cache(maxsize=4096)
def row_parts(
    m: int, arch: str, fmt: str, n: int, k: int, a_dtype: str, block_size: int | None = None
) -> tuple[int, ...]:
    """The runs of consecutive rows that a call of ``m`` rows is cut into, each run by its own
    :func:`plan`: ``(m,)``, or on CUDA past 256 rows (:data:`WIDE`) ``(h, m - h)``, where the tune
    log's times say the first ``h`` rows (a whole bucket: 256, 384, … rows, below ``m``'s) on their
    kernel plus the rest on theirs take less than ``m``'s bucket does. A bucket's fused kernel computes
    its part-filled M tiles whole (320 rows on 256-row tiles: 512 rows' work) and decode + cuBLAS writes
    W in 16 bits first; a split reads the 4-8-bit weights twice instead. The times are the records' µs,
    all of one GPU, each at its bucket's last row: an upper bound for the tail, and for ``m`` on a fused
    record, whose tiles cost the same part-filled; a :data:`DECODE_RULE` record's is scaled by ``m`` over
    its bucket, a lower bound (cuBLAS's share shrinks with the rows, the decode's does not). Without a
    record for each bucket involved, no split. (H100, mxfp4, 6 shapes × 257–1024 rows, fp16 and bf16:
    within 0.3% of the better of split and unsplit in each cell, summed; splitting wherever the records'
    unscaled times said so: 1.2%; never: 11.5%.)"""
    bucket = builder.m_bucket_for(m, "cuda")
    if not arch.startswith("sm_") or bucket not in WIDE:
        return (m,)
    whole = _bucket_record(fmt, n, k, bucket, a_dtype, arch, block_size)
    if whole is None:
        return (m,)
    best, parts = whole.us * (m / bucket if whole.rule == DECODE_RULE else 1), (m,)
    for h in (b for b in (256, *WIDE) if b < bucket):
        head = _bucket_record(fmt, n, k, h, a_dtype, arch, block_size)
        rest = _runs_as(fmt, n, k, builder.m_bucket_for(m - h, "cuda"), a_dtype, arch, block_size)
        tail = _bucket_record(fmt, n, k, rest, a_dtype, arch, block_size)
        if head is None or tail is None or {head.gpu, tail.gpu} != {whole.gpu}:
            continue
        if head.us + tail.us < best:
            best, parts = head.us + tail.us, (h, m - h)
    return parts


@functools.lru_cache(maxsize=4096)
def _bucket_record(fmt: str, n: int, k: int, bucket: int, a_dtype: str, arch: str, block_size: int | None):
    """The tune log's record of a CUDA M bucket (`mxgemm.tunelog.lookup`), or None."""
    key = tunelog.Key(fmt, n, k, bucket, a_dtype, arch, block_size=block_size or 0).key()
    return tunelog.lookup(key, builder.versions(targets.cuda(arch)))


def _runs_as(fmt: str, n: int, k: int, bucket: int | None, a_dtype: str, arch: str, block_size: int | None):
    """The CUDA M bucket whose kernel serves ``bucket``: itself, or for a bucket of :data:`BORROWS`
    without a tune record of its own, the bucket it borrows, unless only ``bucket`` has a record of
    another shape to take (`mxgemm.nearest.borrowed`; looked up afresh: callers cache)."""
    if bucket not in BORROWS:
        return bucket
    block, tgt = block_size or formats.get(fmt).block_size, targets.cuda(arch)
    hints = lambda b, lend: builder.tuned_hints(fmt, n, k, b, a_dtype, tgt, block, borrow=lend)  # noqa: E731
    if hints(bucket, False) is not None:
        return bucket
    lent = hints(BORROWS[bucket], False) is None and hints(bucket, True) is not None
    return bucket if lent else BORROWS[bucket]


def build_args_all(m: int, **layer) -> list[dict]:
    """:func:`build_args` of every kernel that ``m`` rows of ``layer`` run: one, or one for each run of
    rows where :func:`row_parts` splits them (``$MXGEMM_SPLIT_M=0``: never)."""
    arch = targets.arch_of(targets.resolve(layer.get("target", "llvm")))
    a_dtype = layer.get("a_dtype", "float16")
    parts = _parts(m, arch, layer["fmt"], layer["n"], layer["k"], a_dtype, layer.get("block_size"))
    return [build_args(rows, **layer) for rows in parts]


def _parts(m: int, arch: str, fmt: str, n: int, k: int, a_dtype: str, block_size: int | None) -> tuple:
    if os.environ.get(SPLIT_ENV) == "0":
        return (m,)
    return row_parts(m, arch, fmt, n, k, a_dtype, block_size)


def build_args(m: int, **layer) -> dict:
    """The `mxgemm.build` keyword arguments of the kernel that serves ``m`` rows of ``layer`` (fmt, n,
    k, a_dtype, bias, block_size, target: ``"llvm"`` by default): for ahead-of-time builds."""
    arch = targets.arch_of(targets.resolve(layer.get("target", "llvm")))
    a_dtype = layer.get("a_dtype", "float16")
    op, bucket = plan(m, arch, layer["fmt"], layer["n"], layer["k"], a_dtype, layer.get("block_size"))
    if op == "decode" and arch == "llvm":
        out = cpu_gemm_dtype(A_DTYPES[a_dtype])
        rows = decode_chunk_rows(layer["n"], layer["k"], CPU_CHUNK_MB, layer["k"] * out.itemsize)
        return {**layer, "n": rows, "op": op, "bias": False, "m_bucket": None, "out_dtype": out}
    if op == "decode":
        rows = decode_chunk_rows(layer["n"], layer["k"])
        return {**layer, "n": rows, "op": op, "bias": False, "m_bucket": None}
    return {**layer, "m_bucket": bucket}


def _memo(t: torch.Tensor, name: str, version: tuple[int, ...], compute):
    """``compute()`` cached on tensor ``t`` itself (dies with it) and redone when ``version`` changes.
    (A WeakKeyDictionary would compare tensors with ``==`` on a hash collision.)"""
    seen = getattr(t, name, None)
    if seen is None or seen[0] != version:
        seen = (version, compute())
        setattr(t, name, seen)
    return seen[1]


def check_fp16_range(q: MxWeight) -> None:
    """Raise ValueError if ``q`` decodes to values beyond float16's range (it then needs bfloat16)."""
    from mxgemm.reference import dequantize

    wmax = dequantize(q).abs().nan_to_num(0.0).max().item() if q.blocks.numel() else 0.0
    if wmax > FP16_MAX:
        raise ValueError(
            f"{q.fmt} weight {list(q.shape)} decodes to values beyond float16's range "
            f"(max |W| = {wmax:.3g} > {FP16_MAX}); use bfloat16 activations"
        )


def _check_fp16_once(
    planes: list[torch.Tensor], scales: torch.Tensor, fmt: str, block_size: int, n: int, k: int
):
    """:func:`check_fp16_range`, done once per weight: memoized on the first code plane, keyed by
    everything the result depends on (each plane and the scales, by identity and version, and the
    format), so a new weight that shares a tensor with a checked one is checked again. A weight not
    yet checked while a CUDA graph is being captured is let through (the check syncs the host)."""
    p0 = planes[0]
    key = (fmt, block_size, id(scales), scales.data_ptr(), scales._version, p0.data_ptr(), p0._version)
    if len(planes) > 1:
        key += tuple((id(t), t.data_ptr(), t._version) for t in planes[1:])
    if getattr(p0, "_mxgemm_fp16_ok", None) == key:  # on the forward path: one tuple compare
        return
    if p0.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    blocks = layout.from_planes(planes, formats.get(fmt).bits)
    check_fp16_range(MxWeight(blocks, scales, fmt, block_size, (n, k)))
    p0._mxgemm_fp16_ok = key


def _planes(blocks: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """The kernel layout of ``blocks`` (transform_weight), derived once per weight version."""
    if len(layout.plane_widths(bits)) == 1:
        return [blocks]
    return _memo(blocks, "_mxgemm_planes", (blocks._version,), lambda: layout.to_planes(blocks, bits))


def _cpu_planes(planes: list[torch.Tensor], fmt: str) -> list[torch.Tensor]:
    """The CPU kernels' codes (:func:`mxgemm.layout.cpu_planes`) of ``planes`` (the kernel layout): the
    same tensors for 8/4/2/1-bit codes, else one byte a code, derived once per weight version."""
    bits = formats.get(fmt).bits
    if len(planes) == 1:
        return planes
    key = tuple((id(t), t.data_ptr(), t._version) for t in planes)
    return _memo(
        planes[0], "_mxgemm_cpu_codes", key, lambda: layout.cpu_planes(layout.from_planes(planes, bits), bits)
    )


def _pair_tiles(
    planes: list[torch.Tensor], scales: torch.Tensor, fmt: str, block_size: int
) -> list[torch.Tensor]:
    """The ``cpu_dot`` kernel's codes and scales (:func:`mxgemm.layout.pair_tiles`,
    :func:`mxgemm.layout.scale_tiles`) of ``planes`` and ``scales``, derived once per weight version: a
    second copy of the codes beside the held planes (the one-byte-a-code codes it is made from are
    not kept: they would be a third)."""
    bits = formats.get(fmt).bits
    key = tuple((id(t), t.data_ptr(), t._version) for t in (*planes, scales))

    def tiles() -> list[torch.Tensor]:
        codes = layout.cpu_planes(layout.from_planes(planes, bits), bits)[0]
        return [layout.pair_tiles(codes, bits), layout.scale_tiles(scales, block_size)]

    return _memo(planes[0], "_mxgemm_pair_tiles", key, tiles)


_kernels: dict[tuple, builder.Kernel] = {}


def _kernel(
    device: torch.device,
    fmt: str,
    n: int,
    k: int,
    m_bucket: int | None,
    dtype: torch.dtype,
    bias: bool,
    block_size: int,
    op: str = "linear",
    out_dtype: torch.dtype | None = None,
) -> builder.Kernel:
    """The kernel for ``device`` (its arch, or this CPU), looked up once per process and shape: the
    forward path skips target resolution and cache-key hashing after the first call."""
    key = (device, fmt, n, k, m_bucket, dtype, bias, block_size, op, out_dtype)
    if key not in _kernels:
        _kernels[key] = builder.build(
            fmt,
            n=n,
            k=k,
            m_bucket=m_bucket,
            a_dtype=dtype,
            target=targets.for_device(device),
            bias=bias,
            block_size=block_size,
            op=op,
            out_dtype=out_dtype,
        )
    return _kernels[key]


def _forward(
    x: torch.Tensor,
    planes: list[torch.Tensor],
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    fmt: str,
    block_size: int,
    n: int,
    k: int,
) -> torch.Tensor:
    """``x @ W.T (+ bias)``. x: fp16/bf16 ``[..., k]``; planes: the code planes of W in the kernel
    layout (uint8 ``[n, k*w/8]`` each, :func:`mxgemm.layout.to_planes`); scales: uint8 ``[n, k/block]``;
    bias: ``x.dtype [n]`` or None. Returns ``x.dtype [..., n]``. The body of the custom op
    ``mxgemm::linear``, and what eager calls run without it (:func:`dispatch`)."""
    if n == 0 or k == 0:  # an empty product (as F.linear): no kernel to build
        y = x.new_zeros(*x.shape[:-1], n)
        return y if bias is None else y + bias
    flat = x.dim() == 2
    x2 = x if flat and x.is_contiguous() else x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    if m == 0:
        return x.new_empty(*x.shape[:-1], n)
    if x.dtype is torch.float16:
        _check_fp16_once(planes, scales, fmt, block_size, n, k)
    key = _signature(m, x, fmt, n, k, bias is not None, block_size, _backend_env())
    run = _launchers.get(key)
    if run is None:
        run = _launchers[key] = _launcher(key)
    out = run(x2, planes, scales, bias)
    return out if flat else out.reshape(*x.shape[:-1], n)


def _signature(m: int, x: torch.Tensor, fmt: str, n: int, k: int, bias: bool, block_size: int, env) -> tuple:
    """The key of a call of ``m`` rows of ``x``'s device and dtype in :data:`_routes` and
    :data:`_launchers` (``env``: :func:`_backend_env`)."""
    return (m, x.device, x.dtype, fmt, n, k, bias, block_size, env)


def _backend_env() -> str | bytes | None:
    """``$MXGEMM_BACKEND`` as a call reads it (:data:`_ENVIRON`'s bytes where it can)."""
    return _ENVIRON.get(_BACKEND_KEY) if _ENVIRON is not None else os.environ.get(BACKEND_ENV)


def hot_path(
    x: torch.Tensor,
    held: dict[str, torch.Tensor],
    plane_names: list[str],
    bias_name: str | None,
    fmt: str,
    block_size: int,
    n: int,
    k: int,
) -> Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor | None] | None:
    """After an eager call ``_forward(x, planes, scales, bias, ...)`` of a layer whose tensors are
    ``held`` (name → tensor: the code planes ``plane_names``, ``"weight_scales"`` and ``bias_name``'s
    bias, as the layer's buffers dict holds them): a function ``hot(x, buffers) -> y or None`` that
    repeats such calls (``x`` of this shape, dtype and device, contiguous) on the same route with only
    the checks whose outcome can change between them: the tensors still ``buffers``'s and unmodified
    (so the fp16 range check still holds), ``$MXGEMM_BACKEND`` and the kernels unchanged
    (:func:`clear_kernels`), and an eager call (:func:`_eager`). It returns None where one fails: the
    caller then takes the full path. None where this call is not such an eager call, or ran under
    CUDA-graph capture (where the fp16 range check of a weight not yet checked is deferred)."""
    if not (_eager(x) and x.is_contiguous() and n and k and x.numel()):
        return None
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    m, shape, dtype, index, env, epoch = (
        x.numel() // k,
        x.shape,
        x.dtype,
        x.get_device(),
        _backend_env(),
        _epoch[0],
    )
    run = _launchers.get(_signature(m, x, fmt, n, k, bias_name is not None, block_size, env))
    if run is None:
        return None
    planes, scales = [held[p] for p in plane_names], held["weight_scales"]
    bias = None if bias_name is None else held[bias_name]
    state = [(name, t, t._version) for name, t in held.items()]
    out_shape = (*shape[:-1], n)
    flat = x.dim() == 2
    if getattr(run, "takes_like", False):  # a CUDA kernel's launcher: its output made like a template
        run = functools.partial(run, like=_like(m, n, dtype, x.device))

    def hot(x: torch.Tensor, buffers: dict[str, torch.Tensor]) -> torch.Tensor | None:
        if (
            x.dtype is not dtype
            or x.get_device() != index
            or not x.is_contiguous()
            or _epoch[0] != epoch
            or _backend_env() != env
            or not _eager(x)
        ):
            return None
        for name, t, version in state:
            if buffers.get(name) is not t or t._version != version:
                return None
        y = run(x if flat else x.view(m, k), planes, scales, bias)
        return y if flat else y.view(out_shape)

    return hot


def _launcher(key: tuple):
    """The function ``(x2, planes, scales, bias) -> out`` that runs a call of signature ``key`` (as
    :data:`_routes`'s) on its route: for one fused CUDA kernel, an output allocated and the kernel
    launched, nothing else on the way (an eager call's host time: ``benchmarks/README.md``; the
    device switch of :func:`mxgemm.codegen.build.launch`, with the index read once here), else
    :func:`_run_route`."""
    route = _routes[key] if key in _routes else _routes.setdefault(key, _route(*key))
    m, dev, dtype, fmt, n, k, _, block_size, _ = key
    if dev.type != "cuda" or not isinstance(route, builder.Kernel):
        return functools.partial(_run_route, route, fmt=fmt, block_size=block_size, n=n, k=k)
    index, kernel, current = dev.index, route.loaded(), torch._C._cuda_getDevice

    def run(x2, planes, scales, bias, like=None):
        out = torch.empty((m, n), dtype=dtype, device=dev) if like is None else torch.empty_like(like)
        args = (x2, *planes, scales, out) if bias is None else (x2, *planes, scales, bias.contiguous(), out)
        if current() == index:
            kernel(*args)
        else:
            with torch.cuda.device(index):
                kernel(*args)
        return out

    run.takes_like = True
    return run


def _like(m: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-element tensor of ``dtype`` on ``device`` (one per pair, made at its first call) expanded to
    ``[m, n]``: ``torch.empty_like`` of it is a contiguous ``[m, n]`` tensor with no size, dtype or
    device arguments to parse (1.8-1.9 against 3.2-3.9 us a call for ``torch.empty`` on an H200's
    host). Made by :func:`hot_path` in an eager call, never under CUDA-graph capture (nor, so, in a
    graph's memory pool)."""
    one = _ones.get((device, dtype))
    if one is None:
        one = _ones[device, dtype] = torch.empty((1, 1), dtype=dtype, device=device)
    return one.expand(m, n)


def _run_route(route, x2, planes, scales, bias, *, fmt, block_size, n, k) -> torch.Tensor:
    """``x2 @ W.T (+ bias)`` on ``route`` (:func:`_route`): any kernel, the decode, a row split or the
    emulation; ``[m, n]``, ``m`` the rows of ``x2``. Arguments as :func:`_forward`'s."""
    m = x2.shape[0]
    pad = (route.spec.m_bucket or m) - m if isinstance(route, builder.Kernel) and not x2.is_cuda else 0
    if pad:  # a CPU static-M kernel: zero rows up to its bucket
        x2 = torch.cat([x2, x2.new_zeros(pad, k)])
    if route is _EMULATED:
        return _emulated(x2, planes, scales, bias, fmt, block_size, n, k)
    if type(route) is tuple:  # the rows split between kernels (`row_parts`), each writing its own
        out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
        for r0, r1, part in route:
            _run(part, x2[r0:r1], planes, scales, bias, fmt, block_size, n, k, out[r0:r1])
        return out
    out = _run(route, x2, planes, scales, bias, fmt, block_size, n, k)
    return out[:m] if pad else out


def _run(kernel, x2, planes, scales, bias, fmt, block_size, n, k, out=None) -> torch.Tensor:
    """``x2 @ W.T (+ bias)`` on one route's ``kernel`` (None: decode, then cuBLAS or torch's CPU GEMM),
    into ``out`` (``x2.dtype [rows of x2, n]``, e.g. a slice of a split call's output) or a new tensor;
    returns it. Arguments as :func:`_forward`'s, ``x2`` 2-D and contiguous."""
    if kernel is None:
        if x2.is_cuda:
            return _decode_then_cublas(x2, planes, scales, bias, fmt, block_size, n, k, out=out)
        y = _decode_then_gemm_cpu(x2, planes, scales, bias, fmt, block_size, n, k)
        return y if out is None else out.copy_(y)
    if out is None:
        out = torch.empty(x2.shape[0], n, dtype=x2.dtype, device=x2.device)
    tail = [out] if bias is None else [bias.contiguous(), out]
    if layout.kernel_layout(kernel) == "tiles":
        *planes, scales = _pair_tiles(planes, scales, fmt, block_size)
    elif layout.reads_cpu_layout(kernel):
        planes = _cpu_planes(planes, fmt)
    builder.launch(kernel, [x2, *planes, scales, *tail])
    return out


_routes: dict[tuple, object] = {}  # (m, device, dtype, fmt, n, k, bias, block, backend) -> kernel
_launchers: dict[tuple, object] = {}  # the same keys -> the function that runs a call (`_launcher`)
_ones: dict[tuple, torch.Tensor] = {}  # (device, dtype) -> the hot path's output template (`_like`)
_EMULATED = object()  # the route of $MXGEMM_BACKEND=emulated
_epoch = [0]  # how many times `clear_kernels` ran


def backend(value: str | bytes | None) -> str:
    """The backend ``$MXGEMM_BACKEND`` (``value``, or its bytes) selects: ``"kernels"`` when unset;
    ValueError naming the choices for anything else."""
    value = os.fsdecode(value) if isinstance(value, bytes) else value
    if value in (None, "", *BACKENDS):
        return value or BACKENDS[0]
    raise ValueError(f"${BACKEND_ENV} must be one of {', '.join(BACKENDS)}, got {value!r}")


def emulated() -> bool:
    """Whether ``$MXGEMM_BACKEND`` selects the emulation (no generated kernels)."""
    return backend(os.environ.get(BACKEND_ENV)) == "emulated"


def _route(m, device, dtype, fmt, n, k, bias, block_size, backend_env=None) -> object:
    """The fused kernel that serves ``m`` rows of this layer (:func:`plan`), None for decode + cuBLAS,
    :data:`_EMULATED`, or where :func:`row_parts` splits the rows a tuple of ``(first row, end row,
    kernel or None)``; memoized per call signature in ``_routes`` so a forward call does one dict
    lookup."""
    if backend(backend_env) == "emulated":
        return _EMULATED
    arch = targets.arch_of(targets.for_device(device))
    name = _DTYPE_NAMES[dtype]
    routes, r0 = [], 0
    for rows in _parts(m, arch, fmt, n, k, name, block_size):
        op, m_bucket = plan(rows, arch, fmt, n, k, name, block_size)
        kernel = None if op == "decode" else _kernel(device, fmt, n, k, m_bucket, dtype, bias, block_size)
        routes.append((r0, r0 + rows, kernel))
        r0 += rows
    return routes[0][2] if len(routes) == 1 else tuple(routes)


def clear_kernels() -> None:
    """Forget the kernels and plans this process looked up (the next call looks them up again, e.g.
    after the tune log, ``$MXGEMM_TUNED``, ``$MXGEMM_NEAREST`` or ``$MXGEMM_SPLIT_M`` changed: the log
    also chooses between fused and decode, and where rows split)."""
    _kernels.clear()
    _routes.clear()
    _launchers.clear()
    _epoch[0] += 1  # (the layers' hot paths, `hot_path`, check it)
    plan.cache_clear()
    row_parts.cache_clear()
    _bucket_record.cache_clear()


def _decode_then_cublas(
    x2, planes, scales, bias, fmt, block_size, n, k, kernel=None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x2 @ W.T (+ bias)`` with W decoded into ``x2.dtype`` by the generated decode kernel (``kernel``,
    else the cached one), then cuBLAS; with :func:`decode_chunk_rows` < n, a row chunk at a time
    (``Y.T[chunk] = W[chunk] @ x2.T``). ``out``: ``x2.dtype [m, n]`` to write Y into (the tuner's
    harness, whose kernels write their output), else a new tensor."""
    rows = decode_chunk_rows(n, k)
    if kernel is None:
        kernel = _kernel(x2.device, fmt, rows, k, None, x2.dtype, False, block_size, "decode")
    w = torch.empty(rows, k, dtype=x2.dtype, device=x2.device)
    if rows == n:
        builder.launch(kernel, [*planes, scales, w])
        if out is None:
            return torch.nn.functional.linear(x2, w, bias)
        return torch.mm(x2, w.T, out=out) if bias is None else torch.addmm(bias, x2, w.T, out=out)
    out_t = torch.empty(n, x2.shape[0], dtype=x2.dtype, device=x2.device)
    for r in range(0, n, rows):
        builder.launch(kernel, [*(p[r : r + rows] for p in planes), scales[r : r + rows], w])
        if bias is None:
            torch.mm(w, x2.T, out=out_t[r : r + rows])
        else:
            torch.addmm(bias[r : r + rows, None], w, x2.T, out=out_t[r : r + rows])
    return out_t.T.contiguous() if out is None else out.copy_(out_t.T)


def cpu_gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the CPU decode path decodes W into and multiplies in for ``dtype`` activations:
    bfloat16 for bfloat16 where the CPU has bf16 dot products (:func:`mxgemm.system.cpu_bf16_dot`:
    torch's bf16 GEMM runs 3–4x faster than fp32 there), else float32 (exact for float16 and
    bfloat16 activations; torch's fp16 CPU GEMM is slower still)."""
    from mxgemm import system

    return dtype if dtype is torch.bfloat16 and system.cpu_bf16_dot() else torch.float32


_local = threading.local()


def _scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A CPU buffer of ``numel`` ``dtype`` elements kept per thread across calls: a fresh multi-MB
    ``torch.empty`` on every call is a fresh mapping whose page faults cost more than the decode
    (4096² mxfp4, 16 rows: 5.2 ms a call against 2.x ms with the buffer kept)."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.dtype != dtype or buf.numel() < numel:
        buf = _local.scratch = torch.empty(numel, dtype=dtype)
    return buf[:numel]


def _decode_then_gemm_cpu(x2, planes, scales, bias, fmt, block_size, n, k) -> torch.Tensor:
    """``x2 @ W.T (+ bias)`` on CPU: W decoded by the generated ``cpu_dequant`` kernel into
    :func:`cpu_gemm_dtype` (exact), a row chunk at a time (:data:`CPU_CHUNK_MB`, so torch's GEMM reads
    it from cache), in the permuted K order of :func:`mxgemm.layout.k_permuted`, and ``x2`` permuted
    the same way once: every product and the fp32 sum are those of ``x2 @ W.T``."""
    bits = formats.get(fmt).bits
    wdtype = cpu_gemm_dtype(x2.dtype)
    rows = decode_chunk_rows(n, k, CPU_CHUNK_MB, k * wdtype.itemsize)
    kernel = _kernel(x2.device, fmt, rows, k, None, x2.dtype, False, block_size, "decode", wdtype)
    _, per, lanes = layout.cpu_group(bits, block_size)
    planes = _cpu_planes(planes, fmt)
    xt = layout.k_permuted(x2.to(wdtype), bits, block_size).T
    w2 = _scratch(rows * k, wdtype).view(rows, k)
    w = w2.view(rows, k // (per * lanes), per, lanes)
    b = None if bias is None else bias.to(wdtype)[:, None]
    out_t = torch.empty(n, x2.shape[0], dtype=wdtype)
    for r in range(0, n, rows):
        builder.launch(kernel, [*(p[r : r + rows] for p in planes), scales[r : r + rows], w])
        if b is None:
            torch.mm(w2, xt, out=out_t[r : r + rows])
        else:
            torch.addmm(b[r : r + rows], w2, xt, out=out_t[r : r + rows])
    return out_t.T.to(x2.dtype).contiguous()


def _emulated(x2, planes, scales, bias, fmt, block_size, n, k) -> torch.Tensor:
    """``x2 @ W.T (+ bias)`` without generated kernels: W dequantized in fp32 by the torch reference,
    ``F.linear`` in fp32, one rounding to ``x2.dtype`` (the kernels' numerics, up to summation order)."""
    from mxgemm.reference import dequantize

    bits = formats.get(fmt).bits
    q = MxWeight(layout.from_planes(planes, bits), scales, fmt, block_size, (n, k))
    b = None if bias is None else bias.float()
    return torch.nn.functional.linear(x2.float(), dequantize(q), b).to(x2.dtype)


@torch.library.custom_op("mxgemm::linear", mutates_args=())
def _linear(
    x: torch.Tensor,
    planes: list[torch.Tensor],
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    fmt: str,
    block_size: int,
    n: int,
    k: int,
) -> torch.Tensor:
    """The custom op (see :func:`_forward`): what torch.compile, torch.export and autograd see."""
    return _forward(x, planes, scales, bias, fmt, block_size, n, k)


@_linear.register_fake
def _(x, planes, scales, bias, fmt, block_size, n, k):
    return x.new_empty(*x.shape[:-1], n)


def _eager(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may skip the custom op's dispatch (≈ 60 µs of host time a call) and run
    :func:`_forward` directly: outside torch.compile tracing (checked first, so dynamo folds the rest
    away), a plain tensor (not a fake or functional one), no torch dispatch or function mode active
    (export, make_fx), and no gradient to record."""
    return (
        not torch.compiler.is_compiling()
        and type(x) is torch.Tensor
        and not (x.requires_grad and torch.is_grad_enabled())
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
    )


def dispatch(x: torch.Tensor, *args) -> torch.Tensor:
    """``mxgemm::linear(x, planes, scales, bias, fmt, block_size, n, k)`` on already-checked arguments
    (see :func:`_forward`): straight to the kernel in eager mode, through the custom op wherever torch
    traces or records (:func:`_eager`). Both run the same code, so their results are identical."""
    run = _forward if _eager(x) else torch.ops.mxgemm.linear
    return run(x, *args)


def linear(x: torch.Tensor, w: MxWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(w).T + bias`` computed by a decode-fused kernel, accumulating in fp32.

    Args:
        x: float16/bfloat16 ``[..., k]`` on CPU or CUDA.
        w: 2-D `MxWeight` of shape ``[n, k]`` on ``x``'s device.
        bias: ``[n]`` of ``x.dtype`` on ``x``'s device, or None.
    Returns:
        ``x.dtype [..., n]``.
    """
    if not isinstance(w, MxWeight):
        raise TypeError(f"linear: w must be an MxWeight (from mxgemm.quantize), got {type(w).__name__}")
    if len(w.shape) != 2:
        raise ValueError(f"linear: w must be 2-D [n, k], got shape {list(w.shape)}")
    n, k = w.shape
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"linear: x must be float16 or bfloat16, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"linear: x's last dimension must be k={k} (w is [{n}, {k}]), got x {list(x.shape)}")
    if w.device != x.device:
        raise ValueError(f"linear: x is on {x.device} but w is on {w.device}; move one with .to()")
    if bias is not None:
        if bias.shape != (n,) or bias.dtype != x.dtype or bias.device != x.device:
            raise ValueError(
                f"linear: bias must be {x.dtype} [{n}] on {x.device}, got {bias.dtype} {list(bias.shape)} "
                f"on {bias.device}"
            )
    planes = _planes(w.blocks, formats.get(w.fmt).bits)
    return dispatch(x, planes, w.scales, bias, w.fmt, w.block_size, n, k)
