"""prim_func structure, target validation, CUDA compilation without a GPU (nvcc), and the kernel cache."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import mxgemm
from mxgemm.codegen import cache, nvcc, pairs
from mxgemm.codegen import target as targets
from mxgemm.codegen.build import KernelSpec
from mxgemm.layout import plane_widths
from mxgemm.rules import tensorcore
from mxgemm.rules.mma import Hints as MmaHints


def _script(func):
    """TVMScript with ``T.int64(64)`` printed as ``64``."""
    return re.sub(r"T\.int64\((\d+)\)", r"\1", func.script())


def _has_blocks(func, *names):
    import tvm

    sch = tvm.s_tir.Schedule(func)
    for name in names:
        sch.get_sblock(name)  # raises if absent
    return True


@pytest.mark.parametrize("fmt", mxgemm.formats.names())
def test_prim_func_blocks_and_one_expression_decode(fmt):
    f = mxgemm.prim_func(fmt, n=64, k=64, bias=True)
    assert _has_blocks(f, "decode", "matmul", "epilogue")
    script = _script(f)
    assert "T.let" not in script and "LetStmt" not in script
    widths = plane_widths(mxgemm.formats.get(fmt).bits)
    planes = ["B"] if len(widths) == 1 else [f"B{i}" for i in range(len(widths))]
    assert [p.name for p in f.params] == ["A", *planes, "S", "Bias", "epilogue"]
    assert 'A: T.Buffer((m, 64), "float16")' in script  # dynamic M by default
    for name, w in zip(planes, widths, strict=True):  # one aligned plane per power-of-two width
        assert f'{name}: T.Buffer((64, {64 * w // 8}), "uint8")' in script


def test_prim_func_static_m_and_dtypes():
    f = mxgemm.prim_func("mxfp4", n=32, k=64, m=7, a_dtype="bfloat16", out_dtype="float16", block_size=16)
    script = _script(f)
    assert 'A: T.Buffer((7, 64), "bfloat16")' in script
    assert 'S: T.Buffer((32, 4), "uint8")' in script
    assert 'epilogue: T.Buffer((7, 32), "float16")' in script


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(k=100), "k=100 is not a multiple of block_size=32"),
        (dict(block_size=12), "block_size must be a power of two"),
        (dict(a_dtype="float32"), "a_dtype must be one of"),
        (dict(n=0), "n must be a positive int"),
        (dict(m=0), "m must be a positive int or None"),
    ],
)
def test_prim_func_bad_input(kwargs, match):
    args = dict(n=32, k=64) | kwargs
    with pytest.raises(ValueError, match=match):
        mxgemm.prim_func("mxfp4", **args)


def test_targets():
    assert targets.resolve("llvm")["kind"] == "llvm"
    t = targets.resolve("sm_90")
    assert t["arch"] == "sm_90" and t["max_shared_memory_per_block"] == 227 * 1024
    assert targets.resolve({"kind": "cuda", "arch": "sm_80"})["max_shared_memory_per_block"] == 163 * 1024
    with pytest.raises(ValueError, match="sm_80 or newer"):
        targets.resolve("sm_75")
    with pytest.raises(ValueError, match="'a' tag disables tensor cores"):
        targets.resolve("sm_90a")
    with pytest.raises(ValueError, match="target must be"):
        targets.resolve("rocm")
    with pytest.raises(ValueError, match="needs an 'arch'"):
        targets.resolve({"kind": "cuda"})


def test_build_bad_input():
    with pytest.raises(ValueError, match="m_bucket must be one of"):
        mxgemm.build("mxfp4", n=32, k=64, m_bucket=3)
    with pytest.raises(ValueError, match="unknown format 'mxfp3'"):
        mxgemm.build("mxfp3", n=32, k=64)
    with pytest.raises(ValueError, match="k=48 is not a multiple"):
        mxgemm.build("mxfp4", n=32, k=48)


def test_cuda_build_without_nvcc_is_a_clear_error(monkeypatch, tmp_path):
    from mxgemm import system

    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path))  # nothing cached
    system.nvcc_version.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        with pytest.raises(
            RuntimeError, match=r"not in the kernel cache and building it needs nvcc: .*mxgemm\[cuda\]"
        ):
            mxgemm.build("mxfp4", n=32, k=64, target="sm_90")
    finally:
        monkeypatch.undo()
        system.nvcc_version.cache_clear()


@pytest.mark.nvcc
def test_nvcc_from_nvidias_pip_wheels_builds(monkeypatch, tmp_path):
    """With no nvcc on PATH, the nvcc of NVIDIA's pip wheels (``nvidia/cu13/bin/nvcc`` on sys.path, here a
    link to this box's toolkit in that layout) builds a CUDA kernel."""
    import shutil
    import sys

    from mxgemm import system

    real = shutil.which("nvcc")
    wheel_bin = tmp_path / "site" / "nvidia" / "cu13" / "bin"
    wheel_bin.mkdir(parents=True)
    (wheel_bin / "nvcc").symlink_to(real)
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path / "cache"))
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(p, "nvcc"))]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *sys.path])
    system.nvcc_version.cache_clear()
    try:
        assert system.find_nvcc() == str(wheel_bin / "nvcc")
        kernel = mxgemm.build("mxfp4", n=32, k=64, target="sm_90")
        assert nvcc.FATBIN_MAGIC in kernel.path.read_bytes()  # nvcc's fatbin, inside the module
    finally:
        monkeypatch.undo()
        system.nvcc_version.cache_clear()


