"""The portable packed layout: ``bits``-wide element codes packed along the last axis into uint8.

Codes form a little-endian bitstream: element ``j`` of a row occupies bits ``[j*bits, (j+1)*bits)``,
bit ``i`` of the stream being bit ``i % 8`` of byte ``i // 8``. So fp4 packs two per byte with the even
index in the low nibble (OCP / torchao ``pack_uint4`` / HF ``*_blocks``), fp6 four values per three
bytes, 8-bit codes one per byte, and BFP m<8 eight values per m bytes (the OCP / torchao order).
"""

from __future__ import annotations

import torch


def packed_len(k: int, bits: int) -> int:
    """Bytes that ``k`` codes of ``bits`` bits take (``k * bits`` must be a multiple of 8)."""
    if (k * bits) % 8:
        raise ValueError(f"{k} codes of {bits} bits do not fill whole bytes")
    return k * bits // 8


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[..., K]`` (values < 2**bits, K a multiple of 8) → uint8 ``[..., K*bits/8]``."""
    if bits == 8:
        return codes.contiguous()
    *lead, k = codes.shape
    if k % 8:
        raise ValueError(f"pack: the last dimension ({k}) must be a multiple of 8 to pack {bits}-bit codes")
    groups = codes.reshape(*lead, k // 8, 8).to(torch.int64)
    shifts = torch.arange(8, device=codes.device, dtype=torch.int64) * bits
    word = (groups << shifts).sum(-1, keepdim=True)  # 8 codes in 8*bits <= 56 bits
    out = (word >> (8 * torch.arange(bits, device=codes.device, dtype=torch.int64))) & 0xFF
    return out.to(torch.uint8).reshape(*lead, packed_len(k, bits))


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 ``[..., K*bits/8]`` → uint8 codes ``[..., K]``; the exact inverse of :func:`pack`."""
    if bits == 8:
        return packed.contiguous()
    *lead, nbytes = packed.shape
    if nbytes % bits:
        raise ValueError(
            f"unpack: the last dimension ({nbytes} bytes) must be a multiple of {bits} for {bits}-bit codes"
        )
    groups = packed.reshape(*lead, nbytes // bits, bits).to(torch.int64)
    word = (groups << (8 * torch.arange(bits, device=packed.device, dtype=torch.int64))).sum(-1, keepdim=True)
    codes = (word >> (torch.arange(8, device=packed.device, dtype=torch.int64) * bits)) & (2**bits - 1)
    return codes.to(torch.uint8).reshape(*lead, nbytes // bits * 8)
