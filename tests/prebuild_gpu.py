"""Build the CUDA kernels of the GPU tests here (no GPU needed) into $MXGEMM_CACHE_DIR, so a GPU box with
only the TVM runtime can run them: ``MXGEMM_CACHE_DIR=DIR python -m tests.prebuild_gpu sm_90 [JOBS [SETS]]``
with SETS a comma list of linear, ops, rules, xs, fold, act, module, minilm, wgmma, split, decode,
frag, stab, ldm, cluster, nearest (default: all; xs and fold are part of rules; wgmma, decode, frag, stab, ldm
and cluster: sm_90 only)."""

import os
import sys
from concurrent.futures import ProcessPoolExecutor

import mxgemm
from mxgemm import ops
from mxgemm.ops import build_args, build_args_all
from tests.linear_cases import BLOCK_CASES, CHUNK_FORMATS, DTYPES, FORMATS, MS, K, N


def cases(arch):
    for fmt in FORMATS:
        for dt in DTYPES:
            for bias in (False, True):
                for m in MS:
                    yield build_args(m, fmt=fmt, n=N, k=K, a_dtype=dt, bias=bias, target=arch)
        for m in (1, 256):  # test_every_code_decodes_exactly: a [4, 256] weight, bf16
            yield build_args(m, fmt=fmt, n=4, k=256, a_dtype="bfloat16", target=arch)
        if fmt in CHUNK_FORMATS:  # test_gpu_decode_kernel_writes_exactly_w
            yield dict(fmt=fmt, n=N, k=K, a_dtype="bfloat16", op="decode", target=arch)
    for fmt, block, n, k in BLOCK_CASES:
        for m in MS:
            yield build_args(m, fmt=fmt, n=n, k=k, a_dtype="bfloat16", block_size=block, target=arch)


def module_cases(arch):
    """The MxLinear layers of tests.test_module's GPU test, at its M bucket."""
    import warnings

    from mxgemm.config import MxConfig
    from mxgemm.module import MxLinear, quantize_
    from tests.test_module import GPU_M, Net

    net = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(net, MxConfig("mxfp4"))
    for mod in net.modules():
        if isinstance(mod, MxLinear):
            yield build_args(
                GPU_M,
                fmt=mod.fmt,
                n=mod.out_features,
                k=mod.in_features,
                a_dtype=str(mod.a_dtype).removeprefix("torch."),
                bias=mod.bias is not None,
                block_size=mod.block_size,
                target=arch,
            )


def minilm_cases(arch):
    """The MxLinear layers of the main job (tests.test_demo on CUDA): MiniLM's projections, for its
    pooler (36 rows) and its token batches (hundreds of rows): both take the decode + cuBLAS path."""
    from mxgemm.demo import DEMO_FORMATS

    for fmt in DEMO_FORMATS:
        for n, k in ((384, 384), (1536, 384), (384, 1536)):
            yield build_args(36, fmt=fmt, n=n, k=k, a_dtype="bfloat16", bias=True, target=arch)


def rule_cases(arch):
    """tests.test_linear's small-M cases: each rule pinned at its buckets, and `linear` as routed."""
    from tests.linear_cases import (
        CHUNK_FORMATS,
        GEMV_K,
        GEMV_N,
        PDL_FORMATS,
        RULE_CASES,
        TC_K,
        TC_N,
        pdl_chain_kernel,
        rule_kernel,
        rule_shape,
    )

    for fmt in FORMATS:
        for bias in (False, True):
            for rule, dt in RULE_CASES:
                for m in rule_shape(rule)[2]:
                    yield rule_kernel(rule, fmt, dt, bias, m, arch)
            for dt in DTYPES:
                for m in (1, 3, 5, 16, 17, 64):
                    yield build_args(m, fmt=fmt, n=TC_N, k=TC_K, a_dtype=dt, bias=bias, target=arch)
        if fmt in PDL_FORMATS:  # test_gpu_pdl_chain
            for m in (1, 16):
                yield from (pdl_chain_kernel(fmt, m, arch, pdl) for pdl in (1, 2))
        if fmt in CHUNK_FORMATS:  # test_gpu_decode_path_in_chunks: 64-row chunks of a [256, 2048] W
            for dt in DTYPES:
                yield dict(fmt=fmt, n=GEMV_N, k=GEMV_K, a_dtype=dt, op="decode", target=arch)


