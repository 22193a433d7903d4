"""Kernel layout of packed weights (`transform_weight`): codes split into bit planes of 8, 4, 2 or 1 bits.

The portable layout packs ``bits``-wide codes as one bitstream, so 3/5/6/7-bit codes straddle bytes
and a kernel needs two reads and a funnel shift per element (which also defeats TVM's GEMV analysis).
The kernel layout splits each code into planes whose widths divide 8, low bits first (6 = 4 + 2,
5 = 4 + 1, 3 = 2 + 1, 7 = 4 + 2 + 1); each plane is a portable bitstream of its width, so every
element is one aligned sub-byte read per plane. 8-, 4- and 2-bit codes are a single plane: the
portable bytes themselves (no copy). :func:`frag_order` permutes one plane of 4- or 8-bit codes within
each 128-K group so a tensor-core lane's fragment codes are one run (read by the ``frag`` hints of the
``mma`` and ``wgmma_w`` kernels; not yet a layout a layer holds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mxgemm import packing

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
            kernels of rules ``cpu_gemv`` and ``cpu_dequant`` read 3/5/6/7-bit codes one byte a code
            (:func:`cpu_planes`, :func:`reads_cpu_layout`), those of rule ``cpu_dot`` codes and
            scales in 16-row tiles (:func:`pair_tiles`, :func:`scale_tiles`), every other kernel the
            planes of :func:`to_planes`.
    Returns:
        ``[plane_0, ..., scales]``: uint8 ``[n, k*w/8]`` per plane width ``w`` (CPU kernels: ``w`` of
        :func:`cpu_widths`), uint8 ``[n, k/block]``; for ``cpu_dot``, the two tensors of
        :func:`pair_tiles` and :func:`scale_tiles`.
    """
    bits = q.format.bits
    if kernel_layout(kernel) == "tiles":
        return [pair_tiles(cpu_planes(q.blocks, bits)[0], bits), scale_tiles(q.scales, q.block_size)]
    planes = cpu_planes(q.blocks, bits) if reads_cpu_layout(kernel) else to_planes(q.blocks, bits)
    return [*planes, q.scales]


def reads_cpu_layout(kernel: object) -> bool:
    """Whether ``kernel`` reads its codes in the CPU layout (:func:`cpu_planes`): the kernels of rules
    ``cpu_gemv`` and ``cpu_dequant``; GPU kernels, the dynamic-M CPU kernel and None read
    :func:`to_planes`."""
    return getattr(kernel, "rule", None) in ("cpu_gemv", "cpu_dequant")


def kernel_layout(kernel: object) -> str:
    """The name of the layout ``kernel`` reads its weight in (:func:`transform_weight`): ``"tiles"``
    (rule ``cpu_dot``), ``"cpu"`` (:func:`reads_cpu_layout`) or ``"planes"``."""
    if getattr(kernel, "rule", None) == "cpu_dot":
        return "tiles"
    return "cpu" if reads_cpu_layout(kernel) else "planes"


CPU_LANES = 32  # codes of one byte-vector load in the CPU decode, at most


def cpu_widths(bits: int) -> tuple[int, ...]:
    """Widths of the planes the CPU kernels read for ``bits``-wide codes: the single plane of 8/4/2/1-bit
    codes, and one byte a code (``(8,)``) for 3/5/6/7-bit codes (:func:`cpu_planes`)."""
    widths = plane_widths(bits)
    return widths if len(widths) == 1 else (8,)


def read_widths(bits: int, cpu: bool = False) -> tuple[int, ...]:
    """Widths of the planes a kernel reads: :func:`cpu_widths` for the CPU rules' layout, else
    :func:`plane_widths`."""
    return cpu_widths(bits) if cpu else plane_widths(bits)


def codes_per_byte(bits: int) -> int:
    """Codes a byte of the CPU kernels' codes holds for ``bits``-wide codes (their ``per``): 8/bits for
    8/4/2/1 bits, 1 for the others (:func:`cpu_widths`)."""
    return 8 // cpu_widths(bits)[0]


