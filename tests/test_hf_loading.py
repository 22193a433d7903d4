"""`transformers.AutoModelForCausalLM.from_pretrained(packed_dir)` after `import mxgemm`: the quantized
Linears load as MxLinear, logits and greedy generations equal those of the model that was packed,
`save_pretrained` round-trips, and a missing tensor or a bad config is one clear error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import mxgemm  # noqa: E402
from mxgemm import MxLinear  # noqa: E402
from mxgemm.checkpoint import CheckpointError  # noqa: E402


def _packed(tmp_path, fmt: str):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attention_bias=True, mlp_bias=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    config = mxgemm.MxConfig(fmt)
    mxgemm.quantize_(model, config)
    mxgemm.save_quantized(model, tmp_path / "packed", config)
    return model, tmp_path / "packed"


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3"])
def test_from_pretrained_loads_mxlinear_and_generates_the_same(tmp_path, fmt):
    packed_model, path = _packed(tmp_path, fmt)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    layers = dict(model.named_modules())
    assert type(layers["lm_head"]) is torch.nn.Linear
    quantized = [n for n, m in layers.items() if isinstance(m, MxLinear)]
    assert len(quantized) == 14 and all(layers[n].fmt == fmt for n in quantized)
    ids = torch.randint(0, 512, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, packed_model(ids).logits)
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
        want = packed_model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want) and got.shape == (2, 16)
    model.save_pretrained(tmp_path / "again")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    qc = json.loads((tmp_path / "again" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "mxgemm" and qc["fmt"] == fmt
    with torch.no_grad():
        assert torch.equal(again(ids).logits, packed_model(ids).logits)


def test_a_missing_tensor_or_bad_config_is_one_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file

    _, path = _packed(tmp_path, "mxfp4")
    file = path / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.1.mlp.up_proj.weight_blocks"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"lacks tensor\(s\) model.layers.1.mlp.up_proj.weight_blocks"):
        transformers.AutoModelForCausalLM.from_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["fmt"] = "fp9"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="fp9"):
        transformers.AutoModelForCausalLM.from_pretrained(path)


@pytest.mark.parametrize("order", ["mxgemm first", "transformers first"])
def test_registration_needs_no_heavy_import(order):
    """`import mxgemm` imports neither torch nor transformers; quant_method "mxgemm" is known to
    transformers whichever is imported first."""
    first, second = "import mxgemm", "import transformers.quantizers.auto"
    if order != "mxgemm first":
        first, second = second, first
    code = (
        f"import sys; {first}; light = 'torch' not in sys.modules; {second}\n"
        "from transformers.quantizers import auto as a\n"
        "print(light, 'mxgemm' in a.AUTO_QUANTIZER_MAPPING, 'mxgemm' in a.AUTO_QUANTIZATION_CONFIG_MAPPING)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(order == "mxgemm first"), "True", "True"]