@pytest.mark.nvcc
def test_cached_cuda_kernels_need_no_nvcc(monkeypatch, tmp_path):
    """A GPU box without the CUDA toolkit runs the kernels of a cache built elsewhere: the same entry is
    found with nvcc off PATH (its metadata names the nvcc that built it)."""
    from mxgemm import system
    from mxgemm.codegen import build

    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path))
    built = mxgemm.build("mxfp4", n=32, k=64, m_bucket=1, target="sm_90")
    assert built.info["nvcc"] == system.nvcc_version() is not None
    monkeypatch.setattr(build, "_loaded", {})  # forget the loaded kernel: look it up again
    system.nvcc_version.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        assert system.nvcc_version() is None
        again = mxgemm.build("mxfp4", n=32, k=64, m_bucket=1, target="sm_90")
        assert again.path == built.path and again.source == built.source
    finally:
        monkeypatch.undo()
        system.nvcc_version.cache_clear()


def test_cpu_kernel_exposes_llvm_source():
    avx2 = {"kind": "llvm", "mcpu": "znver3"}  # no AVX-512: the fused dynamic-M `cpu` rule
    k = mxgemm.build("mxfp4", n=32, k=64, a_dtype="bfloat16", target=avx2)
    assert k.rule == "cpu" and "define" in k.source and k.path.exists()


# ---- CUDA without a GPU ---------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.parametrize("fmt", mxgemm.formats.names())
def test_cuda_compiles_every_format(fmt):
    """Small-M and M=256 (ours: warps splitting M there), any M (dlight) and standalone-decode (ours)
    schedules are produced and nvcc compiles them into a fatbin (no CUDA source left)."""
    bits0 = plane_widths(mxgemm.formats.get(fmt).bits)[0]
    tc_spec = KernelSpec(fmt, 256, 2048, 64, "float16", "float16", False, 32, targets.cuda("sm_90"))
    tc_hints = tensorcore.RULE.default_hints(tc_spec)
    for m_bucket, dtype, op, rule, hints in (
        (1, "float16", "linear", "gemv" if bits0 == 8 else "mma", None),  # 8-bit codes stream faster
        (4, "float16", "linear", "mma", None),
        (4, "float16", "linear", "gemv", {"rows": 2, "load_bytes": 16, "a_vec": 8}),  # hints pick their rule
        (16, "bfloat16", "linear", "mma", None),  # bf16 mmas
        (64, "float16", "linear", "mma", None),
        (64, "float16", "linear", "tensorcore", tc_hints.to_dict()),  # tuned hints pick their rule
        (256, "bfloat16", "linear", "mma", None),
        (None, "bfloat16", "linear", "dlight.", None),
        (None, "float16", "decode", "dequant", None),
    ):
        k = mxgemm.build(
            fmt, n=256, k=2048, m_bucket=m_bucket, a_dtype=dtype, target="sm_90", op=op, hints=hints,
            rule=rule if hints else None,
        )  # fmt: skip
        data = k.path.read_bytes()
        assert nvcc.FATBIN_MAGIC in data and b"__global__" not in data
        assert "__global__" in k.source
        assert k.rule.startswith(rule), (m_bucket, op, k.rule)


