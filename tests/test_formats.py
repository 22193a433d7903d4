"""mxgemm.formats: element decode/encode against ml_dtypes, documented constants, the registry."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from mxgemm import formats
from tests import oracle

FLOAT_FORMATS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4"]
INT_FORMATS = ["mxint8", *(f"bfp{m}" for m in range(2, 9))]
ALL_FORMATS = FLOAT_FORMATS + INT_FORMATS

# OCP MX v1.0 / ml_dtypes: name -> (bits, ebits, mbits, emax, max normal, min normal, min subnormal, oracle).
DESIGN_TABLE = {
    "mxfp8_e4m3": (8, 4, 3, 8, 448.0, 2.0**-6, 2.0**-9, "float8_e4m3fn"),
    "mxfp8_e5m2": (8, 5, 2, 15, 57344.0, 2.0**-14, 2.0**-16, "float8_e5m2"),
    "mxfp6_e3m2": (6, 3, 2, 4, 28.0, 0.25, 0.0625, "float6_e3m2fn"),
    "mxfp6_e2m3": (6, 2, 3, 2, 7.5, 1.0, 0.125, "float6_e2m3fn"),
    "mxfp4": (4, 2, 1, 2, 6.0, 1.0, 0.5, "float4_e2m1fn"),
}


def test_names_lists_every_format():
    assert sorted(formats.names()) == sorted(ALL_FORMATS)
    assert set(formats.names()) == set(oracle.SPECS)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_get_returns_named_format_and_passes_formats_through(name):
    f = formats.get(name)
    assert f.name == name
    assert formats.get(f) is f


@pytest.mark.parametrize("bad", ["mxfp3", "MXFP4", "", None, 4, ["mxfp4"]])
def test_get_unknown_raises_listing_known_names(bad):
    with pytest.raises(ValueError) as info:
        formats.get(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name in ALL_FORMATS:
        assert name in message


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_float_constants_match_design_table_and_ml_dtypes(name):
    f = formats.get(name)
    bits, ebits, mbits, emax, max_normal, min_normal, min_subnormal, oracle_name = DESIGN_TABLE[name]
    assert f.kind == "float"
    assert (f.bits, f.ebits, f.mbits, f.emax) == (bits, ebits, mbits, emax)
    assert (f.max_normal, f.min_normal, f.min_subnormal) == (max_normal, min_normal, min_subnormal)
    assert f.oracle == oracle_name
    assert f.bias == 2 ** (ebits - 1) - 1
    fi = ml_dtypes.finfo(getattr(ml_dtypes, oracle_name))
    assert (fi.bits, fi.nexp, fi.nmant, fi.maxexp - 1) == (f.bits, f.ebits, f.mbits, f.emax)
    assert float(fi.max) == f.max_normal
    assert float(fi.smallest_normal) == f.min_normal
    assert float(fi.smallest_subnormal) == f.min_subnormal


@pytest.mark.parametrize("name", INT_FORMATS)
def test_int_constants(name):
    f = formats.get(name)
    m = 8 if name == "mxint8" else int(name[3:])
    assert f.kind == "int"
    assert (f.bits, f.ebits, f.mbits, f.emax, f.bias) == (m, 0, m - 1, 0, 0)
    assert f.max_normal == (2 ** (m - 1) - 1) * 2.0 ** -(m - 2)
    assert f.min_subnormal == 2.0 ** -(m - 2)
    assert f.oracle is None
    if m == 8:
        assert f.max_normal == 127 / 64  # OCP MX v1.0: 6 fraction bits, max 127/64


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_default_block_size_is_mx_32(name):
    assert formats.get(name).block_size == 32


def test_mxint8_is_bfp8_with_mx_block():
    a, b = formats.get("mxint8"), formats.get("bfp8")
    for attr in (
        "kind",
        "bits",
        "ebits",
        "mbits",
        "bias",
        "emax",
        "max_normal",
        "min_normal",
        "min_subnormal",
        "specials",
        "block_size",
    ):
        assert getattr(a, attr) == getattr(b, attr), attr
    codes = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(a.decode(codes), b.decode(codes))


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_decode_every_code_matches_ml_dtypes(name):
    f = formats.get(name)
    codes = np.arange(2**f.bits, dtype=np.uint8)
    expected = codes.view(getattr(ml_dtypes, f.oracle)).astype(np.float32)
    oracle.assert_same_floats(f.decode(torch.from_numpy(codes)).numpy(), expected)


@pytest.mark.parametrize("name", ["mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "bfp2", "bfp5"])
def test_decode_ignores_bits_above_the_width(name):
    f = formats.get(name)
    codes = torch.arange(2**f.bits, dtype=torch.uint8)
    high = codes | (0xFF << f.bits & 0xFF)
    oracle.assert_same_floats(f.decode(high).numpy(), f.decode(codes).numpy())


@pytest.mark.parametrize("name", INT_FORMATS)
def test_decode_int_is_twos_complement_times_ulp(name):
    f = formats.get(name)
    expected = [
        (c - 2**f.bits if c >= 2 ** (f.bits - 1) else c) * 2.0 ** -(f.bits - 2) for c in range(2**f.bits)
    ]
    got = f.decode(torch.arange(2**f.bits, dtype=torch.uint8))
    assert got.dtype == torch.float32
    assert got.tolist() == expected


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_encode_inverts_decode_on_every_finite_code(name):
    f = formats.get(name)
    codes = torch.arange(2**f.bits, dtype=torch.uint8)
    values = f.decode(codes)
    keep = torch.isfinite(values)
    if f.kind == "int":
        keep &= codes != 2 ** (f.bits - 1)  # -2**(M-1): never produced
    assert torch.equal(f.encode(values[keep]), codes[keep])


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_encode_keeps_sign_of_zero(name):
    f = formats.get(name)
    got = f.encode(torch.tensor([0.0, -0.0]))
    assert got.tolist() == [0, 2 ** (f.bits - 1)]


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_grid_is_the_oracle_grid(name):
    g = formats.get(name).grid()
    assert g.dtype == torch.float64
    np.testing.assert_array_equal(g.numpy(), oracle.SPECS[name].grid)
    assert g[0] == 0 and g[-1] == formats.get(name).max_normal
    assert torch.all(g[1:] > g[:-1])


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_oracle_spec_agrees_on_range(name):
    f, spec = formats.get(name), oracle.SPECS[name]
    assert (spec.bits, spec.emax, spec.max_normal) == (f.bits, f.emax, f.max_normal)
    assert spec.emax == math.floor(math.log2(f.max_normal))


@pytest.mark.parametrize("size", formats.BLOCK_SIZES)
def test_check_block_size_accepts_powers_of_two_8_to_256(size):
    assert formats.check_block_size(size, formats.get("mxfp4")) == size


def test_block_sizes_are_8_to_256():
    assert formats.BLOCK_SIZES == (8, 16, 32, 64, 128, 256)


def test_check_block_size_none_gives_format_default():
    assert formats.check_block_size(None, formats.get("bfp4")) == 32


@pytest.mark.parametrize("bad", [4, 48, 512, 0, -32, 1, True, "32", 32.0])
def test_check_block_size_rejects(bad):
    with pytest.raises(ValueError, match="block_size") as info:
        formats.check_block_size(bad, formats.get("mxfp4"))
    assert repr(bad) in str(info.value)
