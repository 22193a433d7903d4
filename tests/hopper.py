"""What the Hopper-only GPU tests share: their skip marker and an ``mma`` kernel run with given hints."""

import pytest
import torch

import mxgemm
from mxgemm import formats, layout
from mxgemm.codegen import build as builder

hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs a Hopper GPU",
)


def run_mma(hints, m_bucket: int, x: torch.Tensor, q, fmt: str, n: int, k: int) -> torch.Tensor:
    """``x @ W.T`` by the ``mma`` kernel of ``hints`` (``mma.Hints``) for ``m_bucket``: x fp16/bf16
    ``[m, k]`` on the GPU, q the ``[n, k]`` weight (``reference.quantize``) of ``fmt``; returns
    ``x.dtype [m, n]`` (AssertionError where the rule built other hints: ``hints`` not a candidate)."""
    dt = str(x.dtype).removeprefix("torch.")
    kern = mxgemm.build(
        fmt, n=n, k=k, m_bucket=m_bucket, target="sm_90", hints=hints.to_dict(), rule="mma", a_dtype=dt
    )
    assert kern.rule == "mma" and kern.info["hints"] == hints.to_dict(), f"{kern!r} is not {hints}"
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device="cuda")
    builder.launch(kern, [x, *layout.to_planes(q.blocks, formats.get(fmt).bits), q.scales, y])
    return y
