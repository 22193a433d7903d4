"""The ``mma`` kernel decoding fp4 codes into fp16 four pairs a word (``mma.Hints.quad``,
:func:`mxgemm.codegen.pairs.decode_quad`).

CPU: which hints and formats take it, the rule's twin, and (nvcc) fewer integer ops in the kernel's
PTX than the pair-at-a-time decode. GPU (Hopper): the same output bits as the kernel without it, on
the ring (one row, PDL), the register pipeline (4 rows), folded scales (16 rows) and activations in
the ring (32 rows), with rows whose scales fold and a block whose codes span too many binades to.
"""

import dataclasses
import re
import subprocess

import pytest
import torch

import mxgemm
from mxgemm import formats, layout, reference
from mxgemm.codegen import build as builder
from mxgemm.codegen import mma
from mxgemm.codegen import target as targets
from mxgemm.rules import mma as mma_rule

N, K = 512, 2048  # (8 warps splitting K take 8 steps each: one ring iteration)
# (hints with quad, M bucket, rows)
CASES = [
    (mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, quad=1), 1, 1),
    (mma.Hints(nt=2, kw=4, unroll=4, stages=0, quad=1), 4, 3),
    (mma.Hints(nt=2, kw=4, unroll=8, stages=2, fold=1, quad=1), 16, 13),
    (mma.Hints(nt=2, kw=1, kn=8, unroll=8, stages=2, fold=1, xs=1, quad=1), 32, 29),
]
# the kernels of the GPU test, mxgemm.build's arguments, for tests.prebuild_gpu
PREBUILD = [
    dict(fmt="mxfp4", n=N, k=K, m_bucket=m, target="sm_90", hints=h, rule="mma")
    for hints, m, _ in CASES
    for h in (hints.to_dict(), dataclasses.replace(hints, quad=0).to_dict())
]


def test_quad_is_fp4_into_fp16_only():
    with pytest.raises(ValueError, match="mma hints out of range"):
        mma.Hints(quad=2)
    quad = mma.Hints(nt=1, kw=8, unroll=8, stages=2, quad=1)
    for fmt, dtype in (("mxfp4", "bfloat16"), ("mxfp6_e2m3", "float16"), ("mxint8", "float16")):
        with pytest.raises(ValueError, match=f"{fmt} codes in {dtype} are not decoded four pairs a word"):
            mma.kernel(formats.get(fmt), n=N, k=K, m_tile=1, out_dtype=dtype, bias=False, block_size=32,
                       hints=quad, a_dtype=dtype)  # fmt: skip


def test_the_rule_offers_quad_as_a_twin_for_fp4_in_fp16():
    """Candidates with ``quad`` exist exactly for fp4 in fp16 (and never with ``shl``, which it makes
    moot); a record without it has the twin with it (``shl`` dropped)."""
    record = mma.Hints(nt=1, kw=8, unroll=8, stages=2, pdl=2, shl=1)
    for fmt, dtype, offered in (
        ("mxfp4", "float16", True),
        ("mxfp4", "bfloat16", False),
        ("mxfp8_e4m3", "float16", False),
    ):
        spec = builder.KernelSpec(fmt, 4096, 4096, 1, dtype, dtype, False, 32, targets.resolve("sm_90"))
        cands = mma_rule.RULE.candidates(spec)
        assert any(h.quad for h in cands) == offered and not any(h.quad and h.shl for h in cands)
        twin = dataclasses.replace(record, quad=1, shl=0)
        assert (twin in mma_rule.RULE.twins(spec, record)) == offered


@pytest.mark.nvcc
def test_quad_issues_fewer_integer_ops(tmp_path):
    """The one-row ring kernel's PTX: the same byte permutes (one a pair) and fewer shifts and logic
    ops (a word's sign and field bytes made four codes at once, instead of two a pair)."""

    def integer_ops(hints):
        k = mxgemm.build("mxfp4", n=N, k=K, m_bucket=1, target="sm_90", hints=hints, rule="mma")
        cu, ptx = tmp_path / "k.cu", tmp_path / "k.ptx"
        cu.write_text(k.source)
        subprocess.run(["nvcc", "-ptx", "-O3", "-arch=sm_90", "-o", str(ptx), str(cu)], check=True)
        text = ptx.read_text()
        ops = len(re.findall(r"^\s*(?:shl|shr|and|or|xor|lop3)\.", text, re.M))
        return ops, len(re.findall(r"^\s*prmt\.", text, re.M))

    quad = CASES[0][0]
    plain = integer_ops(dataclasses.replace(quad, quad=0).to_dict())
    ops, prmts = integer_ops(quad.to_dict())
    assert prmts == plain[1] and ops < plain[0], (ops, prmts, plain)


# ---- on a Hopper GPU -------------------------------------------------------------------------------

hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs a Hopper GPU",
)


def _run(hints: mma.Hints, m_bucket: int, x: torch.Tensor, q) -> torch.Tensor:
    k = mxgemm.build("mxfp4", n=N, k=K, m_bucket=m_bucket, target="sm_90", hints=hints.to_dict(), rule="mma")
    y = torch.empty(x.shape[0], N, dtype=x.dtype, device="cuda")
    builder.launch(k, [x, *layout.to_planes(q.blocks, 4), q.scales, y])
    return y


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("hints", "m_bucket", "rows"), CASES)
def test_gpu_quad_gives_the_same_bits(hints, m_bucket, rows):
    """Weights whose rows' scales fold, one 32-block scaled 2**-60 below its row (too many binades to
    fold: that warp runs the plain loop), activations spanning 2**±8: the bits of the kernel without
    ``quad``."""
    torch.manual_seed(11)
    w = torch.randn(N, K, device="cuda") * 0.05
    w[5, 64:96] *= 2.0**-60
    q = reference.quantize(w, "mxfp4")
    x = (torch.randn(rows, K, device="cuda") * 2.0 ** torch.randint(-8, 9, (rows, 1), device="cuda")).half()
    y = _run(hints, m_bucket, x, q)
    want = _run(dataclasses.replace(hints, quad=0), m_bucket, x, q)
    assert torch.isfinite(want).all() and torch.equal(y, want)
