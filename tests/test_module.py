"""MxLinear, quantize_, MxConfig and quantized checkpoints (CPU)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import mxgemm
from mxgemm.checkpoint import CheckpointError, load_quantized, save_quantized
from mxgemm.config import MxConfig
from mxgemm.module import MxLinear, quantize_


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(64, 96)
        self.odd = nn.Linear(96, 40, bias=False)  # in_features 96: fine for block 32
        self.ragged = nn.Linear(40, 64)  # 40 % 32 != 0: stays nn.Linear
        self.lm_head = nn.Linear(64, 10)

    def forward(self, x):
        return self.lm_head(self.ragged(torch.relu(self.odd(torch.relu(self.up(x))))))


def test_config_defaults_and_validation():
    c = MxConfig()
    assert (c.fmt, c.block_size, c.scale_mode, c.rounding, c.a_dtype) == (
        "mxfp4",
        32,
        "floor",
        "even",
        "bfloat16",
    )
    assert c.modules_to_not_convert == ["lm_head"] and MxConfig.from_dict(c.to_dict()) == c
    for kwargs, match in [
        (dict(fmt="fp4"), "unknown format"),
        (dict(block_size=24), "block_size"),
        (dict(scale_mode="round"), "scale_mode"),
        (dict(rounding="nearest"), "rounding"),
        (dict(a_dtype="float32"), "a_dtype"),
        (dict(modules_to_not_convert="lm_head"), "list of names"),
    ]:
        with pytest.raises(ValueError, match=match):
            MxConfig(**kwargs)
    with pytest.raises(ValueError, match="quant_method"):
        MxConfig.from_dict({"quant_method": "gptq"})
    with pytest.raises(ValueError, match="layout_version"):
        MxConfig.from_dict({**c.to_dict(), "layout_version": 99})


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e3m2", "mxfp8_e5m2", "mxint8", "bfp5"])
@pytest.mark.parametrize("a_dtype", [torch.float16, torch.bfloat16])
def test_from_linear_equals_functional_linear(fmt, a_dtype):
    lin = nn.Linear(96, 40)
    m = MxLinear.from_linear(lin, fmt, a_dtype=a_dtype)
    x = torch.randn(2, 3, 96)
    q = mxgemm.quantize(lin.weight.detach(), fmt)
    expect = mxgemm.linear(x.to(a_dtype), q, lin.bias.detach().to(a_dtype)).float()
    y = m(x)
    assert y.dtype == torch.float32 and torch.equal(y, expect)
    assert torch.equal(m.weight.blocks, q.blocks) and torch.equal(m.weight_scales, q.scales)
    assert f"fmt={fmt}" in repr(m) and "block_size=32" in repr(m)


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "bfp5", "bfp7", "mxfp4"])
def test_codes_held_once_in_the_kernel_layout(fmt):
    """The module holds the codes once (planes for 3/5/6/7 bits, no portable copy); its state dict
    is the portable layout, and loading it back restores the same planes."""
    lin = nn.Linear(128, 24)
    m = MxLinear.from_linear(lin, fmt)
    q = mxgemm.quantize(lin.weight.detach(), fmt)
    code_bytes = sum(b.numel() for name, b in m.named_buffers() if name not in {"weight_scales", "bias"})
    assert code_bytes == q.blocks.numel()
    sd = m.state_dict()
    assert torch.equal(sd["weight_blocks"], q.blocks) and sorted(sd) == [
        "bias",
        "weight_blocks",
        "weight_scales",
    ]
    fresh = MxLinear(128, 24, fmt=fmt)
    fresh.load_state_dict(sd)
    assert all(torch.equal(a, b) for a, b in zip(fresh.planes, m.planes, strict=True))
    x = torch.randn(3, 128)
    assert torch.equal(fresh(x), m(x))
    with pytest.raises(RuntimeError, match="weight_blocks"):
        MxLinear(128, 24, fmt=fmt).load_state_dict({k: v for k, v in sd.items() if k != "weight_blocks"})


def test_mxlinear_bad_input():
    with pytest.raises(ValueError, match="in_features=40 is not a multiple of block_size=32"):
        MxLinear(40, 8)
    m = MxLinear(64, 8)
    with pytest.raises(ValueError, match=r"expected input \[\.\.\., 64\]"):
        m(torch.randn(2, 32))
    with pytest.raises(ValueError, match="cannot hold"):
        m.load_weight(mxgemm.quantize(torch.randn(8, 64), "bfp8"))


def test_quantize_skip_and_filter_rules():
    net = Net()
    with pytest.warns(UserWarning, match="ragged"):
        s = quantize_(net, MxConfig("mxfp8_e4m3"))
    assert s.converted == ["up", "odd"] and s.not_divisible == ["ragged"] and s.excluded == ["lm_head"]
    assert isinstance(net.up, MxLinear) and type(net.ragged) is nn.Linear and type(net.lm_head) is nn.Linear
    net2 = Net()
    with pytest.warns(UserWarning, match="ragged"):
        s2 = quantize_(
            net2, MxConfig("mxfp4", modules_to_not_convert=[]), filter_fn=lambda m, name: name != "up"
        )
    assert "up" in s2.excluded and isinstance(net2.lm_head, MxLinear) and type(net2.up) is nn.Linear


def test_quantized_model_close_to_float():
    net, ref = Net(), Net()
    with pytest.warns(UserWarning):
        quantize_(net, MxConfig("mxfp8_e4m3"))
    x = torch.randn(5, 64)
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(net(x), ref(x), dim=-1)
    assert cos.min() > 0.99


def test_save_load_same_outputs(tmp_path):
    net = Net()
    cfg = MxConfig("bfp5", block_size=16)
    with pytest.warns(UserWarning):
        quantize_(net, cfg)
    save_quantized(net, tmp_path, cfg)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "mxgemm" and qc["fmt"] == "bfp5" and qc["block_size"] == 16
    names = load_file(str(tmp_path / "model.safetensors")).keys()
    assert {"up.weight_blocks", "up.weight_scales", "odd.weight_blocks", "ragged.weight"} <= set(names)
    loaded = load_quantized(Net(), tmp_path)
    assert isinstance(loaded.up, MxLinear) and loaded.up.block_size == 16 and type(loaded.ragged) is nn.Linear
    x = torch.randn(4, 64)
    with torch.no_grad():
        assert torch.equal(loaded(x), net(x))


def test_checkpoint_errors_name_the_tensor(tmp_path):
    net = Net()
    cfg = MxConfig("mxfp4")
    with pytest.warns(UserWarning):
        quantize_(net, cfg)
    save_quantized(net, tmp_path, cfg)
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))

    missing = dict(tensors)
    del missing["odd.weight_scales"]
    save_file(missing, str(file))
    with pytest.raises(CheckpointError, match="lacks tensor.*odd.weight_scales"):
        load_quantized(Net(), tmp_path)

    bad = dict(tensors, **{"up.weight_blocks": torch.zeros(96, 16, dtype=torch.uint8)})
    save_file(bad, str(file))
    with pytest.raises(CheckpointError, match=r"'up.weight_blocks'.*shape \[96, 16\].*\[96, 32\]"):
        load_quantized(Net(), tmp_path)

    file.write_bytes(file.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_quantized(Net(), tmp_path)

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no quantization_config"):
        load_quantized(Net(), tmp_path)


@pytest.mark.parametrize("fmt", ["mxfp6_e3m2", "bfp3", "bfp7", "mxfp4", "mxfp8_e4m3"])
def test_load_state_dict_rejects_misshaped_or_float_codes_naming_the_key(fmt):
    src = MxLinear.from_linear(nn.Linear(64, 96), fmt)
    good = src.state_dict()
    m = MxLinear(64, 96, fmt=fmt)
    cases = {
        "weight_blocks": (good["weight_blocks"][:1].clone(), r"size mismatch for weight_blocks: .*\(1, "),
        "weight_scales": (good["weight_scales"].float() + 3.7, "dtype mismatch for weight_scales: .*float32"),
    }
    cases["weight_blocks_float"] = (good["weight_blocks"].float(), "dtype mismatch for weight_blocks")
    for case, (bad, msg) in cases.items():
        key = case.removesuffix("_float")
        held = m.state_dict()[key].clone()
        with pytest.raises(RuntimeError, match=msg):
            m.load_state_dict({**good, key: bad})
        assert torch.equal(m.state_dict()[key], held)  # not cast, not broadcast
    m.load_state_dict(good)
    assert all(torch.equal(v, good[k]) for k, v in m.state_dict().items())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_cuda_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="device='cuda', but this torch .* use device='cpu'"):
        MxLinear(64, 32, device="cuda")
    net = Net()
    with pytest.warns(UserWarning):
        quantize_(net, MxConfig("mxfp4"))
    save_quantized(net, tmp_path, MxConfig("mxfp4"))
    with pytest.raises(ValueError, match="device='cuda:0', but this torch"):
        load_quantized(Net(), tmp_path, device="cuda:0")
    with pytest.raises(ValueError, match="device='cuda', but this torch"):
        mxgemm.from_pretrained(tmp_path, device="cuda")


def test_compile_fullgraph_no_graph_break():
    net = Net()
    with pytest.warns(UserWarning):
        quantize_(net, MxConfig("mxfp4"))
    x = torch.randn(3, 64)
    explanation = torch._dynamo.explain(net)(x)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(net, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x))


# ---- GPU ------------------------------------------------------------------------------------------

GPU_M = 3  # rows of the GPU module tests (kernels for its bucket are prebuilt by tests.prebuild_gpu)


def gpu_net():
    net = Net()
    with pytest.warns(UserWarning):
        quantize_(net, MxConfig("mxfp4"))
    return net


def _dequantized_copy(net):
    """The same network with every MxLinear replaced by an fp32 nn.Linear holding its decoded weight."""
    import copy

    ref = copy.deepcopy(net).float()
    for name, mod in list(ref.named_modules()):
        if isinstance(mod, MxLinear):
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            lin.weight.data = mxgemm.dequantize(mod.weight)
            if mod.bias is not None:
                lin.bias.data = mod.bias.float()
            parent, _, child = name.rpartition(".")
            setattr(ref.get_submodule(parent) if parent else ref, child, lin)
    return ref


@pytest.mark.gpu
def test_gpu_module_matches_reference_compiles_and_graph_captures():
    net = gpu_net()
    ref = _dequantized_copy(net)
    x = torch.randn(GPU_M, 64)
    with torch.no_grad():
        y_ref = ref(x)
        net = net.cuda()
        xc = x.cuda()
        y = net(xc)
        torch.testing.assert_close(y.cpu(), y_ref, rtol=3e-2, atol=3e-2)  # bf16 activations
        compiled = torch.compile(net, fullgraph=True)
        torch.testing.assert_close(compiled(xc), y)
        static_x = xc.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            net(static_x)  # warm up off the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = net(static_x)
        x2 = torch.randn(GPU_M, 64, device="cuda")
        static_x.copy_(x2)
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_y, net(x2))


def test_dequantized_reference_is_close_on_cpu():
    """The GPU test's reference, checked against the CPU kernels."""
    net = gpu_net()
    x = torch.randn(GPU_M, 64)
    with torch.no_grad():
        torch.testing.assert_close(net(x), _dequantized_copy(net)(x), rtol=3e-2, atol=3e-2)


def test_fp16_overflow_caught_at_quantize_time_naming_the_layer():
    net = Net()
    with torch.no_grad():
        net.odd.weight.mul_(1e6)
    with pytest.raises(ValueError, match=r"layer 'odd'.*beyond float16.*bfloat16"):
        quantize_(net, MxConfig("mxfp8_e4m3", a_dtype="float16"))
    with pytest.warns(UserWarning):
        quantize_(Net(), MxConfig("mxfp8_e4m3", a_dtype="bfloat16"))  # bf16 has the range
