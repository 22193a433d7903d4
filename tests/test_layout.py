"""Kernel layout: bit planes round-trip exactly and hold the codes' bits low-first."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mxgemm
from mxgemm import layout, packing


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), rows=st.integers(0, 3), groups=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_planes_round_trip(bits, rows, groups, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (rows, 8 * groups), generator=g, dtype=torch.uint8)
    blocks = packing.pack(codes, bits)
    planes = layout.to_planes(blocks, bits)
    assert sum(layout.plane_widths(bits)) == bits and all(8 % w == 0 for w in layout.plane_widths(bits))
    assert sum(p.shape[-1] for p in planes) == blocks.shape[-1]  # no bytes added
    assert torch.equal(layout.from_planes(planes, bits), blocks)
    off = 0
    for p, w in zip(planes, layout.plane_widths(bits), strict=True):
        assert torch.equal(packing.unpack(p, w), (codes >> off) & (2**w - 1))
        off += w


def test_power_of_two_widths_are_the_portable_bytes():
    q = mxgemm.quantize(torch.randn(4, 64), "mxfp4")
    planes = mxgemm.transform_weight(q)
    assert planes[0] is q.blocks and planes[-1] is q.scales and len(planes) == 2


def test_fp6_is_a_4_bit_and_a_2_bit_plane():
    q = mxgemm.quantize(torch.randn(4, 64), "mxfp6_e3m2")
    p4, p2, s = mxgemm.transform_weight(q)
    assert p4.shape == (4, 32) and p2.shape == (4, 16) and s is q.scales


def test_bad_width():
    with pytest.raises(ValueError, match="no plane layout for 9-bit"):
        layout.plane_widths(9)


@pytest.mark.parametrize(
    ("bits", "block", "want"),
    [(4, 32, (32, 2, 16)), (6, 32, (32, 1, 32)), (8, 64, (32, 1, 32)), (3, 8, (8, 1, 8)), (2, 8, (8, 4, 2))],
)
def test_cpu_k_order(bits, block, want):
    """Each byte-vector of the CPU decode holds codes of one scale block; ``k_permuted`` moves element
    ``g·group + l·per + p`` to ``g·group + p·lanes + l``."""
    assert layout.cpu_group(bits, block) == want
    group, per, lanes = want
    k = 3 * group
    x = torch.arange(2 * k).reshape(2, k)
    got = layout.k_permuted(x, bits, block)
    for g, lane, p in itertools.product(range(3), range(lanes), range(per)):
        assert got[1, g * group + p * lanes + lane] == x[1, g * group + lane * per + p]


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
def test_cpu_planes_hold_odd_width_codes_one_a_byte(bits):
    """The CPU kernels' codes: one byte a code (the code in its low bits) for 3/5/6/7-bit codes, the
    portable bytes as they are for 8/4/2/1 bits; ``transform_weight`` gives them to the CPU rules."""
    k = 96
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (5, k), generator=g, dtype=torch.uint8)
    portable = packing.pack(codes, bits)
    planes = layout.cpu_planes(portable, bits)
    assert len(planes) == 1 and planes[0].dtype == torch.uint8
    if 8 % bits:
        assert layout.cpu_widths(bits) == (8,) and layout.codes_per_byte(bits) == 1
        assert torch.equal(planes[0], codes)
    else:
        assert layout.cpu_widths(bits) == (bits,) and layout.codes_per_byte(bits) == 8 // bits
        assert planes[0] is portable