@pytest.mark.nvcc
def test_cuda_rules_by_bucket():
    mma = mxgemm.build("mxfp4", n=256, k=1024, m_bucket=1, a_dtype="float16", target="sm_90")
    assert mma.rule == "mma" and "mma.sync.aligned.m16n8k16" in mma.source
    assert "uint4" in mma.source  # 16-byte loads of A
    bf16 = mxgemm.build("mxfp4", n=256, k=1024, m_bucket=1, a_dtype="bfloat16", target="sm_90")
    assert bf16.rule == "mma" and "m16n8k16.row.col.f32.bf16.bf16.f32" in bf16.source
    gemv = mxgemm.build("mxfp8_e4m3", n=256, k=1024, m_bucket=1, a_dtype="bfloat16", target="sm_90")
    assert gemv.rule == "gemv" and "uint4" in gemv.source  # ours: 16-byte weight loads
    assert gemv.info["hints"] == {
        "rows": 1,
        "load_bytes": 16,
        "a_vec": 8,
        "a_shared": False,
    }  # N=256: a warp a block
    tuned = mxgemm.build(
        "mxfp4",
        n=256,
        k=1024,
        m_bucket=4,
        target="sm_90",
        hints={"rows": 2, "load_bytes": 8, "a_vec": 4},
        rule="gemv",
    )
    assert tuned.rule == "gemv" and "__launch_bounds__(64)" in tuned.source and "uint2" in tuned.source
    ragged = mxgemm.build("mxfp4", n=43, k=96, m_bucket=1, a_dtype="float16", target="sm_90")
    assert ragged.rule == "dlight.GEMV"  # N not a multiple of 8, K not of 32 x 32: dlight's GEMV
    big = mxgemm.build("mxfp4", n=256, k=512, m_bucket=None, a_dtype="float16", target="sm_90")
    assert big.rule == "dlight.Matmul" and "wmma" in big.source  # tensor cores for fp16
    sm80 = mxgemm.build("mxfp4", n=256, k=512, m_bucket=1, a_dtype="float16", target="sm_80")
    assert nvcc.FATBIN_MAGIC in sm80.path.read_bytes()


def test_routing_by_bucket_format_and_shape(monkeypatch):
    """One routing for `mxgemm.build` and `mxgemm tune` (`rules.rule_for`), and the M → kernel plan of
    `mxgemm.linear` (`ops.plan`), untuned: fp16 up to 64 rows runs the mma rule where it tiles the
    shape, except 8-bit codes at M=1 (gemv), and so does bf16; beyond 64 rows, decode + cuBLAS (the
    128- and 256-row mma kernels run where the tune log says so: test_tune_log_decides_fused_or_decode)."""
    from mxgemm import ops, rules

    monkeypatch.setenv("MXGEMM_TUNED", "0")
    ops.plan.cache_clear()
    monkeypatch.setattr(ops, "plan", ops.plan)  # the cache is cleared again on the way out
    tgt = targets.cuda("sm_90")

    def routed(fmt, n, k, bucket, dt, block=32):
        rule = rules.rule_for(KernelSpec(fmt, n, k, bucket, dt, dt, False, block, tgt))
        return rule.name if rule else None

    assert routed("mxfp4", 4096, 4096, 1, "float16") == "mma"
    assert routed("mxfp8_e4m3", 4096, 4096, 1, "float16") == "gemv"
    assert routed("mxfp8_e4m3", 4096, 4096, 4, "float16") == "mma"
    assert routed("mxfp6_e3m2", 4096, 4096, 64, "float16") == "mma"
    assert routed("mxfp4", 4096, 4096, 16, "bfloat16") == "mma"
    assert routed("mxfp8_e4m3", 4096, 4096, 1, "bfloat16") == "gemv"
    assert routed("mxfp4", 4096, 4096, 16, "float16", 16) == "tensorcore"  # block 16: two scales a step
    assert routed("mxfp4", 4104, 4096, 1, "float16") == "gemv"  # N not a multiple of 16
    assert routed("mxfp4", 4096, 4096, 256, "float16") == "mma"  # warps splitting M
    assert routed("mxfp4", 4096, 4096, None, "float16") is None  # dlight
    plans = {
        m: ops.plan(m, "sm_90", "mxfp4", 4096, 4096, "float16")
        for m in (1, 2, 5, 16, 17, 64, 65, 128, 129, 256, 257)
    }
    assert plans == {
        1: ("linear", 1),
        2: ("linear", 4),
        5: ("linear", 16),
        16: ("linear", 16),
        17: ("linear", 64),
        64: ("linear", 64),
        65: ("decode", None),
        128: ("decode", None),
        129: ("decode", None),
        256: ("decode", None),
        257: ("decode", None),
    }
    assert ops.plan(16, "sm_90", "mxfp4", 4096, 4096, "bfloat16") == ("linear", 16)
    assert ops.plan(65, "sm_90", "mxfp4", 4096, 4096, "bfloat16") == ("decode", None)
    ops.plan.cache_clear()
    monkeypatch.setattr(targets, "cpu", lambda: {"kind": "llvm", "mcpu": "znver3"})  # AVX2
    cpu = {m: ops.plan(m, "llvm", "mxfp4", 4096, 4096, "float16") for m in (1, 3, 4, 5, 17)}
    assert cpu == {
        1: ("linear", 1),
        3: ("linear", 4),
        4: ("linear", 4),
        5: ("decode", None),
        17: ("decode", None),
    }
    assert ops.plan(3, "llvm", "mxfp4", 4096, 4104, "float16", 8) == ("decode", None)  # no GEMV tiles K
    ops.plan.cache_clear()
    monkeypatch.setattr(targets, "cpu", lambda: {"kind": "llvm", "mcpu": "znver5"})  # AVX-512 BF16
    for dtype in ("bfloat16", "float16"):  # cpu_dot, one dynamic-M kernel for every M
        assert {ops.plan(m, "llvm", "mxfp4", 4096, 4096, dtype) for m in (1, 3, 5, 300)} == {("linear", None)}
    assert ops.plan(3, "llvm", "mxfp4", 4096, 4104, "float16", 8) == ("decode", None)  # block 8
    ops.plan.cache_clear()


