"""The ``mma`` ring's padded rows of codes (``mma.Hints.pad``): each row of a plane's codes in a slot
padded (``mma._row_bytes``) instead of its 16-byte chunks XOR-moved, so a lane's loads of a slot's
steps sit at constant offsets from one address; and from them a 4-bit plane's codes read by
``ldmatrix`` (``mma.Hints.ldm``).

CPU: which hints take it, its shared memory, the rule's candidates and twins; every plane width's
padded rows keep the 8 rows a quarter-warp reads in distinct bank groups (the banks of the lanes'
addresses, computed); (nvcc) the one-row kernel's PTX computes fewer addresses, and with ``ldm``
loads its codes in a quarter of the loads. GPU (Hopper): the same output bits as the kernel without
either, for every plane width (4; 4 and 2; 8; 2 and 1; 4, 2 and 1), at 1, 4, 16 (one step a load:
``ldmatrix.x2``) and 32 rows; one-hot rows give the reference's decoded weights exactly.
"""

import dataclasses
import re

import pytest
import torch

import mxgemm
from mxgemm import reference
from mxgemm.codegen import build as builder
from mxgemm.codegen import mma
from mxgemm.codegen import target as targets
from mxgemm.layout import plane_widths
from mxgemm.rules import mma as mma_rule
from tests import ptxas
from tests.hopper import hopper, run_mma

N, K = 512, 2048
# (hints with pad, M bucket, rows)
CASES = [
    (mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, pad=1, ldm=1), 1, 1),
    (mma.Hints(nt=2, kw=4, unroll=4, stages=3, stab=1, pad=1), 4, 3),
    (mma.Hints(nt=2, kw=4, unroll=8, stages=2, fold=1, pad=1, ldm=1), 16, 13),
    (mma.Hints(nt=2, kw=1, kn=8, unroll=8, stages=2, xs=1, pad=1, ldm=1), 32, 29),
]


def _plain(h: mma.Hints) -> mma.Hints:
    return dataclasses.replace(h, pad=0, ldm=0)


def _for(fmt: str, h: mma.Hints) -> mma.Hints:
    """``h`` as ``fmt`` takes it: ``ldm`` only where its codes have a 4-bit plane."""
    return h if 4 in plane_widths(mxgemm.formats.get(fmt).bits) else dataclasses.replace(h, ldm=0)


FORMATS = [
    ("mxfp4", "float16"),
    ("mxfp4", "bfloat16"),
    ("mxfp6_e2m3", "float16"),
    ("mxfp8_e4m3", "bfloat16"),
    ("mxint8", "float16"),
    ("bfp3", "float16"),
    ("bfp7", "bfloat16"),
]
# the kernels of the GPU tests, mxgemm.build's arguments, for tests.prebuild_gpu
PREBUILD = [
    dict(fmt=f, n=N, k=K, m_bucket=m, target="sm_90", hints=h, rule="mma", a_dtype=dt)
    for f, dt in FORMATS
    for hints, m, _ in CASES
    for h in (_for(f, hints).to_dict(), _plain(hints).to_dict())
]


def test_padding_needs_a_ring_without_fragment_order_and_takes_shared_memory():
    for bad in (dict(stages=0, unroll=4), dict(stages=2, unroll=8, frag=1)):
        for option in ("pad", "ldm"):
            with pytest.raises(ValueError, match="mma hints out of range"):
                mma.Hints(**bad, **{option: 1})
    h = mma.Hints(nt=2, kw=4, kn=2, unroll=8, stages=3)
    for bits, pads in ((4, 16), (6, 16 + 16), (8, 32), (7, 16 + 16 + 16)):
        static, dynamic = mma.smem_bytes(h, 1, bits)
        # a slot: 2 tiles × 16 rows × 2 warps of a group; 3 stages × 4 K warps of slots
        assert mma.smem_bytes(dataclasses.replace(h, pad=1), 1, bits) == (static, dynamic + 12 * 64 * pads)


@pytest.mark.parametrize("unroll", [4, 8])
@pytest.mark.parametrize("w", [1, 2, 4, 8])
def test_padded_rows_keep_a_quarter_warp_in_distinct_banks(w, unroll):
    """A warp's load of a step's codes: lane ``(quad, j)`` reads ``w`` bytes at ``quad × row bytes +
    4 w step + w j``; the lanes of each of the load's wavefronts (of 128 bytes: 8 lanes of 16, 16
    of 8, all 32 of 4 or fewer) hit each 4-byte bank in at most one word."""
    rowb = mma._row_bytes(mma.Hints(unroll=unroll, stages=2, pad=1), w)
    assert rowb % 16 == 0
    per = 32 if w <= 4 else 16  # lanes a wavefront serves
    for step in range(unroll):
        for first in range(0, 32, per):
            words = {}
            for lane in range(first, first + per):
                byte = lane // 4 * rowb + 4 * w * step + w * (lane % 4)
                for word in range(byte // 4, (byte + w - 1) // 4 + 1):
                    words.setdefault(word % 32, set()).add(word)
            assert all(len(s) == 1 for s in words.values()), (w, unroll, step)


def test_the_rule_offers_padding_beside_each_ring_candidate():
    """Every ring candidate has its twin with padded rows where their bytes still fit, and each
    padded one its twin reading the 4-bit plane by ``ldmatrix`` (mxfp6_e2m3: planes of 4 and 2 bits;
    mxfp8_e4m3, no 4-bit plane: none); a record's twins include both; the register pipeline never
    takes them."""
    sm90 = targets.resolve("sm_90")
    spec = builder.KernelSpec("mxfp6_e2m3", 4096, 4096, 4, "float16", "float16", False, 32, sm90)
    cands = mma_rule.RULE.candidates(spec)
    padded = {h for h in cands if h.pad and not h.ldm}
    rings = [h for h in cands if h.stages and not h.pad]
    assert padded and all(h.stages for h in padded)
    fits = [h for h in rings if mma_rule.smem_fits(dataclasses.replace(h, pad=1), 4, 6, mma.RING_SMEM)]
    assert {dataclasses.replace(h, pad=1) for h in fits} == padded
    assert {h for h in cands if h.ldm} == {dataclasses.replace(h, ldm=1) for h in padded}
    record = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2)
    twins = mma_rule.RULE.twins(spec, record)
    assert dataclasses.replace(record, pad=1) in twins and dataclasses.replace(record, pad=1, ldm=1) in twins
    spec8 = dataclasses.replace(spec, fmt="mxfp8_e4m3")
    assert not any(h.ldm for h in mma_rule.RULE.candidates(spec8))


