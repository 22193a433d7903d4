"""The peers `mxgemm bench --peers` and `mxgemm bench --stack` time beside mxgemm in the same run:
torch's int4 tinygemm (bf16, group 32, what torchao's int4 weight-only uses) and, where ``gemlite`` is
installed (the ``peers`` extra), GemLite's MX layers."""

from __future__ import annotations

import torch
from torch import nn


class Tinygemm(nn.Module):
    """torch's int4 tinygemm layer (bf16, group 32): the kernel torchao's int4 weight-only uses; the
    linear's bias (if any) added after it."""

    def __init__(self, lin: nn.Linear, group: int = 32):
        super().__init__()
        w = lin.weight.detach().float()
        n, k = w.shape
        g = w.reshape(n, k // group, group)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-8)
        q = ((g - lo) / scale).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
        zero = lo + 8 * scale  # w = (q - 8) * scale + zero
        packed = (q[:, ::2] << 4 | q[:, 1::2]).contiguous()
        self.w = torch._convert_weight_to_int4pack(packed, 8)
        sz = torch.stack([scale.reshape(n, -1), zero.reshape(n, -1)], -1).transpose(0, 1)
        self.sz = sz.contiguous().to(torch.bfloat16)
        self.group = group
        self.bias = None if lin.bias is None else lin.bias.detach()

    def forward(self, x):
        y = torch._weight_int4pack_mm(x, self.w, self.group, self.sz)
        return y if self.bias is None else y + self.bias


GEMLITE = {"mxfp4": "A16W4_MXFP", "mxfp8_e4m3": "A16W8_MXFP"}  # GemLite 0.6's layer per format


def gemlite(dense: list[nn.Linear], fmt: str) -> list[nn.Module] | None:
    """GemLite's MX layers for ``dense`` (fp16/bf16 ``nn.Linear``), None where gemlite is not
    installed or has no layer of ``fmt``."""
    try:
        from gemlite import helper
    except ImportError:
        return None
    if fmt not in GEMLITE:
        return None
    w = dense[0].weight
    make = getattr(helper, GEMLITE[fmt])(device=str(w.device), dtype=w.dtype)
    return [make.from_linear(lin, del_orig=False) for lin in dense]
