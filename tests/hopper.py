"""What the Hopper-only GPU tests share: their skip marker, an ``mma`` kernel run with given hints, and
their weights and activations."""

import dataclasses

import pytest
import torch

import mxgemm
from mxgemm import formats, layout, reference
from mxgemm.codegen import build as builder
from mxgemm.codegen import mma

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


def binade_case(fmt: str, dtype: str, rows: int, n: int, k: int, seed: int, nan_row: int = 9, tweak=None):
    """(x, q): ``[n, k]`` weights of ``fmt`` whose blocks are scaled over 2**-20..1 (then
    ``tweak(w)``, in place, before they are quantized) with scale code 255 (NaN) on row ``nan_row``'s
    block 40, and ``dtype [rows, k]`` activations over 2**±6 (CUDA)."""
    torch.manual_seed(seed)
    binades = torch.randint(-20, 1, (n, k // 32), device="cuda").repeat_interleave(32, 1)
    w = torch.randn(n, k, device="cuda") * 2.0**binades
    if tweak is not None:
        tweak(w)
    q = reference.quantize(w, fmt)
    q.scales[nan_row, 40] = 255
    x = torch.randn(rows, k, device="cuda") * 2.0 ** torch.randint(-6, 7, (rows, 1), device="cuda")
    return x.to(getattr(torch, dtype)), q


def assert_same_bits(y: torch.Tensor, want: torch.Tensor, nan_row: int = 9) -> None:
    """``y`` is ``want`` bit for bit, NaN in column ``nan_row`` alone (a :func:`binade_case`'s)."""
    others = torch.cat([want[:, :nan_row], want[:, nan_row + 1 :]], 1)
    assert y[:, nan_row].isnan().all() and torch.isfinite(others).all()
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))


def one_hot_case(fmt: str, dtype: str, rows: int, n: int, k: int, seed: int):
    """(x, q, want): row ``i`` of x one-hot at K ``37 i + 5``, q ``[n, k]`` weights of ``fmt``, and
    ``want``: the rows of ``x @ W.T``, those columns of the reference's decoded W
    (``reference.dequantize``, exact in ``dtype``)."""
    torch.manual_seed(seed)
    q = reference.quantize(torch.randn(n, k, device="cuda") * 0.1, fmt)
    tdt = getattr(torch, dtype)
    x = torch.zeros(rows, k, dtype=tdt, device="cuda")
    cols = torch.arange(rows, device="cuda") * 37 + 5
    x[torch.arange(rows, device="cuda"), cols] = 1.0
    return x, q, reference.dequantize(q).to(tdt)[:, cols].T


# ``mma`` ring kernels at each M bucket up to 32 rows, (hints, M bucket, rows run): one row with
# programmatic dependent launch, 4 rows with the scale table, 16 with folded scales, 32 with the
# activations in the ring (8 warps splitting K of 2048: one ring iteration each)
RING_CASES = [
    (mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2), 1, 1),
    (mma.Hints(nt=2, kw=4, unroll=4, stages=3, stab=1), 4, 3),
    (mma.Hints(nt=2, kw=4, unroll=8, stages=2, fold=1), 16, 13),
    (mma.Hints(nt=2, kw=1, kn=8, unroll=8, stages=2, xs=1), 32, 29),
]


def option_cases(option: str) -> list:
    """:data:`RING_CASES` with the ``mma.Hints`` field ``option`` set to 1."""
    return [(dataclasses.replace(h, **{option: 1}), m, rows) for h, m, rows in RING_CASES]


def prebuild_pairs(option: str, cases: list, fmts: list, n: int, k: int) -> list[dict]:
    """``mxgemm.build``'s arguments of each case's kernel with ``option`` and without, for each
    (format, dtype) of ``fmts`` (for ``tests.prebuild_gpu``)."""
    return [
        dict(fmt=f, n=n, k=k, m_bucket=m, target="sm_90", hints=h, rule="mma", a_dtype=dt)
        for f, dt in fmts
        for hints, m, _ in cases
        for h in (hints.to_dict(), dataclasses.replace(hints, **{option: 0}).to_dict())
    ]
