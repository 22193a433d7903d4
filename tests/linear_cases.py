"""The numerics matrix of `mxgemm.linear`, shared by the CPU/GPU tests and the GPU prebuild script."""

import dataclasses

import torch

import mxgemm

FORMATS = mxgemm.formats.names()
DTYPES = ("float16", "bfloat16")
MS = (1, 3, 17, 64)
N, K = 40, 96  # not multiples of typical tiles; K a multiple of the block (32)
BLOCK_CASES = (("mxfp4", 8, 24, 64), ("bfp5", 256, 24, 512), ("mxfp6_e2m3", 64, 8, 192))  # fmt, block, n, k
GEMV_N, GEMV_K = 64, 2048  # a shape the small-M `gemv` rule tiles for every format (K % 2048 == 0)
CHUNK_FORMATS = ("mxfp4", "mxfp6_e3m2", "mxfp8_e5m2", "mxint8", "bfp3")  # the chunked decode + cuBLAS path
TC_N, TC_K = 256, 2048  # a shape the tensor-core rule tiles for every format (N % 128, K % (32 × 16))
# (rule, activation dtype); "mma-regs": the mma rule's register pipeline (its defaults take the ring up
# to 16 rows); "mma-shared": its ring with 4 warps sharing one copy of the activations; "mma-pdl": its
# ring launched with programmatic dependent launch, decoding by left shifts; "mma-xs": its ring past 16
# rows with the activations in it too (buckets 64 and 128); "mma-fold": its ring with the block scales
# folded into the decoded pairs (buckets 16, 64 and 128); "mma-mw": its ring with warps splitting M
# (buckets 64, 128 and 256)
RULE_CASES = (
    ("mma", "float16"),
    ("mma-regs", "float16"),
    ("mma-shared", "float16"),
    ("mma-pdl", "float16"),
    ("mma", "bfloat16"),
    ("mma-regs", "bfloat16"),
    ("mma-pdl", "bfloat16"),
    ("mma-xs", "float16"),
    ("mma-xs", "bfloat16"),
    ("mma-fold", "float16"),
    ("mma-fold", "bfloat16"),
    ("mma-mw", "float16"),
    ("mma-mw", "bfloat16"),
    ("tensorcore", "float16"),
    ("gemv", "float16"),
    ("gemv", "bfloat16"),
)


def rule_shape(rule: str) -> tuple[int, int, tuple[int, ...]]:
    """(n, k, the M values) a small-M rule is tested at: every bucket it serves, padded and full."""
    if rule == "gemv":
        return GEMV_N, GEMV_K, (1, 3, 16)
    ms = {"mma": (1, 3, 5, 16, 17, 64), **dict.fromkeys(("mma-regs", "mma-shared", "mma-pdl"), (1, 3, 5, 16))}
    ms["mma-xs"] = (17, 64, 100, 128)
    ms["mma-fold"] = (5, 16, 17, 64, 100, 128)
    ms["mma-mw"] = (17, 64, 100, 128, 200, 256)
    return TC_N, TC_K, ms.get(rule, (5, 16, 17, 64))


