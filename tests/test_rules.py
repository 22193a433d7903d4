"""The rule registry and typed routing (`mxgemm.rules`): records name their rule and their hints reach
that rule, typed; nothing is guessed from field names; the router and the tuner agree. TIR only (no
nvcc, no GPU)."""

import itertools
import logging

import pytest

from mxgemm import formats, rules, tune
from mxgemm.codegen import target as targets
from mxgemm.codegen.build import KernelSpec, _typed, schedule
from mxgemm.rules import base, cpu, gemv, mma
from mxgemm.rules.base import Rule

ZEN3 = {"kind": "llvm", "mcpu": "znver3"}  # AVX2
ZEN5 = {"kind": "llvm", "mcpu": "znver5"}  # AVX-512 with bf16 dot products


def _spec(fmt, n, k, m_bucket, a_dtype, block_size=32, arch="sm_90", op="linear"):
    tgt = targets.resolve(arch)
    return KernelSpec(fmt, n, k, m_bucket, a_dtype, a_dtype, False, block_size, tgt, op=op)


def _schedule(fmt, n, k, m_bucket, a_dtype, hints=None, rule=None):
    spec = KernelSpec(
        fmt, n, k, m_bucket, a_dtype, a_dtype, False, 32, targets.cuda("sm_90"), rule, hints or {}
    )
    got = schedule(spec)
    return got.rule, got.mod, got.hints.to_dict() if got.hints is not None else {}


def test_the_registry_names_every_rule():
    assert rules.RULES == (
        "cpu_gemv", "cpu_dot", "cpu", "cpu_dequant", "mma", "wgmma_w", "gemv", "tensorcore", "dequant",
        "dlight",
    )  # fmt: skip
    for name in rules.RULES:
        rule = rules.get(name)
        assert (
            isinstance(rule, Rule) and rule.name == name and type(rule).__module__ == f"mxgemm.rules.{name}"
        )
        assert (rule.Hints is not None) == (name in rules.TUNABLE)
    assert rules.get("dlight.GEMV") is rules.get("dlight")
    with pytest.raises(ValueError, match="no schedule rule 'fastest'"):
        rules.get("fastest")
    assert rules.name_of(mma.Hints()) == "mma" and rules.name_of(gemv.Hints()) == "gemv"
    assert rules.name_of(cpu.Hints(4)) == "cpu"
    with pytest.raises(TypeError, match="not a schedule rule's Hints"):
        rules.name_of({"rows": 2})


@pytest.mark.parametrize(
    ("spec", "serving"),
    [
        (_spec("mxfp4", 4096, 4096, 1, "float16"), {"mma", "gemv", "dlight"}),
        (_spec("mxfp4", 4096, 4096, 16, "float16"), {"mma", "gemv", "tensorcore", "dlight"}),
        (_spec("mxfp4", 4096, 4096, 64, "float16"), {"mma", "wgmma_w", "tensorcore", "dlight"}),
        (_spec("mxfp4", 4096, 4096, 256, "float16"), {"mma", "wgmma_w", "dlight"}),  # mma: warps splitting M
        (_spec("mxfp4", 4096, 4096, 128, "bfloat16", arch="sm_80"), {"mma", "dlight"}),  # wgmma: sm_90 only
        (_spec("mxfp6_e2m3", 4096, 4096, 128, "float16"), {"mma", "wgmma_w", "dlight"}),  # planes 4 + 2
        (_spec("bfp5", 4096, 4096, 128, "float16"), {"mma", "dlight"}),  # wgmma_w: planes of 2/4/8 bits
        (_spec("mxfp4", 4096, 4096, None, "float16"), {"dlight"}),
        (_spec("mxfp4", 4096, 4096, 16, "bfloat16"), {"mma", "gemv", "dlight"}),  # bf16 mma; tensorcore: fp16
        (_spec("mxfp4", 4096, 4096, 4, "float16", block_size=16), {"gemv", "dlight"}),  # 2 scales a step
        (_spec("mxfp4", 4104, 4096, 4, "float16"), {"gemv", "dlight"}),  # N not a multiple of 16
        (_spec("mxfp4", 4096, 4096, 1, "float16", op="decode"), {"dequant", "dlight"}),
        (_spec("mxfp4", 4096, 4096, None, "bfloat16", arch=ZEN3), {"cpu"}),  # no bf16 dot products
        (_spec("mxfp4", 4096, 4096, None, "bfloat16", arch=ZEN5), {"cpu_dot", "cpu"}),
        (_spec("mxfp4", 4096, 4096, None, "float16", arch=ZEN5), {"cpu_dot", "cpu"}),  # fp32 multiply-adds
        (_spec("mxfp4", 4096, 4096, None, "bfloat16", arch=ZEN5, block_size=16), {"cpu"}),  # 2 scales a block
        (_spec("bfp2", 4096, 4096, None, "bfloat16", arch=ZEN5), {"cpu"}),  # 2-bit codes: not decoded
        (_spec("mxfp4", 4104, 4096, None, "bfloat16", arch=ZEN5), {"cpu"}),  # N not a multiple of 16
        (_spec("mxfp4", 4096, 4096, 1, "bfloat16", arch="llvm"), {"cpu_gemv", "cpu"}),
        (_spec("mxfp4", 4096, 4104, 1, "bfloat16", arch="llvm", block_size=8), {"cpu"}),  # K ∤ 64
        (_spec("mxfp4", 4096, 4096, None, "bfloat16", arch="llvm", op="decode"), {"cpu_dequant"}),
    ],
    ids=[
        "m1",
        "m16",
        "m64",
        "m256",
        "m128-sm80",
        "m128-6bit",
        "m128-5bit",
        "m-any",
        "bf16",
        "block16",
        "ragged-n",
        "decode",
        "cpu-avx2",
        "cpu-dot",
        "cpu-fp16",
        "cpu-block16",
        "cpu-2bit",
        "cpu-ragged-n",
        "cpu-m1",
        "cpu-ragged-k",
        "cpu-decode",
    ],
)
def test_each_rule_accepts_and_declines_the_right_specs(spec, serving):
    assert {name for name in rules.RULES if rules.get(name).applies(spec)} == serving


