"""The rule registry and typed routing (`mxgemm.rules`): records name their rule and their hints reach
that rule, typed; nothing is guessed from field names; the router and the tuner agree. TIR only (no
nvcc, no GPU)."""

import logging

import pytest

from mxgemm import formats, rules, tune
from mxgemm.codegen import target as targets
from mxgemm.codegen.build import KernelSpec, _typed
from mxgemm.codegen.prim_func import prim_func
from mxgemm.rules import gemv, mma, tensorcore


def _schedule(fmt, n, k, m_bucket, a_dtype, hints=None, rule=None):
    tgt = targets.cuda("sm_90")
    spec = KernelSpec(fmt, n, k, m_bucket, a_dtype, a_dtype, False, 32, tgt)

    def make(decode_dtype):
        m = 1 if m_bucket == 1 else None
        return prim_func(fmt, n=n, k=k, m=m, a_dtype=a_dtype, out_dtype=a_dtype, decode_dtype=decode_dtype)

    return rules.schedule(make, tgt, spec, hints, rule)


def test_the_registry_names_every_rule():
    assert rules.RULES == ("cpu", "mma", "gemv", "tensorcore", "dequant", "dlight")
    assert {rules.get(n).__name__ for n in rules.RULES} == {f"mxgemm.rules.{n}" for n in rules.RULES}
    assert rules.get("dlight.GEMV") is rules.get("dlight")
    with pytest.raises(ValueError, match="no schedule rule 'fastest'"):
        rules.get("fastest")
    assert rules.name_of(mma.Hints()) == "mma" and rules.name_of(gemv.Hints()) == "gemv"
    with pytest.raises(TypeError, match="not a schedule rule's Hints"):
        rules.name_of({"rows": 2})


def test_a_record_reaches_the_rule_it_names_typed():
    # mma routes this fp16 shape at M=4; a gemv record pins gemv, with its hints
    assert _schedule("mxfp4", 256, 2048, 4, "float16")[0] == "mma"
    hints = gemv.Hints(rows=2, load_bytes=8, a_vec=4).to_dict()
    name, _, used = _schedule("mxfp4", 256, 2048, 4, "float16", hints, "gemv")
    assert (name, used) == ("gemv", hints)
    f = formats.get("mxfp4")
    tc = next(h for h in tensorcore.candidates(256, 64, f) if tensorcore.fits(h, 256, 2048, f)).to_dict()
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
    assert "name no rule" in caplog.text


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
    routed = rules.rule_for(fmt, n, k, m_bucket, a_dtype, 32, targets.cuda("sm_90")).__name__.split(".")[-1]
    assert tune.rule_of(task) == routed
    default = tune.candidates(task, 1)[0]
    name, _, used = _schedule(fmt, n, k, m_bucket, a_dtype)
    assert (name, used) == (routed, default)  # the tuner's first candidate is what runs untuned
