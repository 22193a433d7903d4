"""`MxWeight`: a quantized tensor in the portable packed layout."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from mxgemm import formats, packing


@dataclass(frozen=True)
class MxWeight:
    """A tensor quantized along its last axis in blocks sharing one E8M0 scale.

    Attributes:
        blocks: uint8 ``[..., K * bits / 8]``, element codes packed along K (:mod:`mxgemm.packing`).
        scales: uint8 ``[..., K / block_size]``, E8M0 codes (2**(c-127); 255 = NaN).
        fmt: format name (:func:`mxgemm.formats.get`).
        block_size: elements per scale.
        shape: logical shape ``(..., K)`` of the quantized tensor.
        scale_mode, rounding: how it was quantized (metadata, see :func:`mxgemm.quantize`).

    Plain tensors only: it pickles, moves with :meth:`to`, and :meth:`state_dict` gives tensors that
    safetensors can save.
    """

    blocks: torch.Tensor
    scales: torch.Tensor
    fmt: str
    block_size: int
    shape: tuple[int, ...]
    scale_mode: str = "floor"
    rounding: str = "even"

    def __post_init__(self) -> None:
        f = formats.get(self.fmt)
        formats.check_block_size(self.block_size, f)
        if not self.shape or self.shape[-1] % self.block_size:
            raise ValueError(
                f"MxWeight: the last dimension of shape {list(self.shape)} must be a multiple of "
                f"block_size={self.block_size}"
            )
        *lead, k = self.shape
        want_blocks = (*lead, packing.packed_len(k, f.bits))
        want_scales = (*lead, k // self.block_size)
        for name, t, want in (("blocks", self.blocks, want_blocks), ("scales", self.scales, want_scales)):
            if t.dtype != torch.uint8 or tuple(t.shape) != want:
                raise ValueError(
                    f"MxWeight.{name}: expected uint8 {list(want)} for {self.fmt} shape {list(self.shape)}"
                    f" block {self.block_size}, got {t.dtype} {list(t.shape)}"
                )

    @property
    def format(self) -> formats.Format:
        return formats.get(self.fmt)

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    @property
    def nbytes(self) -> int:
        """Bytes of packed elements plus scales."""
        return self.blocks.numel() + self.scales.numel()

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / math.prod(self.shape)

    def to(self, device: torch.device | str) -> MxWeight:
        return replace(self, blocks=self.blocks.to(device), scales=self.scales.to(device))

    def codes(self) -> torch.Tensor:
        """uint8 element codes ``[..., K]``, unpacked."""
        return packing.unpack(self.blocks, self.format.bits)

    def state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """``{prefix + "blocks": ..., prefix + "scales": ...}`` (HF naming: ``<name>_blocks``)."""
        return {f"{prefix}blocks": self.blocks, f"{prefix}scales": self.scales}
