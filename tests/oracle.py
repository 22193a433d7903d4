"""An independent reference for MX / BFP quantization, for the tests.

numpy, ml_dtypes and ``math`` only: nothing here imports or copies ``mxgemm``. The element grids come
from ml_dtypes (float formats: every code viewed as the ml_dtypes type) or from the definition
``q * 2**-(M-2)``, ``|q| <= 2**(M-1) - 1`` (int formats); the E8M0 scale decodes through
``ml_dtypes.float8_e8m0fnu``.

Semantics (OCP MX v1.0, microxcaling): per block of ``block_size`` elements along the last axis, ``amax
= max |x|``; shared exponent ``floor``: ``floor(log2 amax) - emax``, ``rceil``: the smallest ``s`` with
``amax <= max_normal * 2**s``; ``even`` (torchao EVEN): floor's rule after ``amax``'s float32 bits get
half an element ulp added and their mantissa cleared (for a normal float32 ``amax``; the same rounding
in exact arithmetic below); ``ceil``: ``ceil(log2 amax) - emax``; ``mse``: of floor's ``s`` and ``s ±
1``, the one whose round-to-nearest-even reconstruction has the least squared error (floor on ties, then
``s + 1``); clamped to [-127, 127]; an all-zero block gets -127; a block holding NaN or ±Inf gets scale
code 255 and dequantizes to NaN. Elements ``x / 2**s`` are rounded to the element grid (subnormals kept)
and saturated to ±max normal; float formats keep the sign of zero, int formats have one zero.
Dequantized values are exact products in float64 cast to float32, so a product above float32's range is
±inf (``rceil`` rounds e.g. mxfp4 ``3e38`` to ``4 * 2**126``).

Rounding ``even`` goes through ml_dtypes' own conversion (float formats) or ``np.round`` (int
formats); every mode can also go through the table of representable magnitudes and its two
neighbours of each value (``method="table"``), which is how the other modes are done.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import ml_dtypes
import numpy as np

E8M0_NAN = 255
MIN_EXP, MAX_EXP = -127, 127
ROUNDINGS = ("even", "away", "zero", "up", "down")
SCALE_MODES = ("floor", "rceil", "even", "ceil", "mse")


@dataclass(frozen=True)
class Spec:
    """An element format as the oracle sees it.

    Attributes:
        name: the mxgemm registry name.
        bits: element width.
        dtype: the ml_dtypes type (float formats) or ``None`` (int formats).
        grid: every finite non-negative element value, ascending, float64. For float formats the
            index into ``grid`` is the code of the positive value; for int formats it is ``q``.
        emax: exponent of the largest binade (``floor(log2(max_normal))``).
    """

    name: str
    bits: int
    dtype: type | None
    grid: np.ndarray
    emax: int

    @property
    def kind(self) -> str:
        return "int" if self.dtype is None else "float"

    @property
    def max_normal(self) -> float:
        return float(self.grid[-1])

    @property
    def fraction_bits(self) -> int:
        """Bits after the point in the top binade: ml_dtypes' mantissa bits, or an int's ``bits - 2``."""
        return ml_dtypes.finfo(self.dtype).nmant if self.dtype is not None else self.bits - 2

    @property
    def ulp_int(self) -> float:
        """Spacing of an int format's grid (``2**-(bits-2)``)."""
        return math.ldexp(1.0, -(self.bits - 2))


def _float_spec(name: str, dtype_name: str) -> Spec:
    dtype = getattr(ml_dtypes, dtype_name)
    bits = ml_dtypes.finfo(dtype).bits
    positive = np.arange(2 ** (bits - 1), dtype=np.uint8).view(dtype).astype(np.float64)
    finite = positive[np.isfinite(positive)]
    # In every one of these formats the non-finite positive codes are the top ones.
    assert np.all(np.isfinite(positive[: finite.size])) and np.all(np.diff(finite) > 0)
    return Spec(name, bits, dtype, finite, ml_dtypes.finfo(dtype).maxexp - 1)


def _int_spec(name: str, bits: int) -> Spec:
    q = np.arange(2 ** (bits - 1), dtype=np.float64)  # 0 .. 2**(bits-1) - 1
    return Spec(name, bits, None, np.ldexp(q, -(bits - 2)), 0)


SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        _float_spec("mxfp8_e4m3", "float8_e4m3fn"),
        _float_spec("mxfp8_e5m2", "float8_e5m2"),
        _float_spec("mxfp6_e3m2", "float6_e3m2fn"),
        _float_spec("mxfp6_e2m3", "float6_e2m3fn"),
        _float_spec("mxfp4", "float4_e2m1fn"),
        _int_spec("mxint8", 8),
        *(_int_spec(f"bfp{m}", m) for m in range(2, 9)),
    )
}


# ---- shared scale ----------------------------------------------------------------------------------