@pytest.mark.parametrize("name", rules.TUNABLE)
def test_default_hints_are_valid_for_every_format_block_and_bucket_a_rule_claims(name):
    rule = rules.get(name)
    claimed = 0
    for fmt, block, bucket, dt, arch in itertools.product(
        formats.names(),
        (16, 32, 64),
        (1, 4, 16, 32, 64, 128, 256, None),
        ("float16", "bfloat16"),
        ("sm_90", "sm_80", "llvm"),
    ):
        spec = _spec(fmt, 2048, 4096, bucket, dt, block, arch)
        if not rule.applies(spec):
            assert rule.default_hints(spec) is None or name == "cpu"
            continue
        claimed += 1
        h = rule.default_hints(spec)
        assert h in rule.candidates(spec), (spec, h)
        assert rule.typed(h.to_dict()) == h  # round trip through a tune record
    assert claimed > 0


def test_archs_without_a_table_take_the_cost_models_choice():
    """sm_90 defaults come from ``schedules/sm_90.json``; sm_80 has none and takes the cheapest candidate."""
    mma_rule = rules.get("mma")
    h90 = mma_rule.default_hints(_spec("mxfp4", 4096, 4096, 1, "float16"))  # ≤ 4 16-row tiles an SM
    assert (h90.nt, h90.kw, h90.unroll, h90.stages) == (1, 8, 8, 2)  # the table's first row that fits
    h90 = mma_rule.default_hints(_spec("mxfp4", 14336, 4096, 1, "float16"))  # more
    assert (h90.nt, h90.kw, h90.unroll, h90.stages) == (1, 4, 8, 2)
    s80 = _spec("mxfp4", 4096, 4096, 1, "float16", arch="sm_80")
    assert base.table("sm_80") == {}
    h80 = mma_rule.default_hints(s80)
    assert h80 == min(mma_rule.candidates(s80), key=lambda h: mma_rule.cost(s80, h)) and not h80.pdl


