"""Checkpoints of compressed-tensors' MX formats (llm-compressor, vLLM), both ways, checked against
compressed-tensors' own compressors and transformers' loader of that format."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import mxgemm
from mxgemm.checkpoint import CheckpointError, load_quantized, save_quantized
from mxgemm.config import MxConfig
from mxgemm.module import MxLinear, quantize_

ct = pytest.importorskip("compressed_tensors")  # the dev extra installs it
transformers = pytest.importorskip("transformers")

CT = {  # mxgemm format -> (compressed-tensors compressor, its scheme preset)
    "mxfp4": ("mxfp4.base", "MXFP4PackedCompressor", "MXFP4A16"),
    "mxfp6_e2m3": ("mxfp6.base", "MXFP6PackedCompressor", "MXFP6A16"),
    "mxfp8_e4m3": ("mxfp8.base", "MXFP8QuantizationCompressor", "MXFP8A16"),
}


def _tiny_llama(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=48, max_position_embeddings=32, tie_word_embeddings=False,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()


def _quantized(fmt: str):
    model = _tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(model, MxConfig(fmt))
    return model


def _weights(model) -> dict[str, torch.Tensor]:
    """Each quantized Linear's W, dequantized (fp32)."""
    return {n: mxgemm.dequantize(m.weight) for n, m in model.named_modules() if isinstance(m, MxLinear)}


@pytest.mark.parametrize("fmt", list(CT))
def test_written_for_compressed_tensors_and_read_back(fmt, tmp_path):
    """save_quantized(format="compressed-tensors"): compressed-tensors' names, dtypes and config; the
    model loads back with the same bytes and outputs; transformers (with compressed-tensors)
    decompresses every weight to exactly our dequantized values."""
    model = _quantized(fmt)
    save_quantized(model, tmp_path, MxConfig(fmt), format="compressed-tensors")
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["ignore"] == ["lm_head"]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    proj = "model.layers.0.mlp.down_proj"
    codes = tensors[f"{proj}.weight" if fmt == "mxfp8_e4m3" else f"{proj}.weight_packed"]
    assert codes.dtype == (torch.float8_e4m3fn if fmt == "mxfp8_e4m3" else torch.uint8)
    assert tensors[f"{proj}.weight_scale"].dtype == torch.uint8 and f"{proj}.weight_blocks" not in tensors

    back = load_quantized(_tiny_llama(1), tmp_path)
    for name, mod in model.named_modules():
        if isinstance(mod, MxLinear):
            other = back.get_submodule(name)
            assert torch.equal(other.weight.blocks, mod.weight.blocks) and other.fmt == fmt
    ids = torch.arange(12)[None]
    hf = mxgemm.from_pretrained(tmp_path, auto_class="AutoModelForCausalLM")
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
        assert torch.equal(hf(ids).logits, model(ids).logits)

    decompress = transformers.CompressedTensorsConfig(run_compressed=False)
    dense = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), dtype=torch.float32, quantization_config=decompress
    )
    for name, w in _weights(model).items():
        got = dense.get_submodule(name).weight.float()
        assert torch.equal(got, w), name


@pytest.mark.parametrize("fmt", list(CT))
def test_compressed_tensors_output_is_read(fmt, tmp_path):
    """What compressed-tensors' own compressor writes for a weight loads as an MxLinear that
    dequantizes to the values it encoded (its bytes are mxgemm's layout; it writes -0 as +0)."""
    import importlib

    mod_name, cls_name, preset = CT[fmt]
    compressor = getattr(importlib.import_module(f"compressed_tensors.compressors.{mod_name}"), cls_name)
    scheme = ct.quantization.preset_name_to_scheme(preset, ["Linear"])
    reference = _quantized(fmt)
    state = {}
    for name, mod in reference.named_modules():
        if isinstance(mod, MxLinear):
            scale = torch.exp2(mod.weight.scales.float() - 127)
            out = compressor.compress(
                {"weight": mxgemm.dequantize(mod.weight), "weight_scale": scale}, scheme
            )
            state.update({f"{name}.{k}": v.contiguous() for k, v in out.items()})
    for name, t in _tiny_llama().state_dict().items():
        if name.rsplit(".", 1)[0] not in _weights(reference):
            state[name] = t
    save_file(state, str(tmp_path / "model.safetensors"))
    qc = ct.quantization.QuantizationConfig(
        config_groups={"group_0": scheme}, format=mxgemm.interop.CT_FORMATS_BY_FMT[fmt],
        quantization_status="compressed", ignore=["lm_head"],
    ).model_dump(mode="json")  # fmt: skip
    cfg = {**_tiny_llama().config.to_dict(), "quantization_config": qc}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = load_quantized(_tiny_llama(1), tmp_path)
    for name, w in _weights(reference).items():
        assert torch.equal(mxgemm.dequantize(got.get_submodule(name).weight), w), name


