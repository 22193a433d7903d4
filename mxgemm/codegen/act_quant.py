"""A generated kernel that quantizes activations to an MX/BFP format and back (``dequant(q(x))``), per
block along K, bit for bit what :func:`mxgemm.fake_quantize` computes, in one pass over ``x``.

Where it applies (:func:`applies`): ``floor`` scales (OCP MX) and the roundings ``even``, ``away``
and ``zero``; other modes go through the torch reference. All arithmetic is exact in float32:

- the block's amax is the max of ``|x|``'s float32 bit patterns as integers (for non-negative floats
  their order; NaN patterns sort above inf, so one comparison finds both), and its exponent field
  ``E`` gives ``floor(log2(amax))`` (a float32 subnormal or zero amax gives ``E = 0``, whose shared
  exponent clamps to -127, as the reference's does); ``E = 255`` (inf or NaN) makes the block NaN;
- ``s = clamp(E - 127 - emax, -127, 127)``; ``v = x · 2^-s`` and ``y = q · 2^s`` are each two
  multiplies by powers of two in float32's normal range (exact; a ``v`` that underflows is far below
  the element grid's least subnormal, so it rounds to ±0 under these roundings, as in the reference);
- ``v`` rounds to the element grid with the quantum ``2^(max(floor(log2|v|), emin) - mbits)`` (float
  formats) or the format's least value (int formats), saturates to ±max normal and keeps ``v``'s
  sign; ``q · 2^s`` is cast to the activations' dtype, as :func:`mxgemm.dequantize` does.

Schedule: one thread (CUDA) or one task of the thread pool (CPU) per block of ``block_size``
elements, which it reads twice (amax, then the values).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from mxgemm import formats
from mxgemm.codegen import build as builder

SCALE_MODES = ("floor",)
ROUNDINGS = ("even", "away", "zero")
DTYPES = ("float16", "bfloat16", "float32")
THREADS = 128  # CUDA threads per block (a thread per scale block)


def applies(fmt: str, scale_mode: str, rounding: str, dtype: torch.dtype) -> bool:
    """Whether the generated kernel computes :func:`mxgemm.fake_quantize` for these settings."""
    del fmt  # every format
    return scale_mode in SCALE_MODES and rounding in ROUNDINGS and str(dtype).removeprefix("torch.") in DTYPES


def _pow2(e):
    """``2^e`` (float32) for an int32 expression ``e`` in [-126, 127]: the exponent field alone."""
    from tvm import tirx

    return tirx.reinterpret("float32", tirx.Cast("uint32", e + 127) << tirx.const(23, "uint32"))


def _scaled(x, e):
    """``x · 2^e`` (float32) for ``e`` in [-254, 254], as two exact multiplies."""
    from tvm import tirx

    half = tirx.truncdiv(e, 2)
    return x * _pow2(half) * _pow2(e - half)


def _round(t, rounding: str):
    """``t`` (float32, an exact multiple of 2^-k of small magnitude) rounded to an integer."""
    from tvm import tirx

    if rounding == "even":
        return tirx.nearbyint(t)
    if rounding == "away":
        return tirx.copysign(tirx.floor(tirx.abs(t) + tirx.const(0.5, "float32")), t)
    return tirx.trunc(t)


def quantized(x, amax_bits, f: formats.Format, rounding: str):
    """ONE expression: ``x`` (float32) quantized to ``f`` with its block's amax bit pattern
    ``amax_bits`` (uint32 of ``|x|``'s float32 bits) and dequantized, as float32 (module docstring)."""
    from tvm import tirx

    i32 = "int32"
    big = tirx.Cast(i32, amax_bits >> tirx.const(23, "uint32"))
    s = tirx.max(tirx.min(big - 127 - f.emax, 127), -127)
    v = _scaled(x, -s)
    if f.kind == "float":
        vexp = tirx.Cast(i32, (tirx.reinterpret("uint32", v) >> tirx.const(23, "uint32")) & 255) - 127
        e = tirx.max(vexp, 1 - f.bias) - f.mbits  # exponent of the quantum
        q = _scaled(_round(_scaled(v, -e), rounding), e)
    else:
        ulp = tirx.const(f.min_subnormal, "float32")
        q = _round(v / ulp, rounding) * ulp
    top = tirx.const(f.max_normal, "float32")
    q = tirx.copysign(tirx.min(tirx.max(q, -top), top), v)
    nan = tirx.const(float("nan"), "float32")
    return tirx.Select(big == 255, nan, _scaled(q, s))


def prim_func(fmt: str, k: int, block_size: int, dtype: str, rounding: str):
    """``Y = dequant(q(A))``: A, Y ``dtype [m, k]`` (m dynamic), blocks of ``block_size`` along K."""
    from tvm import te, tirx

    f = formats.get(fmt)
    m = tirx.Var("m", "int64")
    a = te.placeholder((m, k), dtype, name="A")
    r = te.reduce_axis((0, block_size), name="r")

    def mag(i, c):
        return tirx.reinterpret("uint32", tirx.Cast("float32", a[i, c])) & tirx.const(0x7FFFFFFF, "uint32")

    amax = te.compute(
        (m, k // block_size), lambda i, b: te.max(mag(i, b * block_size + r), axis=r), name="amax"
    )
    y = te.compute(
        (m, k),
        lambda i, c: tirx.Cast(
            dtype, quantized(tirx.Cast("float32", a[i, c]), amax[i, c // block_size], f, rounding)
        ),
        name="Y",
    )
    return te.create_prim_func([a, y]).with_attr("global_symbol", "main")


def schedule(func, block_size: int, cuda: bool):
    """A thread (CUDA) or a thread-pool task (CPU) per block: its amax computed where it is used."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    yb = sch.get_sblock("Y")
    i, c = sch.get_loops(yb)
    b, e = sch.split(c, [None, block_size])
    ib = sch.fuse(i, b)
    if cuda:
        bx, tx = sch.split(ib, [None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        amax = sch.get_sblock("amax")
        sch.compute_at(amax, tx)
        sch.set_scope(amax, 0, "local")
    else:
        sch.parallel(ib)
        sch.compute_at(sch.get_sblock("amax"), ib)
        sch.vectorize(e)
    return sch.mod


_kernels: dict[tuple, Any] = {}
_lock = threading.Lock()


def kernel(fmt: str, k: int, block_size: int, dtype: str, rounding: str, target: dict[str, Any]):
    """The compiled kernel (``kernel(x, y)``: x, y ``dtype [m, k]`` contiguous), built once per
    settings and target into the kernel cache."""
    from mxgemm.codegen import cache
    from mxgemm.codegen import target as targets

    spec = {
        "op": "act_quant", "fmt": fmt, "k": k, "block_size": block_size, "dtype": dtype,
        "rounding": rounding, "target": target, "versions": builder.versions(target),
    }  # fmt: skip
    key = repr(sorted(spec.items(), key=lambda kv: kv[0]))
    with _lock:
        if key in _kernels:
            return _kernels[key]
    cuda = targets.is_cuda(target)

    def build(out: Path) -> dict[str, Any]:
        mod = schedule(prim_func(fmt, k, block_size, dtype, rounding), block_size, cuda)
        return builder.compile_export(mod, target, out)

    path, _ = cache.get_or_build(spec, build)
    func = builder.load_main(path, target)
    with _lock:
        return _kernels.setdefault(key, func)


@torch.library.custom_op("mxgemm::act_quant", mutates_args=())
def op(x: torch.Tensor, fmt: str, block_size: int, rounding: str) -> torch.Tensor:
    """:func:`fake_quantize` as the custom op ``torch.ops.mxgemm.act_quant`` (fake kernel included),
    which torch.compile and export trace as one node."""
    return fake_quantize(x, fmt, block_size, rounding)


@op.register_fake
def _(x, fmt, block_size, rounding):
    return torch.empty_like(x)


# (fmt, k, block, dtype, rounding, device) -> the loaded kernel: one dict lookup a call
_runs: dict[tuple, Any] = {}


def _run(x: torch.Tensor, fmt: str, block_size: int, rounding: str):
    """The kernel for ``x``'s K, dtype and device (:func:`kernel`), remembered in :data:`_runs`."""
    from mxgemm.codegen import target as targets

    dtype = str(x.dtype).removeprefix("torch.")
    target = targets.for_device(x.device)
    run = kernel(formats.get(fmt).name, x.shape[-1], block_size, dtype, rounding, target)
    return _runs.setdefault((fmt, x.shape[-1], block_size, x.dtype, rounding, x.device), run)


def fake_quantize(x: torch.Tensor, fmt: str, block_size: int, rounding: str) -> torch.Tensor:
    """``dequant(q(x))`` along the last axis of ``x`` (float16/bfloat16/float32 ``[..., k]``, CPU or
    CUDA) with ``floor`` scales, by the generated kernel: the same values as
    :func:`mxgemm.fake_quantize` (:func:`applies` must hold)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    y = torch.empty_like(x2)
    run = _runs.get((fmt, k, block_size, x.dtype, rounding, x.device)) or _run(x, fmt, block_size, rounding)
    builder.launch(run, [x2, y])
    return y.reshape(x.shape)