@pytest.mark.parametrize(
    ("target", "vectors", "rows"),
    [
        ({"kind": "llvm", "mcpu": "znver5"}, (16, 32), {1: 8, 4: 4}),  # AVX-512: 32 registers of 16 lanes
        ({"kind": "llvm", "mcpu": "sapphirerapids"}, (16, 32), {1: 8, 4: 4}),
        ({"kind": "llvm", "mcpu": "znver3"}, (8, 16), {1: 2, 4: 1}),  # AVX2: 16 of 8
        ({"kind": "llvm", "mcpu": "haswell"}, (8, 16), {1: 2, 4: 1}),
        ({"kind": "llvm", "mcpu": "znver3", "mattr": ["+avx512f"]}, (16, 32), {1: 8, 4: 4}),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"}, (4, 32), {1: 2, 4: 1}),
    ],
)
def test_the_cpu_gemv_sizes_its_row_tile_to_the_register_file(target, vectors, rows):
    """16 fp32 lanes a row take 1 AVX-512, 2 AVX2 or 4 NEON registers; a task's ``rows × M`` accumulators
    keep to a quarter of the registers at M=1 and half at M=4 (16 accumulators spilled on an AVX2 Zen 3:
    1.3–2.6x slower than 1 or 2 rows)."""
    assert targets.cpu_vectors(target) == vectors
    rule = rules.get("cpu_gemv")
    for bucket, want in rows.items():
        spec = KernelSpec("mxfp4", 4096, 4096, bucket, "bfloat16", "bfloat16", False, 32, target)
        h = rule.default_hints(spec)
        assert (h.lanes, h.rows, h.parallel) == (16, want, 1)
        lanes, regs = vectors
        assert h.rows * bucket * (16 // lanes) <= regs // (4 if bucket == 1 else 2)
        six_bit = KernelSpec("mxfp6_e2m3", 4096, 4096, bucket, "bfloat16", "bfloat16", False, 32, target)
        assert rule.default_hints(six_bit).rows == want  # its codes one a byte, decoded as 8-bit codes are


def test_a_record_reaches_the_rule_it_names_typed():
    # mma routes this fp16 shape at M=4; a gemv record pins gemv, with its hints
    assert _schedule("mxfp4", 256, 2048, 4, "float16")[0] == "mma"
    hints = gemv.Hints(rows=2, load_bytes=8, a_vec=4).to_dict()
    name, _, used = _schedule("mxfp4", 256, 2048, 4, "float16", hints, "gemv")
    assert (name, used) == ("gemv", hints)
    tc = rules.get("tensorcore").candidates(_spec("mxfp4", 256, 2048, 64, "float16"))[0].to_dict()
    assert _schedule("mxfp4", 256, 2048, 64, "float16", tc, "tensorcore")[::2] == ("tensorcore", tc)


def test_nothing_is_guessed_from_field_names(caplog):
    """Hints that fit mma but are filed under gemv are not given to mma: they are refused by gemv's
    Hints (logged) and the router's rule runs with its defaults."""
    mma_like = mma.Hints(nt=2, kw=2, unroll=8, stages=2).to_dict()
    default = _schedule("mxfp4", 256, 2048, 4, "float16")
    with caplog.at_level(logging.WARNING, logger="mxgemm.rules"):
        got = _schedule("mxfp4", 256, 2048, 4, "float16", mma_like, "gemv")
    assert got[0] == "mma" and got[2] == default[2] != mma_like
    assert "ignoring tuned hints" in caplog.text
    with caplog.at_level(logging.WARNING, logger="mxgemm.rules"):
        assert _schedule("mxfp4", 256, 2048, 4, "float16", mma_like, None)[2] == default[2]
    assert "no rule None with hints" in caplog.text


def test_build_takes_typed_hints_or_a_dict_with_its_rule():
    h = mma.Hints(nt=2, kw=2, unroll=8, stages=2)
    assert _typed(h, None) == ("mma", h.to_dict())
    assert _typed(h.to_dict(), "mma") == ("mma", h.to_dict())
    with pytest.raises(ValueError, match="need rule="):
        _typed(h.to_dict(), None)
    with pytest.raises(ValueError, match="belong to rule 'mma', not 'gemv'"):
        _typed(h, "gemv")


@pytest.mark.parametrize(
    ("fmt", "n", "k", "m_bucket", "a_dtype"),
    [
        ("mxfp4", 4096, 4096, 1, "float16"),
        ("mxfp8_e4m3", 4096, 4096, 1, "float16"),  # 8-bit codes at M=1: gemv
        ("mxfp4", 4096, 4096, 16, "float16"),
        ("mxfp4", 4096, 4096, 4, "bfloat16"),
        ("mxfp6_e2m3", 14336, 4096, 64, "float16"),
    ],
)
def test_the_router_the_tuner_and_the_scheduler_agree(fmt, n, k, m_bucket, a_dtype):
    task = tune.Task(fmt, n, k, m_bucket, a_dtype, "sm_90")
    routed = rules.rule_for(_spec(fmt, n, k, m_bucket, a_dtype)).name
    assert tune.rule_of(task) == routed
    default = tune.candidates(task, 1)[0]
    name, _, used = _schedule(fmt, n, k, m_bucket, a_dtype)
    assert (name, used) == default and name == routed  # the tuner's first candidate is what runs untuned


def test_the_package_has_no_import_circle():
    """No module imports (at the top or inside a function, type-only imports included) one that
    imports it back, directly or through others."""
    import ast
    import graphlib
    from pathlib import Path

    root = Path(rules.__file__).resolve().parents[1]
    names = {
        ".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in root.rglob("*.py")
    }
    graph = {}
    for name, path in names.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mxgemm"):
                deps |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {d for d in deps if d in names and d not in (name, "mxgemm")}
    graphlib.TopologicalSorter(graph).prepare()  # CycleError names the circle
