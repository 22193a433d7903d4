"""The ``mma`` kernel reading codes in fragment order (``mma.Hints.frag``, :func:`mxgemm.layout.frag_order`)
and holding its blocks an SM (``mma.Hints.occ``).

CPU: hint and shape checks, the shared memory that bounds the blocks an SM, and (nvcc) no spills.
GPU (Hopper): one-hot activation rows bit for bit (which pins the K order each lane reads: its codes'
runs and its activations' B fragment) and products within rounding of a float64 reference of the
oracle's dequantized weights, on the ring (one row, a static M; 16 rows a step at a time with folded
scales; 32 rows with the activations in the ring) and on the register pipeline.
"""

import dataclasses

import numpy as np
import pytest
import torch

from mxgemm import formats, layout, reference
from mxgemm.codegen import mma
from tests import ptxas
from tests.hopper import hopper
from tests.test_wgmma_w import _dequant

# (hints, M tile, rows): the ring at one row with PDL, two blocks an SM; the register pipeline (the
# activations from global memory); 16 rows (two n8 tiles: a step's codes read at a time) with folded
# scales; 32 rows with the activations in the ring (xs) and folded scales
CASES = [
    (mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=1, shl=1, frag=1, occ=2), 1, 1),
    (mma.Hints(nt=2, kw=4, unroll=4, stages=0, frag=1), 4, 3),
    (mma.Hints(nt=2, kw=4, unroll=8, stages=2, pdl=1, fold=1, frag=1), 16, 13),
    (mma.Hints(nt=2, kw=1, kn=8, unroll=8, stages=2, fold=1, xs=1, frag=1), 32, 29),
]
FORMATS = [(f, dt) for f in ("mxfp4", "mxfp8_e4m3", "mxint8") for dt in ("float16", "bfloat16")]
N, K = 512, 2048  # (8 warps splitting K take 8 steps each: one ring iteration)


def _kernel(fmt, dtype, hints, m_tile):
    return mma.kernel(
        formats.get(fmt), n=N, k=K, m_tile=m_tile, out_dtype=dtype, bias=False, block_size=32, hints=hints,
        a_dtype=dtype,
    )  # fmt: skip


def test_hints_and_shapes_name_the_problem():
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(frag=2)
    with pytest.raises(ValueError, match="mma hints out of range"):  # occ pads the ring
        mma.Hints(stages=0, occ=2)
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(stages=2, unroll=8, occ=9)
    frag = mma.Hints(nt=1, kw=8, unroll=8, stages=2, frag=1)
    with pytest.raises(ValueError, match=r"one plane of 4 or 8 bits .*mxfp6_e2m3: planes \(4, 2\)"):
        mma.kernel(formats.get("mxfp6_e2m3"), n=N, k=K, m_tile=1, out_dtype="float16", bias=False,
                   block_size=32, hints=frag)  # fmt: skip
    with pytest.raises(ValueError, match="a warp's K a multiple of 128 .*64 K a warp"):
        mma.kernel(formats.get("mxfp4"), n=N, k=512, m_tile=1, out_dtype="float16", bias=False,
                   block_size=32, hints=frag)  # fmt: skip


@pytest.mark.parametrize("occ", range(1, 9))
def test_occ_bytes_hold_a_block_to_occ_an_sm(occ):
    """``occ`` blocks of that much shared memory fit an SM (228 KB, 1 KB of it reserved a block), one
    more does not; a block may have it (227 KB at most); the ring is padded to it where it is smaller,
    so the kernel's blocks an SM stay at most ``occ``."""
    b = mma.occ_bytes(occ)
    assert occ * (b + 1024) <= 228 * 1024 < (occ + 1) * (b + 1024) and b <= 227 * 1024
    h = mma.Hints(nt=1, kw=8, unroll=8, stages=2, occ=occ)
    ring = mma.smem_bytes(dataclasses.replace(h, occ=0), 1, 4)[1]  # 8 warps × 2 slots
    dynamic = mma.smem_bytes(h, 1, 4)[1]
    assert dynamic == max(b, ring) and (occ + 1) * (dynamic + 1024) > 228 * 1024


@pytest.mark.parametrize(("hints", "m_tile", "rows"), CASES)
def test_ptxas_spills_nothing(tmp_path, hints, m_tile, rows):
    import tvm

    from mxgemm.codegen import build as builder
    from mxgemm.codegen.wgmma import TARGET

    del rows
    src = builder.compile_export(
        tvm.IRModule({"main": _kernel("mxfp4", "bfloat16", hints, m_tile)}), TARGET, tmp_path / "k.so"
    )["source"]
    planes = builder.compile_export(
        tvm.IRModule({"main": _kernel("mxfp4", "bfloat16", dataclasses.replace(hints, frag=0), m_tile)}),
        TARGET,
        tmp_path / "p.so",
    )["source"]
    assert src != planes
    log = ptxas.report(src, tmp_path)
    assert "0 bytes spill stores" in log, log


# ---- on a Hopper GPU -------------------------------------------------------------------------------

# the kernels of the GPU tests, (fmt, dtype, hints, M tile), for tests.prebuild_gpu
PREBUILD = [(f, dt, h, m) for f, dt in FORMATS for h, m, _ in CASES]


def compiled(fmt, dtype, hints, m_tile):
    """The kernel built once into the kernel cache (``f(A, codes, S, Y)``)."""
    from mxgemm.codegen.wgmma import cached

    spec = {"op": "mma", "fmt": fmt, "n": N, "k": K, "m": m_tile, "dtype": dtype, "hints": hints.to_dict()}
    return cached(spec, lambda: _kernel(fmt, dtype, hints, m_tile))


def _run(fmt, dtype, hints, m_tile, x, q):
    codes = layout.frag_order(q.blocks, formats.get(fmt).bits)
    y = torch.empty(x.shape[0], N, dtype=x.dtype, device="cuda")
    compiled(fmt, dtype, hints, m_tile)(x, codes, q.scales, y)
    return y


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_tile", "rows"), CASES)
def test_gpu_one_hot_rows_are_bit_exact(fmt, dtype, hints, m_tile, rows):
    """Activation row i is one 1 at column c_i: output (i, n) is the weight W[n, c_i] itself."""
    torch.manual_seed(7)
    q = reference.quantize(torch.randn(N, K, device="cuda"), fmt)
    cols = (torch.arange(rows) * 37 + 5) % K
    dt = getattr(torch, dtype)
    x = torch.zeros(rows if m_tile > 1 else 1, K, dtype=dt, device="cuda")
    x[torch.arange(x.shape[0]), cols[: x.shape[0]]] = 1.0
    y = _run(fmt, dtype, hints, m_tile, x, q).cpu()
    want = _dequant(q, fmt)[:, cols[: x.shape[0]]].T.to(dt)
    assert torch.equal(y, want), np.abs((y.double() - want.double()).numpy()).max()


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_tile", "rows"), CASES)
def test_gpu_matches_the_dequantized_product(fmt, dtype, hints, m_tile, rows):
    torch.manual_seed(8)
    q = reference.quantize(torch.randn(N, K, device="cuda") * 0.05, fmt)
    dt = getattr(torch, dtype)
    x = (torch.randn(rows, K, device="cuda") * 2).to(dt)
    y = _run(fmt, dtype, hints, m_tile, x, q).cpu().double()
    wd = _dequant(q, fmt)
    ref = x.cpu().double() @ wd.T
    rounding = 2.0 ** -(11 if dtype == "float16" else 8)
    bound = x.cpu().double().abs() @ wd.abs().T * 2.0**-20 + ref.abs() * rounding
    assert ((y - ref).abs() <= bound).all()