def test_tune_log_decides_fused_or_decode(monkeypatch, tmp_path):
    """In the buckets 64 and 128 a tune record chooses between the fused kernel and decode + cuBLAS
    (a ``dequant`` record: decode + cuBLAS timed fastest); the bucket 128 runs fused only where a record
    of a fused rule says so; bf16 follows fp16's record where it has none."""
    from mxgemm import ops, tunelog
    from mxgemm.codegen.build import versions

    log = tmp_path / "sm_90.json"
    monkeypatch.setenv("MXGEMM_TUNE_LOG", str(log))
    shape = dict(fmt="mxfp4", n=4096, k=4096, arch="sm_90", block_size=32)
    now = versions(targets.cuda("sm_90"))

    def record(m_bucket, rule, config):
        return tunelog.Record(
            **shape, m_bucket=m_bucket, a_dtype="float16", rule=rule, config=config, us=1.0, gpu="test",
            versions=tunelog.rule_versions(rule, now),
        )  # fmt: skip

    def plans():
        ops.clear_kernels()  # a changed log changes plans
        return [
            ops.plan(m, "sm_90", "mxfp4", 4096, 4096, dt) for m in (64, 128) for dt in ("float16", "bfloat16")
        ]

    try:
        monkeypatch.setattr(tunelog, "shipped_log", lambda arch: tmp_path / "none.json")
        assert plans() == [("linear", 64)] * 2 + [("decode", None)] * 2  # untuned
        xs = {"nt": 1, "kw": 1, "unroll": 8, "stages": 2, "kn": 4, "pdl": 0, "shl": 0, "xs": 1}
        tunelog.merge(log, [record(64, "dequant", {}), record(128, "mma", xs)])
        assert plans() == [("decode", None)] * 2 + [("linear", 128)] * 2
    finally:
        ops.plan.cache_clear()


RING_HINTS = MmaHints(nt=2, kw=4, unroll=8, stages=2).to_dict()
# 4 warps share activations
SHARED_HINTS = MmaHints(nt=1, kw=2, unroll=8, stages=2, kn=4).to_dict()


def test_mma_ring_needs_block_32_scales():
    """A ring reads one scale byte per 32-wide step: other block sizes get the register pipeline."""
    from mxgemm import formats, rules
    from mxgemm.codegen import mma as mma_kernel
    from mxgemm.rules import mma

    tgt = targets.cuda("sm_90")
    rule = rules.get("mma")
    for m in (1, 4, 16):
        assert (
            rule.default_hints(
                KernelSpec("mxfp4", 4096, 4096, m, "float16", "float16", False, 32, tgt)
            ).stages
            == 2
        )
        block64 = KernelSpec("mxfp4", 4096, 4096, m, "float16", "float16", False, 64, tgt)
        assert rule.default_hints(block64).stages == 0
        assert rule.candidates(block64) and all(not h.stages for h in rule.candidates(block64))
    # a ring's blocks: no static shared memory; the sum reuses the ring (the larger of the two)
    ring = mma.Hints(1, 8, 8, 2)
    assert mma.smem_bytes(ring, 64, 2) == (0, max(7 * 8 * 512, 8 * 2 * (16 * 8 * 4 * 2 + 16 * 8)))
    # kn warps share one copy of a slot's activations (16 rows × 8 steps × 32 k × 2 bytes)
    codes, scales, acts = 16 * 8 * 4 * 4, 16 * 8, 16 * 8 * 32 * 2
    assert mma.smem_bytes(mma.Hints(**SHARED_HINTS), 16, 4) == (0, 2 * 2 * (4 * (codes + scales) + acts))
    assert mma.smem_bytes(mma.Hints(1, 2, 8, 2), 16, 4) == (0, 2 * 2 * (codes + scales + acts))
    with pytest.raises(ValueError, match="out of range"):
        mma.Hints(1, 4, 2, 0, kn=2)  # the register pipeline has no shared activations
    with pytest.raises(ValueError, match="one scale per 32-wide step"):
        mma_kernel.kernel(
            formats.get("bfp4"), n=256, k=1024, m_tile=1, out_dtype="float16", bias=False, block_size=64,
            hints=mma.Hints(**RING_HINTS),
        )  # fmt: skip


