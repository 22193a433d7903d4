"""TensorIR decode expressions: packed element codes + E8M0 scales → weights.

Every helper returns ONE PrimExpr (no let-bindings): dlight and our rules inline the decode block
into the matmul's operand load only when it is a single expression.
"""

from __future__ import annotations

from tvm import te, tirx
from tvm.ir import Expr as PrimExpr

from mxgemm.formats import Format
from mxgemm.layout import cpu_widths, read_widths

U32 = "uint32"


def u32(x: PrimExpr | int) -> PrimExpr:
    """``x`` as uint32: a constant for a Python int, else a cast."""
    return tirx.const(x, U32) if isinstance(x, int) else tirx.Cast(U32, x)


def _read(plane: te.Tensor, row: PrimExpr, k: PrimExpr, width: int) -> PrimExpr:
    """The ``width``-bit code (width divides 8) of element ``k`` of a bitstream plane: one byte read."""
    if width == 8:
        return u32(plane[row, k])
    per = 8 // width
    return (u32(plane[row, k // per]) >> u32((k % per) * width)) & u32(2**width - 1)


def extract_code(
    planes: list[te.Tensor], row: PrimExpr, k: PrimExpr, bits: int, cpu: bool = False
) -> PrimExpr:
    """The ``bits``-wide code of element ``k`` of ``row``, from its bit planes (:mod:`mxgemm.layout`):
    one aligned sub-byte read per plane, low bits first. ``cpu``: the codes are in the CPU layout
    (:func:`mxgemm.layout.cpu_planes`: 3/5/6/7-bit codes one a byte)."""
    code, off = None, 0
    for plane, width in zip(planes, read_widths(bits, cpu), strict=True):
        part = _read(plane, row, k, width)
        part = part << u32(off) if off else part
        code = part if code is None else code | part
        off += width
    return code


def element_expr(fmt: Format, code: PrimExpr, dtype: str = "float32") -> PrimExpr:
    """uint32 ``code`` of ``fmt`` → its element value in ``dtype`` (exact in float32).

    No int→float conversion and no select (conversions run at a quarter of the integer rate on
    sm_80/sm_90; the decode must cost a few integer ops):

    float: the sign goes to bit 31 and the exponent/mantissa bits to the top of the float32
    exponent/mantissa fields, which is the value times ``2**(bias - 127)`` (subnormals map to float32
    subnormals); one exact multiply by ``2**(127 - bias)`` gives the value. NaN/inf codes (never
    produced by quantize) decode to finite values.
    int: ``code ^ 2**(bits-1)`` (the code plus ``2**(bits-1)``, mod ``2**bits``) ORed into the
    mantissa of ``2**23`` is ``2**23 + 2**(bits-1) + q`` as a float; one exact subtraction gives ``q``,
    one exact multiply ``q * 2**-(bits-2)``.
    """
    f32 = "float32"
    if fmt.kind == "int":
        half = 2 ** (fmt.bits - 1)
        biased = tirx.reinterpret(f32, (code ^ u32(half)) | u32(0x4B000000))
        q = biased - tirx.const(2.0**23 + half, f32)
        value = q * tirx.const(fmt.min_subnormal, f32)
    else:
        low = fmt.bits - 1  # exponent + mantissa bits
        sign = (code << u32(32 - fmt.bits)) & u32(0x80000000)
        rest = (code << u32(23 - fmt.mbits)) & u32((2**low - 1) << (23 - fmt.mbits))
        value = tirx.reinterpret(f32, sign | rest) * tirx.const(2.0 ** (127 - fmt.bias), f32)
    return value if dtype == f32 else tirx.Cast(dtype, value)


def scale_expr(scale_code: PrimExpr) -> PrimExpr:
    """uint8 E8M0 code → float32 ``2**(c-127)`` by shifting it into the exponent field.

    Code 0 sets bit 22 (2**-127, an fp32 subnormal, which flush-to-zero hardware reads as 0);
    code 255 sets it too, giving the quiet NaN 0x7FC00000.
    """
    c = u32(scale_code)
    special = tirx.Cast(U32, tirx.Or(c == u32(0), c == u32(255))) << u32(22)
    return tirx.reinterpret("float32", (c << u32(23)) | special)


def scale_exponent(word: PrimExpr, byte: int | None) -> PrimExpr:
    """float32 ``2**(c-127)`` for the E8M0 code ``c`` in byte ``byte`` of a uint32 ``word`` (None:
    ``word`` is the code), in 2–3 integer ops for hot loops: the code shifted into the exponent
    field, and code 0 raised to 2**-127 (the subnormal 0x00400000, below every other code's bits) by
    one unsigned max. Code 255 gives +inf, not NaN: flag it with :func:`nan_scales`."""
    if byte is None:
        bits = word << u32(23)
    else:
        shifted = word >> u32(1) if byte == 3 else word << u32(23 - 8 * byte)
        bits = shifted & u32(0x7F800000)
    return tirx.reinterpret("float32", tirx.Max(bits, u32(0x00400000)))


def nan_scales(word: PrimExpr) -> PrimExpr:
    """Nonzero iff a byte of the uint32 ``word`` (E8M0 codes, or one code) is 255, the NaN code: the
    zero-byte test ``(v - 0x01010101) & ~v & 0x80808080`` of ``v = ~word`` (2 ops)."""
    return (u32(0xFEFEFEFE) - word) & word & u32(0x80808080)


def top_aligned_code(planes: list[te.Tensor], row: PrimExpr, k: PrimExpr, bits: int) -> PrimExpr:
    """uint32 holding the ``bits``-wide code of element ``k`` of ``row`` in the CPU layout
    (:func:`mxgemm.layout.cpu_planes`: one plane) in its top bits (the bits below it are garbage:
    whatever else the byte held): ONE shift of the byte (a constant shift where ``k % (8 / width)`` is
    an unrolled loop's constant)."""
    (width,) = cpu_widths(bits)
    per = 8 // width
    return u32(planes[0][row, k // per]) << (u32(32 - bits) - u32(k % per) * u32(width))


def element_expr_sar(fmt: Format, top: PrimExpr) -> PrimExpr:
    """float32 value of the code in the top bits of uint32 ``top`` (:func:`top_aligned_code`) in 2–3
    vector ops for CPUs; ints come times ``2**(bits-2)`` (:func:`weight_expr` folds the int step
    into the block scale: exact, the step is below 1).

    float: one arithmetic right shift by ``8 - ebits`` moves the exponent/mantissa field to the top
    of the float32 exponent/mantissa fields and keeps the sign at bit 31, one AND keeps those bits:
    the bits of :func:`element_expr`, then its exact multiply by ``2**(127 - bias)`` (which cannot
    be folded into the scale: ``2**(127 - bias)`` times a large scale overflows). int: the
    arithmetic shift sign-extends ``q``, one conversion makes it a float (exact).
    """
    signed = tirx.reinterpret("int32", top)
    if fmt.kind == "int":
        return tirx.Cast("float32", signed >> tirx.const(32 - fmt.bits, "int32"))
    field = ((1 << (fmt.bits - 1)) - 1) << (23 - fmt.mbits)
    bits = tirx.reinterpret(U32, signed >> tirx.const(8 - fmt.ebits, "int32")) & u32(0x80000000 | field)
    return tirx.reinterpret("float32", bits) * tirx.const(2.0 ** (127 - fmt.bias), "float32")


def f16_decodes(fmt: Format) -> bool:
    """Whether :func:`element_expr_f16` decodes ``fmt``: float elements with at most 4 exponent bits
    (fp16's 5 hold them below its inf/NaN exponent)."""
    return fmt.kind != "int" and fmt.ebits <= 4


def element_expr_f16(fmt: Format, planes: list[te.Tensor], row: PrimExpr, k: PrimExpr) -> PrimExpr:
    """float32 value of the code of element ``k`` of ``row`` (the CPU layout, one plane:
    :func:`mxgemm.layout.cpu_planes`) by way of an fp16: the code shifted to the top of a 16-bit lane,
    one arithmetic shift by ``5 - ebits`` and one AND place its sign and exponent/mantissa bits in
    fp16's fields (the value times ``2**(bias - 15)``; fp16 subnormals for the element's subnormals),
    the fp16 → fp32 conversion (one ``vcvtph2ps`` for 8 or 16 lanes), one exact multiply by
    ``2**(15 - bias)``. Every intermediate float32 is normal or zero: the ``"sar"`` form's float32
    subnormals (the element's subnormal codes) cost x86 cores a slow path; on a Zen 3, mxfp6_e2m3
    codes of random weights took 44% longer than normal ones there (3.0 against 2.1 ms, 4096², M=1)."""
    (width,) = cpu_widths(fmt.bits)
    per = 8 // width
    u16 = "uint16"
    shift = tirx.const(16 - fmt.bits, u16) - tirx.Cast(u16, k % per) * tirx.const(width, u16)
    top = tirx.Cast(u16, planes[0][row, k // per]) << shift
    field = ((1 << (fmt.bits - 1)) - 1) << (10 - fmt.mbits)
    placed = tirx.reinterpret("int16", top) >> tirx.const(5 - fmt.ebits, "int16")
    half = tirx.reinterpret("float16", tirx.reinterpret(u16, placed) & tirx.const(0x8000 | field, u16))
    return tirx.Cast("float32", half) * tirx.const(2.0 ** (15 - fmt.bias), "float32")


def weight_expr(
    fmt: Format,
    planes: list[te.Tensor],
    scales: te.Tensor,
    row: PrimExpr,
    k: PrimExpr,
    block_size: int,
    dtype: str,
    form: str = "bits",
    cpu: bool = False,
) -> PrimExpr:
    """Decoded weight ``W[row, k]`` in ``dtype``: element × block scale, computed in float32.
    ``form``: ``"bits"`` (:func:`element_expr`, what the GPU kernels use), ``"sar"``
    (:func:`element_expr_sar`, fewer vector ops on CPUs) or ``"f16"`` (:func:`element_expr_f16`, formats
    where :func:`f16_decodes`); the same values. ``"sar"`` and ``"f16"`` read the CPU layout
    (:func:`mxgemm.layout.cpu_planes`); ``"bits"`` reads it where ``cpu``, else the planes."""
    scale = scale_expr(scales[row, k // block_size])
    if form == "f16":
        value = element_expr_f16(fmt, planes, row, k) * scale
    elif form == "sar":
        value = element_expr_sar(fmt, top_aligned_code(planes, row, k, fmt.bits))
        step = tirx.const(fmt.min_subnormal, "float32")
        value = value * (scale * step) if fmt.kind == "int" else value * scale
    else:
        value = element_expr(fmt, extract_code(planes, row, k, fmt.bits, cpu)) * scale
    return value if dtype == "float32" else tirx.Cast(dtype, value)
