"""mxgemm.packing: the portable little-endian bitstream layout along K."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mxgemm
from mxgemm import packing

BITS = list(range(2, 9))


def _reference_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Row by row through one Python int: code j at bits [j*bits, (j+1)*bits), bytes little-endian."""
    *lead, k = codes.shape
    rows = codes.reshape(-1, k)
    out = np.zeros((rows.shape[0], k * bits // 8), dtype=np.uint8)
    for i, row in enumerate(rows):
        stream = sum(int(c) << (j * bits) for j, c in enumerate(row))
        out[i] = np.frombuffer(stream.to_bytes(k * bits // 8, "little"), dtype=np.uint8)
    return out.reshape(*lead, k * bits // 8)


@st.composite
def _codes(draw, bits: int | None = None) -> tuple[np.ndarray, int]:
    bits = draw(st.sampled_from(BITS)) if bits is None else bits
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    k = 8 * draw(st.integers(1, 6))
    codes = draw(hnp.arrays(np.uint8, (*lead, k), elements=st.integers(0, 2**bits - 1)))
    return codes, bits


@settings(deadline=None, max_examples=200)
@given(_codes())
def test_pack_matches_bitstream_and_unpack_inverts(case):
    codes, bits = case
    packed = packing.pack(torch.from_numpy(codes), bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (*codes.shape[:-1], codes.shape[-1] * bits // 8)
    np.testing.assert_array_equal(packed.numpy(), _reference_pack(codes, bits))
    unpacked = packing.unpack(packed, bits)
    assert unpacked.dtype == torch.uint8
    np.testing.assert_array_equal(unpacked.numpy(), codes)


@settings(deadline=None, max_examples=100)
@given(bits=st.sampled_from(BITS), data=st.data())
def test_every_byte_string_unpacks_and_packs_back(bits, data):
    """Every bit of the packed bytes belongs to exactly one code: pack ∘ unpack is the identity too."""
    n = bits * data.draw(st.integers(1, 4))
    raw = data.draw(hnp.arrays(np.uint8, (2, n)))
    codes = packing.unpack(torch.from_numpy(raw), bits)
    assert codes.shape == (2, n * 8 // bits)
    assert int(codes.max()) < 2**bits
    np.testing.assert_array_equal(packing.pack(codes, bits).numpy(), raw)


def test_fp4_low_nibble_is_even_index():
    codes = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 0xF, 0x0, 0x0, 0xF, 0, 0, 0, 0], dtype=torch.uint8)
    packed = packing.pack(codes, 4)
    assert packed.tolist() == [0x21, 0x43, 0x65, 0x87, 0x0F, 0xF0, 0x00, 0x00]
    assert torch.equal(packing.unpack(packed, 4), codes)


def test_fp6_four_values_in_three_bytes():
    # stream = 1 | 2 << 6 | 3 << 12 | 63 << 18 = 0xFC3081 -> bytes 81 30 FC; second group: 63 at index 7
    # sits in bits 42..47 (byte 5, bits 2..7), 1 at index 4 in bits 24..29 (byte 3).
    codes = torch.tensor([[1, 2, 3, 63, 1, 0, 0, 63]], dtype=torch.uint8)
    packed = packing.pack(codes, 6)
    assert packed.tolist() == [[0x81, 0x30, 0xFC, 0x01, 0x00, 0xFC]]
    assert torch.equal(packing.unpack(packed, 6), codes)


def test_three_bit_codes_cross_byte_boundaries():
    codes = torch.tensor([0, 0, 7, 0, 0, 0, 0, 7], dtype=torch.uint8)  # bits 6..8 and 21..23
    assert packing.pack(codes, 3).tolist() == [0xC0, 0x01, 0xE0]


def test_eight_bit_codes_are_stored_as_is():
    codes = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    assert torch.equal(packing.pack(codes, 8), codes)
    assert torch.equal(packing.unpack(codes, 8), codes)


@pytest.mark.parametrize("bits", BITS)
def test_noncontiguous_input(bits):
    codes = torch.randint(0, 2**bits, (16, 5), dtype=torch.uint8)
    want = _reference_pack(codes.t().numpy(), bits)
    np.testing.assert_array_equal(packing.pack(codes.t(), bits).numpy(), want)


@pytest.mark.parametrize(
    "k, bits, size",
    [
        (32, 4, 16),
        (32, 6, 24),
        (32, 8, 32),
        (8, 2, 2),
        (8, 3, 3),
        (256, 5, 160),
        (4, 4, 2),
        (4, 6, 3),
        (0, 4, 0),
    ],
)
def test_packed_len(k, bits, size):
    assert packing.packed_len(k, bits) == size


@pytest.mark.parametrize("k, bits", [(1, 4), (3, 6), (5, 7), (2, 3)])
def test_packed_len_rejects_partial_bytes(k, bits):
    with pytest.raises(ValueError, match=f"{k} codes of {bits} bits"):
        packing.packed_len(k, bits)


def test_quantized_mxfp4_blocks_use_the_portable_layout():
    """End to end: element codes of mxfp4 (e2m1) land in the bytes as OCP / HF ``*_blocks`` have them."""
    x = torch.tensor([[0.5, 1.0, 4.0, -6.0, -0.0, 3.0, 1.5, -0.5]])  # amax 6: scale 2**0 (floor)
    q = mxgemm.quantize(x, "mxfp4", block_size=8)
    assert q.scales.tolist() == [[127]]
    assert q.codes().tolist() == [[0x1, 0x2, 0x6, 0xF, 0x8, 0x5, 0x3, 0x9]]
    assert q.blocks.tolist() == [[0x21, 0xF6, 0x58, 0x93]]


def test_quantized_mxfp6_blocks_use_the_portable_layout():
    # e2m3 codes: 1.0 -> 0b001000, 7.5 -> 0b011111, -0.125 -> 0b100001, 0 -> 0.
    x = torch.tensor([[1.0, 7.5, -0.125, 0.0, 0.0, 0.0, 0.0, 0.0]])  # amax 7.5: scale 2**0
    q = mxgemm.quantize(x, "mxfp6_e2m3", block_size=8)
    assert q.codes().tolist() == [[0x08, 0x1F, 0x21, 0, 0, 0, 0, 0]]
    stream = 0x08 | 0x1F << 6 | 0x21 << 12
    assert q.blocks.tolist() == [list(stream.to_bytes(6, "little"))]