def cpu_group(bits: int, block_size: int) -> tuple[int, int, int]:
    """(group, per, lanes) of the CPU decode's K order for ``bits``-wide codes in blocks of
    ``block_size``: ``per`` codes a byte (:func:`codes_per_byte`), ``lanes`` codes a byte-vector load
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


def cpu_planes(blocks: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """The codes the CPU kernels read for portable ``blocks`` (uint8 ``[..., K*bits/8]``): ``[blocks]``
    for 8/4/2/1-bit codes, else one byte a code, uint8 ``[..., K]`` (the code in its low ``bits``).
    A byte vector of those is one load per step and a code one shift to the top of a 32-bit lane, where
    two bit planes took two reads, shifts and masks and an OR: on a 2-core AVX2 Zen 3 the decode of
    mxfp6 took twice mxfp4's from planes (4096², M=1), and about mxfp8's from bytes. It costs 8 bits a
    code in memory, which these compute-bound kernels do not feel."""
    if len(plane_widths(bits)) == 1:
        return [blocks]
    return [packing.unpack(blocks, bits).to(torch.uint8)]


TILE_ROWS = 16  # rows of W per tile of :func:`pair_tiles` (one fp32 vector of output columns)


def pair_tiles(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """The codes of the ``cpu_dot`` kernel for CPU-layout ``codes`` (:func:`cpu_planes`: uint8
    ``[n, k/2]`` for 4-bit codes, a byte a pair of K neighbours, else ``[n, k]``, a byte a code), in
    16-row tiles of 32-byte groups that decode to whole vectors of K pairs: uint8 ``[n/16, k/2, 32]``,
    byte ``2i + e`` of group ``p`` of tile ``t`` the code of row ``16t + i`` at K ``2p + e``; 4-bit
    codes ``[n/16, k/4, 32]``, that byte's low nibble the code at K ``4p + e`` and its high nibble the
    one at ``4p + 2 + e`` (two vectors of pairs a group). ``n`` a multiple of 16."""
    n = codes.shape[0]
    t = n // TILE_ROWS
    if bits == 4:
        c = packing.unpack(codes, 4).to(torch.uint8).reshape(t, TILE_ROWS, -1, 2, 2)
        c = c[..., 0, :] | (c[..., 1, :] << 4)  # [t, 16, k/4, 2]
    else:
        c = codes.reshape(t, TILE_ROWS, -1, 2)
    return c.permute(0, 2, 1, 3).reshape(t, c.shape[2], 2 * TILE_ROWS).contiguous()


def scale_tiles(scales: torch.Tensor, block_size: int) -> torch.Tensor:
    """The scales of the ``cpu_dot`` kernel for uint8 ``scales [n, k/block_size]`` (block a multiple of
    32): uint8 ``[n/16, k/32, 16]``, one scale per 32-wide K block (repeated for larger blocks), the
    16 rows of a tile contiguous."""
    n = scales.shape[0]
    per32 = scales.repeat_interleave(block_size // 32, dim=1) if block_size > 32 else scales
    return per32.reshape(n // TILE_ROWS, TILE_ROWS, -1).transpose(1, 2).contiguous()


FRAG_GROUP = 128  # K of a group that :func:`frag_order` permutes (a ring slot of ``wgmma_w``)


def frag_perm() -> torch.Tensor:
    """int64 ``[128]``: position ``p`` of a group in fragment order holds the code at K ``perm[p]``.
    Lane ``j`` (of a quad) of an ``mma.sync.m16n8k16`` / ``wgmma`` A fragment takes, of each 32-K
    step ``u``, the codes at K ``32u + 2j + (0, 1, 8, 9, 16, 17, 24, 25)``; fragment order puts them
    at ``32j + 8u ..``: a lane's codes of a group are one run."""
    t = torch.tensor([0, 1, 8, 9, 16, 17, 24, 25])
    j, u = torch.arange(4).view(4, 1, 1), torch.arange(4).view(1, 4, 1)
    return (32 * u + 2 * j + t).reshape(-1)


def frag_order(blocks: torch.Tensor, bits: int) -> torch.Tensor:
    """Portable uint8 ``[n, k*bits/8]`` 4- or 8-bit codes → the same codes in fragment order
    (:func:`frag_perm` applied to each group of 128 K), uint8 ``[n, k*bits/8]``; ``k`` a multiple of
    128. The scales keep their order (a group's steps are its 4 scale blocks)."""
    if bits not in (4, 8):
        raise ValueError(f"fragment order is for 4- or 8-bit codes, not {bits}-bit")
    codes = packing.unpack(blocks, bits)
    *lead, k = codes.shape
    if k % FRAG_GROUP:
        raise ValueError(f"fragment order permutes groups of {FRAG_GROUP} K: K={k} is not a multiple")
    groups = codes.reshape(*lead, k // FRAG_GROUP, FRAG_GROUP)
    return packing.pack(groups[..., frag_perm().to(codes.device)].reshape(*lead, k), bits)