def _pinned_cases(arch, names):
    """tests.test_linear's cases of the pinned ``mma`` variants ``names`` (``linear_cases.rule_kernel``):
    every format, bias or not, fp16 and bf16, each variant's M values."""
    from tests.linear_cases import rule_kernel, rule_shape

    for fmt in FORMATS:
        for bias in (False, True):
            for dt in DTYPES:
                for rule in names:
                    for m in rule_shape(rule)[2]:
                        yield rule_kernel(rule, fmt, dt, bias, m, arch)


def xs_cases(arch):
    """tests.test_linear's ``mma-xs`` cases (the ring that holds the activations past 16 rows) and
    tests.test_tune's GPU test (decode + cuBLAS as a candidate)."""
    yield from _pinned_cases(arch, ("mma-xs",))
    # tests.test_tune's decode candidate
    yield dict(fmt="mxfp4", n=256, k=2048, a_dtype="bfloat16", op="decode", target=arch)


def fold_cases(arch):
    """tests.test_linear's ``mma-fold`` and ``mma-mw`` cases (the block scales folded into the pairs,
    warps splitting M)."""
    yield from _pinned_cases(arch, ("mma-fold", "mma-mw"))


def act_cases(arch):
    """tests.test_act_quant's GPU test: the activation quantize kernel of every format × rounding."""
    from mxgemm.codegen import act_quant, target

    for fmt in FORMATS:
        for dt in DTYPES:
            for rounding in act_quant.ROUNDINGS:
                yield dict(act=(fmt, 256, 32, dt, rounding, target.resolve(arch)))


def wgmma_cases(arch):
    """tests.test_wgmma_mx's and test_wgmma_w's GPU tests: the wgmma kernels (Hopper only)."""
    from tests import test_wgmma_mx, test_wgmma_w

    if arch == "sm_90":
        for args in test_wgmma_mx.PREBUILD:
            yield dict(wgmma=args)
        for args in test_wgmma_w.PREBUILD:
            yield dict(wgmma_w=args)
        for fmt, n, k, bucket, hints in test_wgmma_w.LINEARS:
            for dt in ("float16", "bfloat16"):
                yield dict(fmt=fmt, n=n, k=k, m_bucket=bucket, a_dtype=dt, target=arch, hints=hints)


def decode_cases(arch):
    """tests.test_mma_decode's GPU tests: the mma kernels with and without ``quad`` / ``cvt`` (Hopper
    only)."""
    from tests import test_mma_decode

    yield from (test_mma_decode.PREBUILD if arch == "sm_90" else ())


def stab_cases(arch):
    """tests.test_mma_stab's GPU tests: the mma kernels with and without the scale table (Hopper only)."""
    from tests import test_mma_stab

    yield from (test_mma_stab.PREBUILD if arch == "sm_90" else ())


def ldm_cases(arch):
    """tests.test_mma_ldm's GPU tests: the mma kernels with and without ldmatrix (Hopper only)."""
    from tests import test_mma_ldm

    yield from (test_mma_ldm.PREBUILD if arch == "sm_90" else ())


def cluster_cases(arch):
    """tests.test_mma_cluster's GPU tests: the mma kernels with K split over a cluster and without
    (Hopper only)."""
    from tests import test_mma_cluster

    yield from (test_mma_cluster.PREBUILD if arch == "sm_90" else ())


