"""GPT-OSS / transformers ``quant_method: "mxfp4"`` checkpoints (``*_blocks`` [..., n, k/32, 16],
``*_scales`` [..., n, k/32]), both ways, checked against transformers' own mxfp4 decoding and an
independent decode with ml_dtypes."""

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import mxgemm
from mxgemm.checkpoint import CheckpointError, load_quantized, save_quantized
from mxgemm.config import MxConfig
from mxgemm.interop import InteropError, gpt_oss_experts
from mxgemm.module import MxLinear, quantize_
from tests.test_interop import _quantized, _tiny_llama, _weights

transformers = pytest.importorskip("transformers")
hf_mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
IDS = torch.arange(12)[None]


def _transformers_decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' mxfp4 dequantization of ``blocks`` [..., n, G, 16] / ``scales`` [..., n, G] as fp32
    [..., n, 32G] (it returns the experts' transpose, [E, 32G, n]; a Linear gets an expert dim of 1)."""
    lead = blocks.dim() == 3
    b, s = (blocks[None], scales[None]) if lead else (blocks, scales)
    w = hf_mxfp4.convert_moe_packed_tensors(b, s, dtype=torch.float32).transpose(1, 2)
    return w[0] if lead else w


def _ml_dtypes_decode(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """An independent decode: fp4 E2M1 codes (even index in the low nibble) x 2**(scale - 127), NaN
    for scale code 255; ``blocks`` [..., G, 16] and ``scales`` [..., G] give fp32 [..., 32G]."""
    b = blocks.numpy()
    codes = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(*b.shape[:-1], 32)
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    s = scales.numpy().astype(np.int32)
    scale = np.where(s == 255, np.nan, np.ldexp(np.float32(1), s - 127)).astype(np.float32)
    return (values * scale[..., None]).reshape(*b.shape[:-2], -1)


def _gpt_oss_by_hand(model, path) -> dict[str, torch.Tensor]:
    """Write ``model`` (MLP Linears quantized, attention not) as a GPT-OSS-layout checkpoint without
    mxgemm's writer: blocks reshaped to [n, k/32, 16], config.json with transformers' Mxfp4Config."""
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for k in [k for k in state if k.endswith(".weight_blocks")]:
        state[k] = state[k].reshape(state[k].shape[0], -1, 16)
    path.mkdir()
    save_file(state, str(path / "model.safetensors"))
    skip = ["model.layers.*.self_attn", "model.embed_tokens", "lm_head"]
    qc = transformers.Mxfp4Config(modules_to_not_convert=skip).to_dict()
    (path / "config.json").write_text(json.dumps({**model.config.to_dict(), "quantization_config": qc}))
    return state


def test_written_as_gpt_oss_decodes_as_transformers_does_and_reads_back(tmp_path):
    """save_quantized(format="gpt-oss"): transformers' Mxfp4Config and tensor layout; transformers'
    mxfp4 decoding gives exactly our dequantized weights; reading back is bit-identical."""
    model = _quantized("mxfp4")
    save_quantized(model, tmp_path, MxConfig("mxfp4"), format="gpt-oss")
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc == {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}
    assert transformers.Mxfp4Config.from_dict(qc).to_dict() == qc
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for name, w in _weights(model).items():
        blocks, scales = tensors[f"{name}.weight_blocks"], tensors[f"{name}.weight_scales"]
        n, k = w.shape
        assert blocks.dtype == scales.dtype == torch.uint8
        assert blocks.shape == (n, k // 32, 16) and scales.shape == (n, k // 32)
        assert torch.equal(_transformers_decode(blocks, scales), w), name

    back = load_quantized(_tiny_llama(1), tmp_path)
    for name, mod in model.named_modules():
        if isinstance(mod, MxLinear):
            other = back.get_submodule(name)
            assert isinstance(other, MxLinear) and other.fmt == "mxfp4"
            assert torch.equal(other.weight.blocks, mod.weight.blocks)
            assert torch.equal(other.weight.scales, mod.weight.scales)
    hf = mxgemm.from_pretrained(tmp_path, auto_class="AutoModelForCausalLM")
    with torch.no_grad():
        assert torch.equal(back(IDS).logits, model(IDS).logits)
        assert torch.equal(hf(IDS).logits, model(IDS).logits)


def test_gpt_oss_checkpoint_by_hand_loads_and_writes_back(tmp_path):
    """A GPT-OSS-layout checkpoint written without mxgemm loads to the logits of mxgemm's own checkpoint
    of the same model (attention left full precision); saving it as gpt-oss gives the same tensors."""
    ref = _tiny_llama()
    quantize_(ref, MxConfig("mxfp4", modules_to_not_convert=["lm_head", *ATTENTION]))
    hand = _gpt_oss_by_hand(ref, tmp_path / "hand")
    save_quantized(ref, tmp_path / "ours", MxConfig("mxfp4"))
    theirs = mxgemm.from_pretrained(tmp_path / "hand", auto_class="AutoModelForCausalLM")
    ours = mxgemm.from_pretrained(tmp_path / "ours", auto_class="AutoModelForCausalLM")
    assert type(theirs.get_submodule("model.layers.0.self_attn.q_proj")) is nn.Linear
    assert isinstance(theirs.get_submodule("model.layers.0.mlp.up_proj"), MxLinear)
    with torch.no_grad():
        assert torch.equal(theirs(IDS).logits, ours(IDS).logits)

    save_quantized(theirs, tmp_path / "again", MxConfig("mxfp4"), format="gpt-oss")
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert again.keys() == hand.keys()
    assert all(torch.equal(again[k], hand[k]) for k in hand)


def test_experts_decode_as_ml_dtypes_and_transformers_do():
    """gpt_oss_experts: an mxfp4 MxWeight [E, n, k] of the stored bytes that dequantizes to the values
    an independent ml_dtypes decode and transformers' own decode give; code 255 warns and is NaN."""
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 8, 2, 16), dtype=torch.uint8, generator=gen)  # E=3, n=8, k=64
    scales = torch.randint(110, 140, (3, 8, 2), dtype=torch.uint8, generator=gen)
    w = gpt_oss_experts(blocks, scales)
    assert w.shape == (3, 8, 64) and w.fmt == "mxfp4" and w.block_size == 32
    got = mxgemm.dequantize(w).float()
    assert torch.equal(got, torch.from_numpy(_ml_dtypes_decode(blocks, scales)))
    assert torch.equal(got, _transformers_decode(blocks, scales))

    scales[1, 2, 0] = 255
    with pytest.warns(UserWarning, match=r"'gate_up_proj_scales' holds E8M0 code 255 in 1 block\(s\)"):
        nan = mxgemm.dequantize(gpt_oss_experts(blocks, scales, "gate_up_proj")).float()
    assert nan[1, 2, :32].isnan().all() and not nan[1, 2, 32:].isnan().any()
    with pytest.raises(InteropError, match=r"blocks \[3, 8, 2, 16\] / scales \[3, 8\]"):
        gpt_oss_experts(blocks, scales[..., 0])
    with pytest.raises(InteropError, match=r"shape \[3, 8, 32\], gpt-oss stores \[..., groups, 16\]"):
        gpt_oss_experts(blocks.flatten(-2), scales)


def test_experts_of_a_gpt_oss_checkpoint_as_transformers_loads_them(tmp_path):
    """A tiny GptOssForCausalLM checkpoint with mxfp4 experts: transformers' loader (dequantize=True)
    gives each expert weight as the transpose of gpt_oss_experts' [E, n, k] (n, k as documented);
    load_quantized, which runs Linears only, says where to look."""
    cfg = transformers.GptOssConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, vocab_size=48, num_local_experts=2, num_experts_per_tok=1,
        max_position_embeddings=32, layer_types=["full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in transformers.GptOssForCausalLM(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    experts = "model.layers.0.mlp.experts."
    for proj, n, k in (("gate_up_proj", 2 * 96, 64), ("down_proj", 64, 96)):
        del state[experts + proj]
        blocks, scales = f"{experts}{proj}_blocks", f"{experts}{proj}_scales"
        state[blocks] = torch.randint(0, 256, (2, n, k // 32, 16), dtype=torch.uint8, generator=gen)
        state[scales] = torch.randint(115, 135, (2, n, k // 32), dtype=torch.uint8, generator=gen)
    save_file(state, str(tmp_path / "model.safetensors"))
    skip = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    qc = transformers.Mxfp4Config(modules_to_not_convert=skip).to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**cfg.to_dict(), "quantization_config": qc}))
    dense = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True)
    )
    for proj in ("gate_up_proj", "down_proj"):
        w = gpt_oss_experts(state[f"{experts}{proj}_blocks"], state[f"{experts}{proj}_scales"], proj)
        assert torch.equal(dense.get_parameter(experts + proj), mxgemm.dequantize(w).float().transpose(1, 2))
    with pytest.raises(CheckpointError, match=r"gate_up_proj_blocks/_scales: .*interop.gpt_oss_experts"):
        load_quantized(transformers.GptOssForCausalLM(cfg), tmp_path)


def test_gpt_oss_errors_and_code_255_warning(tmp_path):
    """Other formats/blocks are refused before anything is written; a foreign scale code 255 warns,
    naming the tensor; blocks in another layout are a clear error."""
    for fmt, block in (("mxfp6_e2m3", 32), ("mxfp4", 16)):
        model = _tiny_llama()
        quantize_(model, MxConfig(fmt, block_size=block))
        with pytest.raises(
            CheckpointError, match=rf"gpt-oss stores mxfp4 with blocks of 32; .* {fmt} .* {block}"
        ):
            save_quantized(model, tmp_path / "x", MxConfig(fmt, block_size=block), format="gpt-oss")
        assert not (tmp_path / "x").exists()

    ref = _tiny_llama()
    quantize_(ref, MxConfig("mxfp4", modules_to_not_convert=["lm_head", *ATTENTION]))
    state = _gpt_oss_by_hand(ref, tmp_path / "hand")
    f = tmp_path / "hand" / "model.safetensors"
    state["model.layers.0.mlp.up_proj.weight_scales"][0, :2] = 255
    save_file(state, str(f))
    said = r"NaN \(OCP MX\), gpt-oss \(transformers' mxfp4\) as x \* 2\*\*128"
    with pytest.warns(UserWarning, match=rf"up_proj.weight_scales' in .*code 255 in 2 block\(s\): .*{said}"):
        load_quantized(_tiny_llama(), tmp_path / "hand")
    up = "model.layers.0.mlp.up_proj.weight_blocks"
    state[up] = state[up].flatten(-2)  # mxgemm's own layout under quant_method "mxfp4"
    save_file(state, str(f))
    with pytest.raises(
        CheckpointError, match=r"up_proj.weight_blocks' has shape \[128, 32\], gpt-oss stores"
    ):
        load_quantized(_tiny_llama(), tmp_path / "hand")


def test_pack_writes_gpt_oss(tmp_path):
    """`mxgemm pack --output-format gpt-oss`: the bytes of mxgemm's own pack reshaped, Mxfp4Config with
    lm_head unconverted, the same logits; other formats are refused with nothing written."""
    from mxgemm import cli

    src = tmp_path / "src"
    _tiny_llama().save_pretrained(str(src))
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for out, form in ((ours, "mxgemm"), (theirs, "gpt-oss")):
        assert cli.main(["pack", str(src), "--format", "mxfp4", "-o", str(out), "--output-format", form]) == 0
    qc = json.loads((theirs / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "mxfp4" and "lm_head" in qc["modules_to_not_convert"]
    a, b = load_file(str(ours / "model.safetensors")), load_file(str(theirs / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(b[k].flatten(-2) if k.endswith("_blocks") else b[k], a[k]) for k in a)
    packed = mxgemm.from_pretrained(ours, auto_class="AutoModelForCausalLM")
    back = mxgemm.from_pretrained(theirs, auto_class="AutoModelForCausalLM")
    with torch.no_grad():
        assert torch.equal(back(IDS).logits, packed(IDS).logits)
    assert cli.main(["pack", str(src), "--format", "mxfp6_e2m3", "-o", str(tmp_path / "x"),
                     "--output-format", "gpt-oss"]) == 2  # fmt: skip
    assert not (tmp_path / "x").exists()