XS_HINTS = MmaHints(nt=2, kw=2, unroll=4, stages=3, kn=4, xs=1).to_dict()


def test_mma_xs_hints_are_checked():
    """``xs`` (activations in the ring past 16 rows): only with a ring, only past 16 rows, and the only
    way past 64 rows; its slots hold the M tile's activations once per group of kn warps."""
    import dataclasses

    from mxgemm import formats, rules
    from mxgemm.rules import mma as rules_mma
    from mxgemm.rules.base import cheapest

    mma = rules_mma
    tgt = targets.cuda("sm_90")
    f = formats.get("mxfp4")
    with pytest.raises(ValueError, match="out of range"):
        mma.Hints(1, 4, 4, 0, xs=1)  # the register pipeline has no ring
    with pytest.raises(ValueError, match="out of range"):
        mma.Hints(1, 2, 4, 2, kn=8)  # 8 warps a group: with xs only
    xs = mma.Hints(**XS_HINTS)
    assert not rules_mma.valid(xs, 4096, 16, f, 32) and rules_mma.valid(xs, 4096, 64, f, 32)
    assert not rules_mma.valid(dataclasses.replace(xs, xs=0), 4096, 128, f, 32)
    # a slot: 4 warps' codes (2 tiles × 16 rows × 4 steps × 16 bytes) and scales, one copy of 64 rows
    codes, scales, acts = 2 * 16 * 4 * 16, 2 * 16 * 4, 4 * 64 * 64
    assert mma.smem_bytes(xs, 64, 4) == (0, 2 * 3 * (4 * (codes + scales) + acts))
    for m in (64, 128):
        spec = KernelSpec("mxfp4", 8192, 8192, m, "bfloat16", "bfloat16", False, 32, tgt)
        cands = rules.get("mma").candidates(spec)
        assert any(h.xs for h in cands) and (m == 64 or all(h.xs for h in cands))
        assert cheapest(rules.get("mma"), spec).xs == 1  # the cost model counts activation bytes


@pytest.mark.nvcc
def test_mma_xs_kernel_reads_activations_from_the_ring():
    """With ``xs`` every warp of a group reads each n8 tile of activations from the ring (one 16-byte
    ``ld.shared`` per tile and step) and the M tile's rows are copied into it, not loaded by each warp."""
    k = mxgemm.build("mxfp4", n=512, k=1024, m_bucket=64, target="sm_90", hints=XS_HINTS, rule="mma")
    assert k.rule == "mma" and k.info["hints"] == XS_HINTS and "__launch_bounds__(256)" in k.source
    # 4 steps × 8 n8 tiles of reads, 4 steps × 2 tiles × 8 n8 tiles × 2 mmas, one loop body
    reads = k.source.count("tvm_builtin_ptx_ld_vec_shared_v4_b32(") - 1  # calls, less the definition
    assert reads == 4 * 8 and k.source.count("mma.sync") == 4 * 2 * 8 * 2
    assert "cp.async.cg.shared.global [%0], [%1], 16" in k.source
    big = mxgemm.build("mxfp4", n=512, k=1024, m_bucket=128, target="sm_90", a_dtype="bfloat16")
    assert big.rule == "mma" and big.info["hints"]["xs"] == 1 and "bf16" in big.source


@pytest.mark.nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_fold_kernel_folds_scales_where_the_warp_allows(dtype):
    """With ``fold`` the kernel scans each warp's scale codes first (byte-wise max and min, the quad's
    lanes combined, one warp vote), then runs one of two loops: the folded one (each pair times its
    row's multiplier by one exact ``fma``, the mmas straight into the accumulator, no per-step scale
    FMAs) or the plain one; each warp's sums go to true scale by one ``ldexpf`` per output."""
    hints = {**XS_HINTS, "fold": 1}
    k = mxgemm.build(
        "mxfp4", n=512, k=1024, m_bucket=64, target="sm_90", a_dtype=dtype, hints=hints, rule="mma"
    )
    assert k.rule == "mma" and k.info["hints"] == hints
    src = k.source[k.source.index("__global__") :]
    plain = mxgemm.build(
        "mxfp4", n=512, k=1024, m_bucket=64, target="sm_90", a_dtype=dtype, hints=XS_HINTS, rule="mma"
    )
    # both loops' mmas: 4 steps × 2 tiles × 8 n8 tiles × 2 mmas each
    assert src.count("mma.sync") == 2 * plain.source.count("mma.sync") == 2 * 4 * 2 * 8 * 2
    assert src.count("__all_sync(") == 1 and "__vmaxu4(" in src and "__vminu4(" in src
    assert src.count("ldexpf(") == 2 * 8 * 4  # tiles × n8 tiles × fragment, once
    fma = f"tvm_builtin_ptx_fma_half_rn_{'f16x2' if dtype == 'float16' else 'bf16x2'}("
    # one fma per pair in the folded loop (4 steps × 2 tiles × 8 pairs); the plain bf16 loop has its own
    assert src.count(fma) - plain.source[plain.source.index("__global__") :].count(fma) == 4 * 2 * 8
    # the plain loop scales each step's fragments into the accumulator; the folded one does not
    assert src.count(" * ") > plain.source.count(" * ")