def shared_exponent(amax: float, spec: Spec, scale_mode: str) -> int | None:
    """Shared exponent of a block with max magnitude ``amax`` (``None``: NaN/Inf block)."""
    if not math.isfinite(amax):
        return None
    if amax == 0:
        return MIN_EXP
    _, e = math.frexp(amax)  # amax = m * 2**e, m in [0.5, 1): floor(log2 amax) = e - 1
    if scale_mode == "floor":
        s = e - 1 - spec.emax
    elif scale_mode == "even" and amax >= 2.0**-126:  # torchao's rule, on (normal) float32 bits
        bits = struct.unpack("<I", struct.pack("<f", amax))[0]
        bits = (bits + (1 << (23 - spec.fraction_bits - 1))) & 0x7F800000
        s = (bits >> 23) - 127 - spec.emax
    elif scale_mode == "even":  # the same rule in exact arithmetic (the bits of a float32 subnormal
        m, _ = math.frexp(amax)  # have no implicit one: torchao's addition is off there)
        s = e - 1 - spec.emax + (2 * m >= 2 - 2.0 ** -(spec.fraction_bits + 1))
    elif scale_mode == "ceil":
        m, _ = math.frexp(amax)
        s = e - 1 - spec.emax + (m != 0.5)
    elif scale_mode == "rceil":
        # amax / max_normal lies in (2**(e - em - 1), 2**(e - em + 1)): start below and step up,
        # comparing exactly (amax * 2**-s is near max_normal: ldexp neither overflows nor rounds).
        _, em = math.frexp(spec.max_normal)
        s = e - em - 2
        assert math.ldexp(amax, -s) > spec.max_normal
        while math.ldexp(amax, -s) > spec.max_normal:
            s += 1
    else:
        raise ValueError(f"scale_mode {scale_mode!r}")
    return min(max(s, MIN_EXP), MAX_EXP)


def scale_factors(codes: np.ndarray) -> np.ndarray:
    """uint8 E8M0 codes → float64 factors, through ml_dtypes (255 → NaN)."""
    return np.asarray(codes, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)


def dequantize(codes: np.ndarray, scale_codes: np.ndarray, spec: Spec) -> np.ndarray:
    """uint8 element ``codes [r, k]`` (one a byte) with E8M0 ``scale_codes [r, k/B]`` → float64 values
    (block size B = k / scale_codes' last dimension; a NaN scale makes its block NaN)."""
    codes = np.asarray(codes, dtype=np.uint8)
    rows, k = codes.shape
    blocks = decode(codes, spec).reshape(rows, scale_codes.shape[-1], -1)
    return (blocks * scale_factors(scale_codes)[:, :, None]).reshape(rows, k)


# ---- element rounding -----------------------------------------------------------------------------


