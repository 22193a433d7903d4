"""The MX and BFP element formats: one object per format, one registry.

A format holds everything about its elements: width, exponent/mantissa split, range, how a value on
its grid encodes to a code and how a code decodes to a value (torch, exact), and how a code decodes
inside a generated kernel (TensorIR, :mod:`mxgemm.codegen.decode`). The shared E8M0 scale is common
to all formats and lives in :mod:`mxgemm.scales`.

Semantics follow OCP MX v1.0 and microsoft/microxcaling:

* float elements (``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e3m2``, ``mxfp6_e2m3``, ``mxfp4``): sign,
  ``ebits`` exponent bits with bias ``2**(ebits-1) - 1``, ``mbits`` mantissa bits, subnormals.
  e4m3 has no infinities and one NaN code per sign (``fn``); e5m2 is IEEE-like (inf + NaNs); the fp6
  and fp4 formats have neither.
* integer elements (``mxint8``, ``bfp2``..``bfp8``): ``bits``-wide two's complement mantissa ``q``
  with value ``q * 2**-(bits-2)``, symmetric range ``±(2**(bits-1) - 1)`` (the most negative code is
  never produced). ``mxint8`` is ``bfp8`` with the MX block size.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pragma: no cover
    import torch

MX_BLOCK_SIZE = 32
BLOCK_SIZES = tuple(2**i for i in range(3, 9))  # 8 .. 256


@dataclass(frozen=True)
class Format:
    """An element format plus its default block size.

    Attributes:
        name: registry name, e.g. ``"mxfp4"``.
        kind: ``"float"`` (sign/exponent/mantissa) or ``"int"`` (two's complement mantissa).
        bits: element width in bits (2..8).
        ebits: exponent bits (0 for ``int``).
        mbits: mantissa bits excluding the sign (``bits - 1`` for ``int``).
        specials: ``"none"`` (every code is finite), ``"fn"`` (all-ones exponent and mantissa is
            NaN, no inf: e4m3), ``"ieee"`` (all-ones exponent is inf/NaN: e5m2).
        block_size: default number of elements sharing one scale.
        oracle: name of the independent ``ml_dtypes`` type, or ``None``.
    """

    name: str
    kind: Literal["float", "int"]
    bits: int
    ebits: int
    mbits: int
    specials: Literal["none", "fn", "ieee"] = "none"
    block_size: int = MX_BLOCK_SIZE
    oracle: str | None = None
    # Derived in __post_init__.
    bias: int = field(init=False)
    emax: int = field(init=False)
    max_normal: float = field(init=False)
    min_normal: float = field(init=False)
    min_subnormal: float = field(init=False)

    def __post_init__(self) -> None:
        if self.kind == "int":
            bias, emax = 0, 0
            ulp = 2.0 ** -(self.bits - 2)
            max_normal = (2 ** (self.bits - 1) - 1) * ulp
            min_normal = min_subnormal = ulp
        else:
            bias = 2 ** (self.ebits - 1) - 1
            top = 2**self.ebits - 1  # largest exponent field
            top_mant = 2**self.mbits - 1
            if self.specials == "ieee":
                top -= 1
            elif self.specials == "fn":
                top_mant -= 1
            emax = top - bias
            max_normal = 2.0**emax * (1 + top_mant / 2**self.mbits)
            min_normal = 2.0 ** (1 - bias)
            min_subnormal = 2.0 ** (1 - bias - self.mbits)
        for name, value in (
            ("bias", bias),
            ("emax", emax),
            ("max_normal", max_normal),
            ("min_normal", min_normal),
            ("min_subnormal", min_subnormal),
        ):
            object.__setattr__(self, name, value)

    def grid(self) -> torch.Tensor:
        """All finite non-negative element values, ascending, float64."""
        import torch

        values = self.decode(torch.arange(2 ** (self.bits - 1), dtype=torch.uint8))
        return values[torch.isfinite(values)].to(torch.float64)

    # ---- torch encode/decode (exact) -------------------------------------------------------

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """uint8 codes (any shape, low ``bits`` bits used) → float32 element values, exact."""
        import torch

        table = _decode_table_on(self, codes.device)
        return table[codes.to(torch.int64) & (2**self.bits - 1)]

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        """Element values on this format's grid (finite, |v| ≤ max_normal) → uint8 codes.

        The sign of zero is kept for float formats (``-0.0`` → sign bit set), as ml_dtypes does.
        """
        import torch

        if self.kind == "int":
            q = torch.round(values.to(torch.float64) * 2 ** (self.bits - 2)).to(torch.int32)
            return (q & (2**self.bits - 1)).to(torch.uint8)
        # Codes 0..2**(bits-1)-1 are the non-negative values in ascending order.
        grid = self.grid().to(device=values.device, dtype=values.dtype)
        mag = torch.searchsorted(grid, values.abs()).to(torch.int32)
        return (mag | (torch.signbit(values).to(torch.int32) << (self.bits - 1))).to(torch.uint8)


@functools.cache
def _decode_table(fmt: Format) -> torch.Tensor:
    """float32 ``[2**bits]``: the value of every code, from the format's fields."""
    import torch

    c = torch.arange(2**fmt.bits, dtype=torch.int32)
    if fmt.kind == "int":
        signed = torch.where(c >= 2 ** (fmt.bits - 1), c - 2**fmt.bits, c)
        return signed.to(torch.float32) * fmt.min_subnormal
    sign = (c >> (fmt.bits - 1)) & 1
    exp = (c >> fmt.mbits) & (2**fmt.ebits - 1)
    mant = (c & (2**fmt.mbits - 1)).to(torch.float64)
    sub = mant * fmt.min_subnormal
    norm = torch.ldexp(1 + mant / 2**fmt.mbits, (exp - fmt.bias).to(torch.float64))
    mag = torch.where(exp == 0, sub, norm)
    all_ones = exp == 2**fmt.ebits - 1
    if fmt.specials == "ieee":
        mag = torch.where(all_ones, torch.where(mant == 0, math.inf, math.nan), mag)
    elif fmt.specials == "fn":
        mag = torch.where(all_ones & (mant == 2**fmt.mbits - 1), math.nan, mag)
    return torch.where(sign == 1, -mag, mag).to(torch.float32)


@functools.cache
def _decode_table_on(fmt: Format, device: torch.device) -> torch.Tensor:
    """:func:`_decode_table` on ``device``, kept (no host-to-device copy per call, CUDA-graph safe)."""
    return _decode_table(fmt).to(device)


def _float(name: str, bits: int, ebits: int, specials: str = "none", oracle: str | None = None):
    return Format(name, "float", bits, ebits, bits - 1 - ebits, specials, MX_BLOCK_SIZE, oracle)


def _int(name: str, bits: int) -> Format:
    return Format(name, "int", bits, 0, bits - 1, "none", MX_BLOCK_SIZE, None)


_FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        _float("mxfp8_e4m3", 8, 4, "fn", "float8_e4m3fn"),
        _float("mxfp8_e5m2", 8, 5, "ieee", "float8_e5m2"),
        _float("mxfp6_e3m2", 6, 3, "none", "float6_e3m2fn"),
        _float("mxfp6_e2m3", 6, 2, "none", "float6_e2m3fn"),
        _float("mxfp4", 4, 2, "none", "float4_e2m1fn"),
        _int("mxint8", 8),
        *(_int(f"bfp{m}", m) for m in range(2, 9)),
    )
}


def names() -> list[str]:
    """Registered format names."""
    return list(_FORMATS)


def get(fmt: str | Format) -> Format:
    """The :class:`Format` called ``fmt`` (a Format is returned as is).

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    if isinstance(fmt, Format):
        return fmt
    try:
        return _FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown format {fmt!r}; known formats: {', '.join(_FORMATS)}") from None


def check_block_size(block_size: int | None, fmt: Format) -> int:
    """``block_size`` validated (``None`` → the format's default)."""
    if block_size is None:
        return fmt.block_size
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in BLOCK_SIZES:
        raise ValueError(
            f"block_size must be a power of two in {BLOCK_SIZES[0]}..{BLOCK_SIZES[-1]}, got {block_size!r}"
        )
    return block_size
