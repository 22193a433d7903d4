"""The decode-fused matmul as a TensorIR PrimFunc (TE-built; blocks ``decode``, ``matmul``, ``epilogue``)."""

from __future__ import annotations

from tvm import te, tirx

from mxgemm import formats, packing
from mxgemm.codegen.decode import weight_expr
from mxgemm.codegen.shapes import check_shape, dtype_name
from mxgemm.layout import read_widths


def prim_func(
    fmt: str | formats.Format,
    *,
    n: int,
    k: int,
    m: int | None = None,
    a_dtype: str = "float16",
    out_dtype: str | None = None,
    bias: bool = False,
    block_size: int | None = None,
    decode_dtype: str | None = None,
    decode_form: str = "bits",
    a_stage: bool = False,
    cpu_layout: bool = False,
) -> tirx.PrimFunc:
    """``Y[m, n] = cast(sum_k A[m, k] * W[n, k]) (+ Bias[n])`` with ``W`` decoded from MX/BFP codes.

    Arguments of the PrimFunc, in order:
        A: ``a_dtype [m, k]`` activations (``m`` a symbolic int64 var when ``m is None``).
        B (or B0, B1, ... for 3/5/6/7-bit codes): ``uint8 [n, k * w / 8]``, the codes' bit planes of
            width ``w`` (:func:`mxgemm.layout.to_planes`; one plane, the portable bytes, for 8/4/2 bits).
        S: ``uint8 [n, k / block_size]`` E8M0 scales.
        Bias: ``out_dtype [n]`` (only when ``bias``).
        Y: ``out_dtype [m, n]`` output (defaults to ``a_dtype``).
    Blocks: ``decode`` (W in ``decode_dtype``, default ``a_dtype``; one expression; ``"float32"`` is
    exact for every format and skips a round trip through 16 bits where no tensor core needs them),
    ``matmul`` (fp32 accumulation), ``epilogue`` (cast, bias). ``decode_form``: the decode
    expression (:func:`mxgemm.codegen.decode.weight_expr`'s ``form``: ``"bits"``, ``"sar"`` or
    ``"f16"``, the same values; the last two read the CPU layout). ``a_stage``: A converted to
    float32 in a block of its own, ``a_f32`` (the CPU GEMV computes it once per call instead of once
    per output row). ``cpu_layout``: the codes come in the
    CPU kernels' layout (:func:`mxgemm.layout.cpu_planes`: 3/5/6/7-bit codes one a byte, ``B`` uint8
    ``[n, k]``).
    """
    f = formats.get(fmt)
    bs = formats.check_block_size(block_size, f)
    a_dtype = dtype_name(a_dtype, "a_dtype")
    out_dtype = dtype_name(out_dtype or a_dtype, "out_dtype")
    decode_dtype = decode_dtype or a_dtype
    if decode_dtype not in (a_dtype, "float32"):
        raise ValueError(f"decode_dtype must be a_dtype ({a_dtype}) or float32, got {decode_dtype!r}")
    check_shape(n, k, bs)
    if m is not None and (not isinstance(m, int) or m <= 0):
        raise ValueError(f"m must be a positive int or None (dynamic), got {m!r}")

    mm = te.var("m", "int64") if m is None else m
    a = te.placeholder((mm, k), a_dtype, name="A")
    b, s, w = _decoded_weight(f, n, k, bs, decode_dtype, decode_form, cpu_layout)
    r = te.reduce_axis((0, k), name="k")
    a_in = te.compute((mm, k), lambda i, c: tirx.Cast("float32", a[i, c]), name="a_f32") if a_stage else a
    acc = te.compute(
        (mm, n),
        lambda i, j: te.sum(tirx.Cast("float32", a_in[i, r]) * tirx.Cast("float32", w[j, r]), axis=r),
        name="matmul",
    )
    args = [a, *b, s]
    if bias:
        bias_t = te.placeholder((n,), out_dtype, name="Bias")
        y = te.compute(
            (mm, n),
            lambda i, j: tirx.Cast(out_dtype, acc[i, j] + tirx.Cast("float32", bias_t[j])),
            name="epilogue",
        )
        args.append(bias_t)
    else:
        y = te.compute((mm, n), lambda i, j: tirx.Cast(out_dtype, acc[i, j]), name="epilogue")
    # int64 indices: a symbolic int64 M next to int32 indices breaks dlight's Matmul rule.
    wide = m is None or n * k >= 2**31
    func = te.create_prim_func([*args, y], index_dtype_override="int64" if wide else None)
    return func.with_attr("global_symbol", "main")


def _decoded_weight(
    f: formats.Format, n: int, k: int, bs: int, dtype: str, form: str = "bits", cpu_layout: bool = False
):
    """Placeholders of the code planes and scales, and the ``decode`` compute ``[n, k]`` of ``dtype``."""
    widths = read_widths(f.bits, cpu_layout)
    names = ["B"] if len(widths) == 1 else [f"B{i}" for i in range(len(widths))]
    b = [
        te.placeholder((n, packing.packed_len(k, w)), "uint8", name=nm)
        for nm, w in zip(names, widths, strict=True)
    ]
    s = te.placeholder((n, k // bs), "uint8", name="S")
    w = te.compute(
        (n, k), lambda i, j: weight_expr(f, b, s, i, j, bs, dtype, form, cpu_layout), name="decode"
    )
    return b, s, w


def decode_func(
    fmt: str | formats.Format,
    *,
    n: int,
    k: int,
    dtype: str = "float16",
    block_size: int | None = None,
    cpu_layout: bool = False,
):
    """``W[n, k] = dequantize(codes, scales)`` in ``dtype`` as a PrimFunc (one block, ``decode``).

    Arguments: the code planes ``B``/``B0..`` and ``S`` exactly as in :func:`prim_func`, then
    ``W``: ``dtype [n, k]`` (``"float16"``, ``"bfloat16"`` or ``"float32"``). The many-row paths run
    it and then cuBLAS (CUDA) or torch's GEMM (CPU). ``cpu_layout`` as in :func:`prim_func`.
    """
    f = formats.get(fmt)
    bs = formats.check_block_size(block_size, f)
    dtype = dtype_name(dtype, "dtype", ("float32",))
    check_shape(n, k, bs)
    b, s, w = _decoded_weight(f, n, k, bs, dtype, cpu_layout=cpu_layout)
    func = te.create_prim_func([*b, s, w], index_dtype_override="int64" if n * k >= 2**31 else None)
    return func.with_attr("global_symbol", "main")