def neighbours(v: np.ndarray, spec: Spec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Indices and values of the grid magnitudes just below and above ``min(|v|, max_normal)``.

    Returns ``(lo_index, hi_index, lo, hi)``; ``lo == hi`` where the magnitude is on the grid.
    """
    a = np.minimum(np.abs(v), spec.max_normal)
    hi_i = np.searchsorted(spec.grid, a, side="left")  # first grid value >= a
    on_grid = spec.grid[hi_i] == a
    lo_i = np.where(on_grid, hi_i, hi_i - 1)
    return lo_i, hi_i, spec.grid[lo_i], spec.grid[hi_i]


def _table_magnitude_index(v: np.ndarray, spec: Spec, rounding: str) -> np.ndarray:
    a = np.minimum(np.abs(v), spec.max_normal)
    lo_i, hi_i, lo, hi = neighbours(v, spec)
    mid = (lo + hi) / 2  # exact: grid values have few significant bits
    neg = np.signbit(v)
    if rounding == "even":
        tie = np.where(lo_i % 2 == 0, lo_i, hi_i)
        return np.where(a < mid, lo_i, np.where(a > mid, hi_i, tie))
    if rounding == "away":
        return np.where(a < mid, lo_i, hi_i)
    if rounding == "zero":
        return lo_i
    if rounding == "up":
        return np.where(neg, lo_i, hi_i)
    if rounding == "down":
        return np.where(neg, hi_i, lo_i)
    raise ValueError(f"rounding {rounding!r}")


def round_elements(
    v: np.ndarray, spec: Spec, rounding: str = "even", method: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """float64 values (already divided by the scale) → (element values float64, codes uint8).

    ``method="auto"`` uses ml_dtypes / ``np.round`` for ``even`` and the table otherwise;
    ``method="table"`` uses the table for every mode.
    """
    v = np.asarray(v, dtype=np.float64)
    assert np.all(np.isfinite(v))
    mask = 2**spec.bits - 1
    use_table = method == "table" or rounding != "even"
    if spec.kind == "int":
        if use_table:
            mag_i = _table_magnitude_index(v, spec, rounding)
            q = np.where(np.signbit(v), -mag_i, mag_i)
        else:
            qmax = 2 ** (spec.bits - 1) - 1
            q = np.clip(np.round(v / spec.ulp_int), -qmax, qmax).astype(np.int64)  # half to even
        values = q * spec.ulp_int + 0.0  # one zero: -0.0 + 0.0 == +0.0
        return values, (q & mask).astype(np.uint8)
    if use_table:
        mag_i = _table_magnitude_index(v, spec, rounding)
        codes = (mag_i | (np.signbit(v).astype(np.int64) << (spec.bits - 1))).astype(np.uint8)
    else:
        # ml_dtypes converts float64 through float32: exact only where v is a float32 value.
        clipped = np.clip(v, -spec.max_normal, spec.max_normal)
        normal32 = np.abs(clipped) >= 2.0**-126
        assert np.all(clipped[normal32].astype(np.float32) == clipped[normal32]), "needs float32 inputs"
        codes = clipped.astype(spec.dtype).view(np.uint8)
    return decode(codes, spec), codes


def decode(codes: np.ndarray, spec: Spec) -> np.ndarray:
    """uint8 element codes → float64 values (float formats through ml_dtypes)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if spec.kind == "int":
        c = codes.astype(np.int64)
        q = np.where(c >= 2 ** (spec.bits - 1), c - 2**spec.bits, c)
        return q * spec.ulp_int
    return codes.view(spec.dtype).astype(np.float64)


# ---- whole tensors --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quantized:
    """What the oracle gives for one tensor.

    Attributes:
        values: float32, the input's shape: the dequantized tensor.
        codes: uint8 ``[..., K]`` element codes (0 in NaN blocks).
        scales: uint8 ``[..., K / block_size]`` E8M0 codes.
    """

    values: np.ndarray
    codes: np.ndarray
    scales: np.ndarray

    def nan_blocks(self) -> np.ndarray:
        """bool ``[..., K]``: elements in blocks whose scale is NaN."""
        bs = self.codes.shape[-1] // self.scales.shape[-1]
        return np.repeat(self.scales == E8M0_NAN, bs, axis=-1)


def block_exponents(x: np.ndarray, spec: Spec, block_size: int, scale_mode: str) -> np.ndarray:
    """Per-block shared exponents ``[..., K / block_size]`` as float64 (NaN for NaN/Inf blocks)."""
    blocks = np.asarray(x, dtype=np.float64).reshape(*x.shape[:-1], -1, block_size)
    amax = np.max(np.abs(blocks), axis=-1)  # NaN propagates
    rule = "floor" if scale_mode == "mse" else scale_mode
    exps = [shared_exponent(float(a), spec, rule) for a in amax.ravel()]
    if scale_mode == "mse":
        rows = blocks.reshape(-1, block_size)
        exps = [e if e is None else _least_error(b, e, spec) for b, e in zip(rows, exps, strict=True)]
    return np.array([math.nan if e is None else e for e in exps], dtype=np.float64).reshape(amax.shape)


def _least_error(block: np.ndarray, floor: int, spec: Spec) -> int:
    """Of ``floor``, ``floor + 1``, ``floor - 1`` (clamped, in that order of preference), the exponent
    whose round-to-nearest-even reconstruction of ``block`` has the least squared error."""
    best, best_err = floor, math.inf
    for d in (0, 1, -1):
        s = min(max(floor + d, MIN_EXP), MAX_EXP)
        values, _ = round_elements(np.ldexp(block, -s), spec, "even", "table")
        err = float(np.sum((np.ldexp(values, s) - block) ** 2))
        if err < best_err:
            best, best_err = s, err
    return best


def quantize(
    x: np.ndarray,
    fmt: str,
    block_size: int = 32,
    *,
    scale_mode: str = "floor",
    rounding: str = "even",
    method: str = "auto",
) -> Quantized:
    """Quantize ``x`` (float array ``[..., K]``, values exact in float64) along its last axis."""
    spec = SPECS[fmt]
    x64 = np.asarray(x, dtype=np.float64)
    *lead, k = x64.shape
    assert k % block_size == 0
    blocks = x64.reshape(*lead, k // block_size, block_size)
    exps = block_exponents(x64, spec, block_size, scale_mode)
    finite = np.isfinite(exps)
    s = np.where(finite, exps, 0).astype(np.int64)[..., None]
    v = np.where(finite[..., None], np.ldexp(blocks, -s), 0.0)  # exact: powers of two
    elem, codes = round_elements(v, spec, rounding, method)
    scales = np.where(finite, s[..., 0] + 127, E8M0_NAN).astype(np.uint8)
    with np.errstate(over="ignore"):  # rceil near float32's max can round up to 2**128: inf
        values = (elem * scale_factors(scales)[..., None]).astype(np.float32)  # NaN scale → NaN
    return Quantized(values.reshape(x64.shape), codes.reshape(x64.shape), scales)


def assert_same_floats(actual: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """float32 arrays equal bit for bit (sign of zero included), NaN exactly where expected."""
    actual = np.asarray(actual, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    nan = np.isnan(expected)
    bad = (np.isnan(actual) != nan) | (~nan & (actual.view(np.uint32) != expected.view(np.uint32)))
    if bad.any():
        idx = np.argwhere(bad)[:5]
        detail = ", ".join(f"{tuple(i)}: got {actual[tuple(i)]!r} want {expected[tuple(i)]!r}" for i in idx)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements differ; {detail}")
