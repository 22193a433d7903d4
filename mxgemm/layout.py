"""Kernel layout of packed weights (`transform_weight`): codes split into bit planes of 8, 4, 2 or 1 bits.

The portable layout packs ``bits``-wide codes as one bitstream, so 3/5/6/7-bit codes straddle bytes
and a kernel needs two reads and a funnel shift per element (which also defeats TVM's GEMV analysis).
The kernel layout splits each code into planes whose widths divide 8, low bits first (6 = 4 + 2,
5 = 4 + 1, 3 = 2 + 1, 7 = 4 + 2 + 1); each plane is a portable bitstream of its width, so every
element is one aligned sub-byte read per plane. 8-, 4- and 2-bit codes are a single plane: the
portable bytes themselves (no copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mxgemm import formats, packing

if TYPE_CHECKING:  # pragma: no cover
    from mxgemm.weight import MxWeight

PLANES = {8: (8,), 4: (4,), 2: (2,), 1: (1,), 6: (4, 2), 5: (4, 1), 3: (2, 1), 7: (4, 2, 1)}


def plane_widths(bits: int) -> tuple[int, ...]:
    """Widths of the planes of a ``bits``-wide code, low bits first."""
    try:
        return PLANES[bits]
    except KeyError:
        raise ValueError(f"no plane layout for {bits}-bit codes (1..8)") from None


def to_planes(blocks: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """Portable uint8 ``[..., K*bits/8]`` → planes, uint8 ``[..., K*w/8]`` for each width ``w``."""
    widths = plane_widths(bits)
    if len(widths) == 1:
        return [blocks]
    codes = packing.unpack(blocks, bits)
    planes, off = [], 0
    for w in widths:
        planes.append(packing.pack((codes >> off) & (2**w - 1), w))
        off += w
    return planes


def from_planes(planes: list[torch.Tensor], bits: int) -> torch.Tensor:
    """Inverse of :func:`to_planes`."""
    widths = plane_widths(bits)
    if len(widths) == 1:
        return planes[0]
    codes, off = None, 0
    for p, w in zip(planes, widths, strict=True):
        part = packing.unpack(p, w).to(torch.int32) << off
        codes = part if codes is None else codes | part
        off += w
    return packing.pack(codes.to(torch.uint8), bits)


def transform_weight(q: MxWeight, kernel: object = None) -> list[torch.Tensor]:
    """The tensors a kernel reads for ``q``, in its argument order: the code planes, then the scales.

    Args:
        q: 2-D `MxWeight` ``[n, k]`` in the portable layout.
        kernel: the kernel the weight is for (a :class:`mxgemm.codegen.build.Kernel`): the CPU
            kernels of rules ``cpu_gemv`` and ``cpu_dequant`` read 3/5/6/7-bit codes from the planes
            of :func:`cpu_planes` (:func:`kernel_lanes`), every other kernel those of :func:`to_planes`.
    Returns:
        ``[plane_0, ..., scales]``: uint8 ``[n, k*w/8]`` per plane width ``w``, uint8 ``[n, k/block]``.
    """
    lanes = kernel_lanes(kernel)
    bits = q.format.bits
    planes = to_planes(q.blocks, bits) if lanes is None else cpu_planes(q.blocks, bits, lanes)
    return [*planes, q.scales]


def kernel_lanes(kernel: object) -> int | None:
    """The lane count of the CPU plane order (:func:`cpu_planes`) that ``kernel`` reads its planes
    in, None for the order of :func:`to_planes` (GPU kernels, the dynamic-M CPU kernel, None)."""
    rule = getattr(kernel, "rule", None)
    if rule == "cpu_gemv":
        return kernel.info["hints"]["lanes"]
    if rule == "cpu_dequant":
        spec = kernel.spec
        return cpu_group(formats.get(spec.fmt).bits, spec.block_size)[2]
    return None


CPU_LANES = 32  # codes of one byte-vector load in the CPU decode, at most


def codes_per_byte(bits: int) -> int:
    """Codes a byte of the narrowest plane of ``bits``-wide codes holds (the CPU kernels' ``per``)."""
    return 8 // min(plane_widths(bits))


def cpu_group(bits: int, block_size: int) -> tuple[int, int, int]:
    """(group, per, lanes) of the CPU decode's K order for ``bits``-wide codes in blocks of
    ``block_size``: ``per`` codes a byte of the narrowest plane, ``lanes`` codes a byte-vector load
    (up to :data:`CPU_LANES`, and few enough that one vector holds one block's codes: its scale is one
    broadcast), ``group = lanes * per`` consecutive K elements permuted together (:func:`k_permuted`)."""
    per = codes_per_byte(bits)
    lanes = max(1, min(CPU_LANES, block_size // per))
    return lanes * per, per, lanes


def k_permuted(x: torch.Tensor, bits: int, block_size: int) -> torch.Tensor:
    """``x [..., k]`` in the K order the CPU decode writes W in: element ``g·group + l·per + p``
    (``l < lanes``, ``p < per``, :func:`cpu_group`) moves to ``g·group + p·lanes + l``, so the
    ``lanes`` codes of one byte vector land on consecutive positions. A new contiguous tensor."""
    group, per, lanes = cpu_group(bits, block_size)
    k = x.shape[-1]
    return x.reshape(*x.shape[:-1], k // group, lanes, per).transpose(-1, -2).reshape(x.shape).contiguous()


def cpu_position(k, bits: int, lanes: int, width: int):
    """Where element ``k`` (an int, a tensor or a TIR expression) of a ``width``-bit plane sits in the
    CPU plane order (:func:`cpu_planes`) for ``bits``-wide codes read ``lanes`` at a time: with
    ``per`` codes a byte of the narrowest plane, ``q = 8 / width`` of this one, ``G = lanes · per``
    and ``k = g·G + l·per + p`` (``l < lanes``, ``p < per``), position ``g·G + (p // q)·lanes·q + l·q
    + p % q``. The byte a lane reads at unrolled step ``p`` is then ``g·G/q + (p // q)·lanes + l``,
    consecutive over ``l``, at a constant shift. The narrowest plane keeps its order (``q = per``)."""
    per = codes_per_byte(bits)
    q = 8 // width
    if q == per:
        return k
    group = lanes * per
    r = k % group
    p = r % per
    return k - r + (p // q) * (lanes * q) + (r // per) * q + p % q


def cpu_planes(blocks: torch.Tensor, bits: int, lanes: int) -> list[torch.Tensor]:
    """The code planes of portable ``blocks`` (uint8 ``[..., K*bits/8]``) in the CPU kernels' order
    for ``lanes`` (:func:`cpu_position`; K a multiple of ``lanes · per``): what their reads of 3/5/6/7-bit
    codes take, one contiguous byte vector per plane and step. 8/4/2/1-bit codes: ``[blocks]``."""
    widths = plane_widths(bits)
    if len(widths) == 1:
        return [blocks]
    codes = packing.unpack(blocks, bits)
    k = torch.arange(codes.shape[-1])
    planes, off = [], 0
    for w in widths:
        part = (codes >> off) & (2**w - 1)
        moved = torch.empty_like(part)
        moved[..., cpu_position(k, bits, lanes, w)] = part
        planes.append(packing.pack(moved, w))
        off += w
    return planes