def frag_cases(arch):
    """tests.test_mma_frag's GPU tests: the mma kernels reading codes in fragment order (Hopper only)."""
    from tests import test_mma_frag

    yield from (dict(mma_frag=args) for args in (test_mma_frag.PREBUILD if arch == "sm_90" else ()))


def ops_cases(arch):
    """tests.test_ops's GPU dispatch test: its layers at its M."""
    from tests.test_ops import GPU_CASES, GPU_M, K, N

    for fmt, dtype in GPU_CASES:
        dt = str(dtype).removeprefix("torch.")
        yield build_args(GPU_M, fmt=fmt, n=N, k=K, a_dtype=dt, bias=True, target=arch)


def split_cases(arch):
    """tests.test_row_split's GPU tests: the forced split's kernels, and the shipped log's split's."""
    from tests.test_row_split import FORCED, SPLIT_M, SPLIT_SHAPE

    fmt, n, k = SPLIT_SHAPE
    for dt in DTYPES:
        yield from build_args_all(SPLIT_M, fmt=fmt, n=n, k=k, a_dtype=dt, target=arch)
        for bias in (False, True):
            for m in FORCED[2]:
                yield build_args(m, fmt="mxfp4", n=FORCED[0], k=FORCED[1], a_dtype=dt, bias=bias, target=arch)


def nearest_cases(arch):
    """tests.test_nearest's GPU test: a shape the shipped log lacks, on its neighbours' records."""
    from tests.test_nearest import gpu_cases

    yield from gpu_cases(arch)


SETS = {
    "linear": cases,
    "ops": ops_cases,
    "rules": rule_cases,
    "xs": xs_cases,
    "fold": fold_cases,
    "act": act_cases,
    "module": module_cases,
    "minilm": minilm_cases,
    "wgmma": wgmma_cases,
    "split": split_cases,
    "decode": decode_cases,
    "frag": frag_cases,
    "stab": stab_cases,
    "ldm": ldm_cases,
    "cluster": cluster_cases,
    "nearest": nearest_cases,
}


BORROWING = ("nearest",)  # the sets whose tests borrow the nearest shape's records (tests/conftest.py)


def _with_borrowing(name: str) -> str:
    """``$MXGEMM_NEAREST`` as set ``name``'s tests run (conftest: off but for tests/test_nearest.py)."""
    return "1" if name in BORROWING else "0"


def _build(job):
    """Build one kernel (``job``: its arguments and ``$MXGEMM_NEAREST`` as its tests run)."""
    import os

    kw, nearest = job
    os.environ["MXGEMM_NEAREST"] = nearest
    if "act" in kw:
        from mxgemm.codegen import act_quant

        act_quant.kernel(*kw["act"])
        return f"act_quant {kw['act'][:5]}"
    if "wgmma" in kw:
        from mxgemm.codegen import wgmma_mx

        wgmma_mx.compiled(*kw["wgmma"])
        return f"wgmma_mx {kw['wgmma']}"
    if "wgmma_w" in kw:
        from mxgemm.codegen import wgmma_w

        wgmma_w.compiled(*kw["wgmma_w"])
        return f"wgmma_w {kw['wgmma_w'][:5]}"
    if "mma_frag" in kw:
        from tests import test_mma_frag

        test_mma_frag.compiled(*kw["mma_frag"])
        return f"mma_frag {kw['mma_frag'][:2]}"
    return repr(mxgemm.build(**kw))


if __name__ == "__main__":
    arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
    sets = sys.argv[3].split(",") if len(sys.argv) > 3 else list(SETS)
    todo = []
    for name in sets:
        os.environ["MXGEMM_NEAREST"] = _with_borrowing(name)
        ops.clear_kernels()  # (the plans of the last set)
        todo += [(kw, os.environ["MXGEMM_NEAREST"]) for kw in SETS[name](arch)]
    with ProcessPoolExecutor(int(sys.argv[2]) if len(sys.argv) > 2 else 2) as pool:
        for i, r in enumerate(pool.map(_build, todo)):
            print(i, r, flush=True)