@pytest.mark.nvcc
def test_mma_hints_shape_the_kernel():
    """The mma rule's hints land in the kernel: block size (kw warps), and a tuned record that does
    not fit the shape falls back to the defaults."""
    k = mxgemm.build(
        "mxfp6_e3m2",
        n=512,
        k=1024,
        m_bucket=16,
        target="sm_90",
        hints={"nt": 2, "kw": 4, "unroll": 2},
        rule="mma",
    )
    regs = MmaHints(nt=2, kw=4, unroll=2, stages=0).to_dict()
    assert k.rule == "mma" and k.info["hints"] == regs
    # unroll × nt × (16 rows: 2 n8 tiles of activations) × 2 mmas, in the pipelined loop and after it
    assert "__launch_bounds__(128)" in k.source and k.source.count("mma.sync") == 2 * (2 * 2 * 2 * 2)
    assert "cp.async" not in k.source
    ring = mxgemm.build(
        "mxfp6_e3m2", n=512, k=1024, m_bucket=16, target="sm_90", hints=RING_HINTS, rule="mma"
    )
    assert ring.rule == "mma" and ring.info["hints"] == RING_HINTS
    # the ring: 16-byte copies, no block barrier but the cross-warp sum's two (it reuses the ring);
    # one loop body of unroll × nt × 2 n8 tiles × 2 mmas
    assert "cp.async.cg.shared.global [%0], [%1], 16" in ring.source and "bar.warp.sync" in ring.source
    assert ring.source.count("__syncthreads") == 2 and ring.source.count("mma.sync") == 8 * 2 * 2 * 2
    # one dynamic allocation (ring + sum) and no static one: a block over 48 KB gets TVM's opt-in only
    # when its dynamic part alone passes 48 KB (30 tune candidates failed to launch before)
    assert "extern __shared__" in ring.source and re.search(r"^\s*__shared__", ring.source, re.M) is None
    # kn = 4: a block of 2 × 4 warps, each group of 4 meets at its own named barrier every iteration
    shared = mxgemm.build(
        "mxfp6_e3m2", n=512, k=1024, m_bucket=16, target="sm_90", hints=SHARED_HINTS, rule="mma"
    )
    assert shared.info["hints"] == SHARED_HINTS and "__launch_bounds__(256)" in shared.source
    barrier = r"bar_sync\w*\(\(\(uint\)\(\(\(int\)threadIdx.y\) \+ 1\)\), \(uint\)128\)"  # id 1 + ty, 4 warps
    assert re.search(barrier, shared.source)
    assert "bar.warp.sync" not in shared.source and shared.source.count("__syncthreads") == 2
    assert "griddepcontrol" not in ring.source and nvcc.PDL.encode() not in ring.path.read_bytes()
    odd = mxgemm.build(
        "mxfp6_e3m2",
        n=528,
        k=1024,
        m_bucket=16,
        target="sm_90",
        hints={"nt": 2, "kw": 4, "unroll": 2},
        rule="mma",
    )
    assert odd.rule == "mma" and odd.info["hints"]["nt"] == 1  # 528 = 33 tiles of 16 rows