def test_foreign_scale_code_255_warns_and_other_formats_are_refused(tmp_path):
    model = _quantized("mxfp4")
    save_quantized(model, tmp_path, MxConfig("mxfp4"), format="compressed-tensors")
    f = tmp_path / "model.safetensors"
    tensors = load_file(str(f))
    tensors["model.layers.0.self_attn.q_proj.weight_scale"][0, :2] = 255
    save_file(tensors, str(f))
    with pytest.warns(
        UserWarning, match=r"q_proj.weight_scale.*code 255 in 2 block\(s\): mxgemm decodes it as NaN"
    ):
        load_quantized(_tiny_llama(), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["format"] = "nvfp4-pack-quantized"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError, match=r"'nvfp4-pack-quantized'.*mxgemm reads one of mxfp4-pack-quantized"
    ):
        load_quantized(_tiny_llama(), tmp_path)
    with pytest.raises(CheckpointError, match="compressed-tensors stores mxfp4, mxfp6_e2m3, mxfp8_e4m3"):
        bfp = _tiny_llama()
        quantize_(bfp, MxConfig("bfp8"))
        save_quantized(bfp, tmp_path / "bfp", MxConfig("bfp8"), format="compressed-tensors")
    with pytest.raises(ValueError, match=r"format must be one of \('mxgemm', 'compressed-tensors', 'gpt-oss"):
        save_quantized(model, tmp_path / "x", MxConfig("mxfp4"), format="gguf")
    assert not (tmp_path / "x").exists() and isinstance(nn.Linear(2, 2), nn.Module)


@pytest.mark.parametrize("fmt", list(CT))
def test_pack_writes_compressed_tensors(fmt, tmp_path):
    """`mxgemm pack --output-format compressed-tensors`: transformers (with compressed-tensors)
    decompresses every packed Linear to exactly what mxgemm's own pack holds, lm_head stays in the
    ignore list, and mxgemm loads the result to the same logits as its own format."""
    from mxgemm import cli

    src = tmp_path / "src"
    _tiny_llama().save_pretrained(str(src))
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for out, form in ((ours, "mxgemm"), (theirs, "compressed-tensors")):
        assert cli.main(["pack", str(src), "--format", fmt, "-o", str(out), "--output-format", form]) == 0
    qc = json.loads((theirs / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and "lm_head" in qc["ignore"]
    packed = mxgemm.from_pretrained(ours, auto_class="AutoModelForCausalLM")
    decompress = transformers.CompressedTensorsConfig(run_compressed=False)
    dense = transformers.AutoModelForCausalLM.from_pretrained(
        str(theirs), dtype=torch.float32, quantization_config=decompress
    )
    for name, w in _weights(packed).items():
        assert torch.equal(dense.get_submodule(name).weight.float(), w), name
    back = mxgemm.from_pretrained(theirs, auto_class="AutoModelForCausalLM")
    ids = torch.arange(12)[None]
    with torch.no_grad():
        assert torch.equal(back(ids).logits, packed(ids).logits)
    assert cli.main(["pack", str(src), "--format", "bfp8", "-o", str(tmp_path / "x"),
                     "--output-format", "compressed-tensors"]) == 2  # fmt: skip
    assert not (tmp_path / "x").exists()
