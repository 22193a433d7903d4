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
    [(4, 32, (32, 2, 16)), (6, 32, (32, 4, 8)), (8, 64, (32, 1, 32)), (3, 8, (8, 8, 1))],
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


@pytest.mark.parametrize(("bits", "lanes"), [(6, 16), (6, 8), (5, 8), (3, 16), (7, 8), (4, 16)])
def test_cpu_planes_put_each_lane_step_in_consecutive_bytes(bits, lanes):
    """In the CPU plane order every element's bits are where `cpu_position` says, and the bytes a
    kernel step reads (step ``p``, lanes ``0..lanes-1``) are consecutive with one shift per plane."""
    per = 8 // min(layout.plane_widths(bits))
    k = lanes * per * 3
    g = torch.Generator().manual_seed(bits * 100 + lanes)
    codes = torch.randint(0, 2**bits, (5, k), generator=g, dtype=torch.uint8)
    planes = layout.cpu_planes(packing.pack(codes, bits), bits, lanes)
    off = 0
    for plane, w in zip(planes, layout.plane_widths(bits), strict=True):
        q = 8 // w
        assert plane.shape == (5, k * w // 8)
        at = layout.cpu_position(torch.arange(k), bits, lanes, w)
        assert sorted(at.tolist()) == list(range(k))  # a permutation
        assert torch.equal(packing.unpack(plane, w)[:, at], (codes >> off) & (2**w - 1))
        for grp, p in itertools.product(range(3), range(per)):
            ks = grp * lanes * per + torch.arange(lanes) * per + p  # the lanes of one step
            pos = layout.cpu_position(ks, bits, lanes, w)
            assert torch.equal(pos // q, pos[0] // q + torch.arange(lanes)) and bool(
                (pos % q == pos[0] % q).all()
            )
        off += w
    if len(planes) == 1:  # one plane: the portable bytes as they are
        assert torch.equal(planes[0], packing.pack(codes, bits))