@pytest.mark.nvcc
def test_mma_bf16_finishes_each_pair_with_one_fma():
    """bf16 activations: bf16 mmas, and each decoded pair of float codes (and of integer codes of ≤ 7
    bits) gets exactly one ``fma.rn.bf16x2`` with :func:`~mxgemm.codegen.pairs.bf16_fma`'s operands,
    8-bit integers too (their addend ``-128`` or ``-256`` taken from the pair's bit 7, no fp32 on the
    way); e5m2 (widened from fp16, keeping inf/NaN) gets none; fp16 none."""
    hints = {"nt": 1, "kw": 4, "unroll": 4, "stages": 0}  # 4 steps × 2 mmas × 4 pairs, twice
    for fmt, dtype, fmas in (
        ("mxfp4", "bfloat16", 2 * 4 * 2 * 4),
        ("bfp5", "bfloat16", 2 * 4 * 2 * 4),
        ("mxfp8_e5m2", "bfloat16", 0),
        ("mxint8", "bfloat16", 2 * 4 * 2 * 4),
        ("mxfp4", "float16", 0),
    ):
        k = mxgemm.build(
            fmt, n=256, k=1024, m_bucket=1, a_dtype=dtype, target="sm_80", hints=hints, rule="mma"
        )
        body = k.source[k.source.index("__global__") :]
        ab = {"float16": "f16", "bfloat16": "bf16"}[dtype]
        assert k.rule == "mma" and f"m16n8k16.row.col.f32.{ab}.{ab}.f32" in k.source
        assert body.count("fma_half_rn_bf16x2(") == fmas, (fmt, dtype)
        fma = pairs.bf16_fma(mxgemm.formats.get(fmt), dtype)
        assert (fma is None) == (fmas == 0)
        if fma is not None and not fma.sign:
            assert f"(uint){fma.b}, (uint){fma.c})" in body
        elif fma is not None:
            assert f"(uint){fma.b}, (" in body and f"(uint){fma.sign}) | (uint){fma.c}))" in body


@pytest.mark.nvcc
def test_mma_pdl_waits_before_it_reads():
    """``pdl=1``: the kernel carries TVM's programmatic-dependent-launch tag (the launch asks for
    programmatic stream serialization) and, in its body, lets the next kernel start, prefetches its
    first slots into L2, and waits for the previous kernel before any copy (or store); ``pdl=2`` lets
    the next kernel start after the wait; sm_80 targets and the register pipeline have no PDL."""
    from mxgemm.rules import mma

    hints = {**RING_HINTS, "pdl": 1}
    k = mxgemm.build("mxfp4", n=512, k=1024, m_bucket=1, target="sm_90", hints=hints, rule="mma")
    assert k.info["hints"] == mma.Hints(**hints).to_dict() and nvcc.PDL.encode() in k.path.read_bytes()
    body = k.source[k.source.index("__global__") :]
    calls = [
        "griddepcontrol_launch_dependents()",
        "prefetch_global_L2(",
        "griddepcontrol_wait()",
        "cp_async_",
    ]
    at = [body.find(c) for c in calls]
    assert -1 not in at and at == sorted(at), at
    assert body.count("griddepcontrol_wait()") == 1
    # pdl 2: the next kernel let in after the wait (one kernel ahead at most)
    hints2 = {**hints, "pdl": 2}
    two = mxgemm.build("mxfp4", n=512, k=1024, m_bucket=1, target="sm_90", hints=hints2, rule="mma")
    body = two.source[two.source.index("__global__") :]
    at = [body.find(c) for c in [*calls[1:3], calls[0], calls[3]]]
    assert -1 not in at and at == sorted(at) and body.count("launch_dependents") == 1, at
    old = mxgemm.build("mxfp4", n=512, k=1024, m_bucket=1, target="sm_80", hints=hints, rule="mma")
    assert old.info["hints"]["pdl"] == 0 and "griddepcontrol" not in old.source  # the defaults
    with pytest.raises(ValueError, match="out of range"):
        mma.Hints(1, 4, 2, 0, pdl=1)


@pytest.mark.nvcc
def test_mma_minb_fits_the_grid_in_one_wave(tmp_path):
    """``minb``: 14336 rows of 16-row tiles are 896 blocks, 7 an SM on 132 SMs; the rule offers that as
    a twin of the record's hints (and none where a wave cannot hold the grid), the kernel is
    compiled with those launch bounds, and ptxas keeps its registers within 64K / (7 × 128 threads)
    without spilling (without the bound it takes more, so only 5 blocks fit an SM)."""
    from mxgemm.rules import mma
    from tests import ptxas

    base = mma.Hints(nt=1, kw=4, unroll=8, stages=2, pdl=2, shl=1)
    spec = KernelSpec("mxfp4", 14336, 4096, 1, "float16", "float16", False, 32, targets.resolve("sm_90"))
    assert mma.one_wave(base, 14336, 1, 4, 132) == 7
    assert dataclasses.replace(base, minb=7) in mma.RULE.twins(spec, base)
    assert mma.one_wave(mma.Hints(nt=1, kw=8, unroll=8, stages=2), 28672, 1, 4, 132) == 0  # 14 × 256 threads
    assert mma.one_wave(mma.Hints(nt=1, kw=8, unroll=8, stages=2), 4096, 1, 4, 132) == 2
    regs = {}
    for minb in (0, 7):
        h = dataclasses.replace(base, minb=minb).to_dict()
        k = mxgemm.build("mxfp4", n=14336, k=4096, m_bucket=1, target="sm_90", hints=h, rule="mma")
        assert k.info["hints"] == h
        assert ("__launch_bounds__(128, 7)" in k.source) == bool(minb), minb
        log = ptxas.report(k.source, tmp_path, "sm_90")
        regs[minb] = int(re.search(r"Used (\d+) registers", log)[1])
        assert re.search(r" 0 bytes spill stores, 0 bytes spill loads", log), log
    assert regs[7] <= 65536 // (7 * 128) < regs[0], regs