@pytest.mark.nvcc
def test_padding_drops_the_per_load_address_arithmetic(tmp_path):
    """The one-row ring kernel (8 steps, one 16-row tile of mxfp4): padded, the same 16 code loads of
    a slot with no XOR (the chunks' moves) and fewer integer ops overall; with ``ldm`` 4
    ``ldmatrix.x4`` instead of the 16 loads."""

    def ptx(hints):
        k = mxgemm.build("mxfp4", n=N, k=K, m_bucket=1, target="sm_90", hints=hints.to_dict(), rule="mma")
        return ptxas.ptx(k.source, tmp_path, arch="sm_90")

    hints = CASES[0][0]
    matrices, padded, plain = ptx(hints), ptx(dataclasses.replace(hints, ldm=0)), ptx(_plain(hints))
    loads = lambda text: len(re.findall(r"ld\.shared\.b32", text))  # noqa: E731
    xors = lambda text: len(re.findall(r"^\s*xor\.b32", text, re.M))  # noqa: E731
    ops = lambda text: len(re.findall(r"^\s*(?:add|shl|xor|mul|and|or)\.", text, re.M))  # noqa: E731
    assert loads(padded) == loads(plain) >= 16
    assert xors(padded) < xors(plain) and ops(padded) < ops(plain)
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", matrices)) == 4
    assert loads(matrices) == loads(padded) - 16


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
def test_the_gpu_cases_are_candidates(fmt, dtype):
    """The GPU tests' hints, with and without padding, are the rule's candidates for their kernels (a
    hint set that is not would be built with the defaults instead)."""
    sm90 = targets.resolve("sm_90")
    for hints, m_bucket, _ in CASES:
        spec = builder.KernelSpec(fmt, N, K, m_bucket, dtype, dtype, False, 32, sm90)
        cands = set(mma_rule.RULE.candidates(spec))
        assert _for(fmt, hints) in cands and _plain(hints) in cands


def test_every_plane_width_is_tested():
    assert {w for f, _ in FORMATS for w in plane_widths(mxgemm.formats.get(f).bits)} == {1, 2, 4, 8}


# ---- on a Hopper GPU -------------------------------------------------------------------------------


def _run(hints: mma.Hints, m_bucket: int, x: torch.Tensor, q, fmt: str) -> torch.Tensor:
    return run_mma(hints, m_bucket, x, q, fmt, N, K)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_padding_gives_the_same_bits(fmt, dtype, hints, m_bucket, rows):
    """Blocks scaled over 2**-20..1, scale code 255 (NaN) on row 9, activations over 2**±6: the bits
    of the kernel without padding or ``ldmatrix``."""
    torch.manual_seed(16)
    binades = torch.randint(-20, 1, (N, K // 32), device="cuda").repeat_interleave(32, 1)
    q = reference.quantize(torch.randn(N, K, device="cuda") * 2.0**binades, fmt)
    q.scales[9, 40] = 255
    x = torch.randn(rows, K, device="cuda") * 2.0 ** torch.randint(-6, 7, (rows, 1), device="cuda")
    x = x.to(getattr(torch, dtype))
    y = _run(_for(fmt, hints), m_bucket, x, q, fmt)
    want = _run(_plain(hints), m_bucket, x, q, fmt)
    assert y[:, 9].isnan().all() and torch.isfinite(torch.cat([want[:, :9], want[:, 10:]], 1)).all()
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("fmt", "dtype"), FORMATS)
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_padded_one_hot_rows_give_the_decoded_weights(fmt, dtype, hints, m_bucket, rows):
    """Row ``i`` of X one-hot at K ``37 i + 5``: row ``i`` of Y is that column of the reference's
    decoded W (``reference.dequantize``, exact in the activation dtype), bit for bit."""
    torch.manual_seed(17)
    q = reference.quantize(torch.randn(N, K, device="cuda") * 0.1, fmt)
    tdt = getattr(torch, dtype)
    x = torch.zeros(rows, K, dtype=tdt, device="cuda")
    cols = torch.arange(rows, device="cuda") * 37 + 5
    x[torch.arange(rows, device="cuda"), cols] = 1.0
    want = reference.dequantize(q).to(tdt)[:, cols].T
    assert torch.equal(_run(_for(fmt, hints), m_bucket, x, q, fmt), want)
