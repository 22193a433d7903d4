"""Kernel layout: bit planes round-trip exactly and hold the codes' bits low-first."""

import itertools

import numpy as np
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


@pytest.mark.parametrize("bits", [4, 8])
def test_frag_order_gives_each_lane_its_fragment_codes_in_one_run(bits):
    """Lane ``j`` of a quad takes, of 32-K step ``u`` of a 128-K group, the codes at K ``32u + 2j +
    (0, 1, 8, 9, 16, 17, 24, 25)`` (the ``mma.m16n8k16`` / ``wgmma`` A fragment of its rows); in
    fragment order they are bytes ``16j + 4u ..`` (4-bit, two a byte, low nibble first) or ``32j +
    8u ..`` (8-bit) of the group: one run a lane."""
    rng = np.random.default_rng(bits)
    n, k = 3, 384
    codes = torch.from_numpy(rng.integers(0, 2**bits, (n, k), dtype=np.uint8))
    frag = layout.frag_order(packing.pack(codes, bits), bits)
    assert frag.shape == (n, k * bits // 8) and frag.dtype == torch.uint8
    got = packing.unpack(frag, bits)  # position p of the result: the code frag order put there
    for g, u, j, row in itertools.product(range(k // 128), range(4), range(4), range(n)):
        want = [codes[row, 128 * g + 32 * u + 2 * j + t] for t in (0, 1, 8, 9, 16, 17, 24, 25)]
        start = 128 * g + 32 * j + 8 * u  # (codes; bytes: start * bits / 8)
        assert got[row, start : start + 8].tolist() == [int(c) for c in want]
    assert sorted(layout.frag_perm().tolist()) == list(range(128))


def test_frag_order_names_what_it_cannot_take():
    with pytest.raises(ValueError, match="4- or 8-bit codes, not 6-bit"):
        layout.frag_order(torch.zeros(2, 96, dtype=torch.uint8), 6)
    with pytest.raises(ValueError, match="K=192 is not a multiple"):
        layout.frag_order(torch.zeros(2, 96, dtype=torch.uint8), 4)