@pytest.mark.nvcc
def test_mma_minb_caps_the_registers_where_the_blocks_fit(tmp_path):
    """``minb`` also caps a thread's registers at 128 where that many more blocks' shared memory fits
    an SM: 4 blocks of 128 threads for a 4-row ring of 25 KB (a twin of those hints), none for a
    16-row ring of 100 KB (two fit) nor at one row; ptxas keeps the 4-row kernel within 128."""
    from mxgemm.rules import mma
    from tests import ptxas

    base = mma.Hints(nt=2, kw=4, unroll=4, stages=2, ldm=1, pdl=2)
    assert mma.capped(base, 4, 4) == 4
    assert mma.capped(dataclasses.replace(base, unroll=8), 16, 4) == 0
    spec = KernelSpec("mxfp4", 8192, 8192, 4, "float16", "float16", False, 32, targets.resolve("sm_90"))
    assert dataclasses.replace(base, minb=4) in mma.RULE.twins(spec, base)
    one_row = mma.RULE.candidates(dataclasses.replace(spec, m_bucket=1))
    assert dataclasses.replace(base, minb=4) not in one_row
    h = dataclasses.replace(base, minb=4).to_dict()
    k = mxgemm.build("mxfp4", n=8192, k=8192, m_bucket=4, target="sm_90", hints=h, rule="mma")
    assert k.info["hints"] == h and "__launch_bounds__(128, 4)" in k.source
    log = ptxas.report(k.source, tmp_path, "sm_90")
    assert int(re.search(r"Used (\d+) registers", log)[1]) <= 128, log


# ---- kernel cache ---------------------------------------------------------------------------------

_BUILD_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, mxgemm
    k = mxgemm.build("bfp5", n=24, k=64, m_bucket=1, a_dtype="bfloat16")
    q = mxgemm.quantize(torch.linspace(-3, 3, 24 * 64).reshape(24, 64), "bfp5")
    y = mxgemm.linear(torch.ones(1, 64, dtype=torch.bfloat16), q)
    print(json.dumps({"path": str(k.path), "y": y.float().sum().item()}))
    """
)


def test_cache_survives_concurrent_builds(tmp_path):
    env = dict(os.environ, MXGEMM_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", _BUILD_SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({o["path"] for o in outs}) == 1 and len({o["y"] for o in outs}) == 1
    kernels = tmp_path / "kernels"
    assert len(list(kernels.glob("*.so"))) == 1 and len(list(kernels.glob("*.json"))) == 1
    assert not list(kernels.glob(".*"))  # no temp files left behind


def test_corrupt_cache_entry_is_rebuilt_not_loaded(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path))
    spec = {"what": "test", "n": 1}
    calls = []

    def build(path):
        calls.append(path)
        path.write_bytes(b"library-bytes")
        return {"rule": "x"}

    lib, info = cache.get_or_build(spec, build)
    assert lib.read_bytes() == b"library-bytes" and len(calls) == 1
    assert cache.get_or_build(spec, build)[0] == lib and len(calls) == 1  # hit
    lib.write_bytes(b"library-byteZ")  # same size, flipped content
    with caplog.at_level("WARNING"):
        lib2, _ = cache.get_or_build(spec, build)
    assert len(calls) == 2 and lib2.read_bytes() == b"library-bytes" and "checksum" in caplog.text
    lib.with_suffix(".json").write_text("{not json")
    cache.get_or_build(spec, build)
    assert len(calls) == 3


def test_cache_key_covers_versions_and_target():
    from mxgemm.codegen.build import KernelSpec

    a = KernelSpec("mxfp4", 32, 64, None, "float16", "float16", False, 32, targets.resolve("llvm"))
    key = a.key()
    assert key["versions"]["mxgemm"] == mxgemm.__version__ and "tvm" in key["versions"]
    b = KernelSpec("mxfp4", 32, 64, 1, "float16", "float16", False, 32, targets.resolve("sm_90"))
    assert "nvcc" not in b.key()["versions"]  # another nvcc makes the same kernel: cached ones run without
    assert cache.key_of(key) != cache.key_of(b.key())