def rule_kernel(rule: str, fmt: str, dtype: str, bias: bool, m: int, arch: str) -> dict:
    """`mxgemm.build` arguments of ``rule``'s kernel for ``m`` rows, pinned by the rule's default hints
    (``mma-regs``: the mma rule with one tile, 4 warps, 4 steps and no ring; ``mma-shared``: one tile,
    2 × 4 warps, 8 steps, a two-stage ring, activations shared by 4 warps; ``mma-pdl``: one tile, 4
    warps, 8 steps, a two-stage ring, programmatic dependent launch, the left-shift pair decode;
    ``mma-xs``: its ring holding the activations too, at 64 rows 2 tiles, 2 × 4 warps, 4 steps, two
    stages; at 128 one tile, 8 warps, 4 steps, three stages; ``mma-fold``: the folded block scales, up
    to 16 rows with ``mma-shared``'s hints but 2 warps splitting K, else with ``mma-xs``'s; ``mma-mw``:
    warps splitting M, at 32 and 64 rows 2 tiles, 2 × 2 × 2 warps (K, N, M), 4 steps, two stages; at 128 the
    same with 4 warps in N and one in K, the scales folded; at 256 2 tiles, 2 × 4 warps (N, M), the
    scales folded)."""
    from mxgemm import rules
    from mxgemm.codegen import target as targets
    from mxgemm.codegen.build import KernelSpec
    from mxgemm.rules import gemv, mma, tensorcore

    mod = {"gemv": gemv, "tensorcore": tensorcore}.get(rule, mma)
    n, k, _ = rule_shape(rule)
    bucket = next(b for b in mod.M_TILES if m <= b)
    tgt = targets.resolve(arch)
    block = mxgemm.formats.get(fmt).block_size
    pinned = {
        "mma-regs": mma.Hints(1, 4, 4, 0),
        "mma-shared": mma.Hints(1, 2, 8, 2, kn=4),
        "mma-pdl": mma.Hints(**PDL_HINTS),
        "mma-xs": mma.Hints(2, 2, 4, 2, kn=4, xs=1) if bucket == 64 else mma.Hints(1, 1, 4, 3, kn=8, xs=1),
    }
    pinned["mma-mw"] = {
        **dict.fromkeys((32, 64), mma.Hints(2, 2, 4, 2, kn=2, xs=1, mw=2)),
        128: mma.Hints(2, 1, 4, 2, kn=4, xs=1, fold=1, mw=2),
        256: mma.Hints(2, 1, 4, 2, kn=2, xs=1, fold=1, mw=4),
    }.get(bucket)
    if rule == "mma-fold":
        xs = pinned["mma-xs"] if bucket > 16 else mma.Hints(1, 2, 8, 2, kn=4)
        pinned[rule] = dataclasses.replace(xs, fold=1)
    if rule in pinned:
        hints = pinned[rule]
    else:
        spec = KernelSpec(fmt, n, k, bucket, dtype, dtype, bias, block, tgt)
        hints = mod.RULE.default_hints(spec)
    return dict(
        fmt=fmt, n=n, k=k, m_bucket=bucket, a_dtype=dtype, bias=bias, target=tgt, hints=hints.to_dict(),
        rule=rules.name_of(hints),
    )  # fmt: skip


PDL_HINTS = dict(nt=1, kw=4, unroll=8, stages=2, kn=1, pdl=1, shl=1)  # the mma-pdl kernels
PDL_N = 2048  # test_gpu_pdl_chain: a square W, so that each launch can read the previous one's output
PDL_FORMATS = ("mxfp4", "mxfp6_e2m3", "mxfp8_e4m3")


def pdl_chain_kernel(fmt: str, m: int, arch: str, pdl: int = 1) -> dict:
    """`mxgemm.build` arguments of the ``mma-pdl`` kernel of a ``[PDL_N, PDL_N]`` weight for ``m`` rows
    (``pdl`` 2: the next kernel let in after the wait)."""
    args = {**rule_kernel("mma-pdl", fmt, "float16", False, m, arch), "n": PDL_N, "k": PDL_N}
    return {**args, "hints": {**args["hints"], "pdl": pdl}}


def every_code_weight(fmt: str, n: int, k: int, seed: int, max_scale: int = 254):
    """An ``MxWeight [n, k]`` (blocks of 32) of random codes of every finite value of ``fmt`` (NaN/inf
    element codes, which quantize never writes, replaced by 0) and random scale codes from 0 to
    ``max_scale``, both ends in row 0."""
    from mxgemm import packing
    from mxgemm.weight import MxWeight

    bits = mxgemm.formats.get(fmt).bits
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (n, k), generator=g, dtype=torch.uint8)
    unit = torch.full((n, k // 32), 127, dtype=torch.uint8)
    codes[~mxgemm.dequantize(MxWeight(packing.pack(codes, bits), unit, fmt, 32, (n, k))).isfinite()] = 0
    scales = torch.randint(0, max_scale + 1, (n, k // 32), generator=g, dtype=torch.uint8)
    scales[0, :2] = torch.tensor([0, max_scale], dtype=torch.uint8)
    return MxWeight(packing.pack(codes, bits), scales, fmt, 32, (n, k))


def chain_replays_eagerly(chain, outs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``chain()`` (launches writing ``outs``, each maybe reading the one before) eagerly, then
    captured in one CUDA graph and replayed over ``outs`` filled with NaN; assert the replay gives the
    eager bits; return the eager outputs."""
    chain()
    torch.cuda.synchronize()
    eager = [y.clone() for y in outs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for y in outs:
        y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    bits = lambda t: t.view(torch.int16)  # noqa: E731  (NaN == NaN, bit for bit)
    assert all(torch.equal(bits(y), bits(e)) for y, e in zip(outs, eager, strict=True))
    return eager
