"""Quantized checkpoints (`mxgemm.checkpoint`): saves that never lose or mix data, loads that never leave
the model directory or accept a checkpoint that contradicts its config, and a fuzz of loading."""

import json
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from mxgemm.checkpoint import CheckpointError, load_quantized, save_quantized
from mxgemm.config import MxConfig
from mxgemm.module import MxLinear, quantize_

INDEX = "model.safetensors.index.json"


def _net(seed: int, fmt: str = "mxfp8_e4m3") -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
    quantize_(net, MxConfig(fmt))
    return net


def _out(net: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return net(torch.linspace(-1, 1, 64 * 3).reshape(3, 64))


def _shard_it(d: Path) -> None:
    """Turn ``d``'s model.safetensors into two shards and an index, as a sharded pack holds them."""
    tensors = load_file(str(d / "model.safetensors"))
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(d / shard), metadata=meta)
    index = {"weight_map": {n: shard for shard, part in halves.items() for n in part}}
    (d / INDEX).write_text(json.dumps(index))
    (d / "model.safetensors").unlink()


def test_a_save_replaces_an_earlier_sharded_checkpoint_whole(tmp_path):
    old, new = _net(0), _net(1)
    save_quantized(old, tmp_path, MxConfig("mxfp8_e4m3"))
    _shard_it(tmp_path)
    assert torch.equal(
        _out(load_quantized(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)), tmp_path)),
        _out(old),
    )
    save_quantized(new, tmp_path, MxConfig("mxfp8_e4m3"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_quantized(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)), tmp_path)
    assert torch.equal(_out(loaded), _out(new))


@pytest.mark.parametrize("held", ["config.json", "model.safetensors", INDEX])
def test_save_refuses_a_directory_holding_a_checkpoint_it_did_not_write(tmp_path, held):
    fp = tmp_path / "fp-model"
    fp.mkdir()
    (fp / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    save_file({"0.weight": torch.randn(32, 64)}, str(fp / "model.safetensors"))
    (fp / INDEX).write_text(json.dumps({"weight_map": {"0.weight": "model.safetensors"}}))
    for name in {"config.json", "model.safetensors", INDEX} - {held}:
        (fp / name).unlink()
    before = {p.name: p.read_bytes() for p in fp.iterdir()}
    with pytest.raises(CheckpointError, match=f"did not write.*{held}"):
        save_quantized(_net(0), fp, MxConfig("mxfp8_e4m3"))
    assert {p.name: p.read_bytes() for p in fp.iterdir()} == before


def test_an_edited_format_is_caught_on_load(tmp_path):
    save_quantized(_net(0), tmp_path, MxConfig("mxfp8_e4m3"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["fmt"] = "mxfp8_e5m2"  # same bit width: the codes would load as garbage
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError, match="mxgemm_fmt='mxfp8_e4m3' but quantization_config has fmt='mxfp8_e5m2'"
    ):
        load_quantized(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)), tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors", "..", 3])
def test_index_names_only_plain_files_inside_the_directory(tmp_path, shard):
    d = tmp_path / "model"
    save_quantized(_net(0), d, MxConfig("mxfp8_e4m3"))
    _shard_it(d)
    save_file({"x": torch.zeros(1)}, str(tmp_path / "outside.safetensors"))
    index = json.loads((d / INDEX).read_text())
    index["weight_map"]["0.weight_blocks"] = shard
    (d / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="a shard must be a"):
        load_quantized(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)), d)


@pytest.mark.parametrize("qc", [None, [1], "mxfp4", 7])
def test_a_malformed_quantization_config_is_a_checkpoint_error(tmp_path, qc):
    save_quantized(_net(0), tmp_path, MxConfig("mxfp8_e4m3"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    with pytest.raises(CheckpointError, match="quantization_config"):
        load_quantized(nn.Sequential(nn.Linear(64, 32)), tmp_path)


@pytest.mark.parametrize("weight_map", [[1, 2], "x", None, {"0.weight_blocks": None}])
def test_a_malformed_index_is_a_checkpoint_error(tmp_path, weight_map):
    save_quantized(_net(0), tmp_path, MxConfig("mxfp8_e4m3"))
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=INDEX):
        load_quantized(nn.Sequential(nn.Linear(64, 32)), tmp_path)


def test_shard_links_outside_the_directory_are_refused(tmp_path):
    d = tmp_path / "model"
    save_quantized(_net(0), d, MxConfig("mxfp8_e4m3"))
    (d / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    (d / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    with pytest.raises(CheckpointError, match="symbolic link"):
        load_quantized(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)), d)


def _seq() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))


def test_a_save_removes_every_shard_of_an_earlier_checkpoint_even_without_its_index(tmp_path):
    save_quantized(_net(0), tmp_path, MxConfig("mxfp8_e4m3"))
    _shard_it(tmp_path)
    (tmp_path / INDEX).unlink()  # an index lost or never written: its shards are still the old save's
    new = _net(1)
    save_quantized(new, tmp_path, MxConfig("mxfp8_e4m3"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(_out(load_quantized(_seq(), tmp_path)), _out(new))


def test_a_tensor_in_two_unindexed_shards_is_an_error(tmp_path):
    save_quantized(_net(0), tmp_path, MxConfig("mxfp8_e4m3"))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    save_file({"0.bias": tensors["0.bias"] + 1}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"tensor '0.bias' is in both .*extra.safetensors.* and .*model"
    ):
        load_quantized(_seq(), tmp_path)


@pytest.mark.parametrize("name", ["config.json", INDEX])
def test_config_and_index_links_outside_the_directory_are_refused(tmp_path, name):
    d = tmp_path / "model"
    save_quantized(_net(0), d, MxConfig("mxfp8_e4m3"))
    if name == INDEX:
        _shard_it(d)
    (d / name).rename(tmp_path / name)
    (d / name).symlink_to(tmp_path / name)
    with pytest.raises(CheckpointError, match=f"{name} is a symbolic link to .*outside the model directory"):
        load_quantized(_seq(), d)


def test_a_hugging_face_snapshot_of_links_into_the_cache_loads(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # the env var rule, installed or not
    net = _net(0)
    save_quantized(net, tmp_path / "saved", MxConfig("mxfp8_e4m3"))
    _shard_it(tmp_path / "saved")
    blobs, snap = hub / "models--toy" / "blobs", hub / "models--toy" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted((tmp_path / "saved").iterdir())):
        (blobs / f"blob{i}").write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(blobs / f"blob{i}")
    assert torch.equal(_out(load_quantized(_seq(), snap)), _out(net))


def test_a_shard_of_another_layout_version_is_refused(tmp_path):
    net = _net(0)
    save_quantized(net, tmp_path, MxConfig("mxfp8_e4m3"))
    f = tmp_path / "model.safetensors"
    with safe_open(str(f), framework="pt") as h:
        meta = h.metadata()
    save_file(load_file(str(f)), str(f), metadata={**meta, "mxgemm_layout": "2"})
    with pytest.raises(
        CheckpointError, match=r"model.safetensors: shard metadata mxgemm_layout='2' but .* 1"
    ):
        load_quantized(_seq(), tmp_path)
    save_file(load_file(str(f)), str(f), metadata=meta)
    assert torch.equal(_out(load_quantized(_seq(), tmp_path)), _out(net))


class _Tied(nn.Module):
    """An embedding whose weight the output head shares (as a Hugging Face LM ties them)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 64)
        self.proj = nn.Linear(64, 64)
        self.lm_head = nn.Linear(64, 16, bias=False)
        self.lm_head.weight = self.emb.weight

    def forward(self, ids):
        return self.lm_head(self.proj(self.emb(ids)))


def test_a_tied_weight_loads_from_its_one_copy(tmp_path):
    """A checkpoint that holds a tied weight once (as transformers saves tied embeddings) loads: the
    tie is kept and both names see the stored tensor; an untied tensor that is missing is still an
    error that names it."""
    torch.manual_seed(0)
    net = _Tied()
    quantize_(net, MxConfig("mxfp4"))
    save_quantized(net, tmp_path, MxConfig("mxfp4"))
    f = tmp_path / "model.safetensors"
    with safe_open(str(f), framework="pt") as h:
        meta = h.metadata()
    tensors = load_file(str(f))
    del tensors["lm_head.weight"]
    save_file(tensors, str(f), metadata=meta)
    got = load_quantized(_Tied(), tmp_path)
    assert got.lm_head.weight is got.emb.weight and torch.equal(got.emb.weight, net.emb.weight)
    ids = torch.arange(16)
    with torch.no_grad():
        assert torch.equal(got(ids), net(ids))
    del tensors["emb.weight"]
    save_file(tensors, str(f), metadata=meta)
    with pytest.raises(CheckpointError, match=r"lacks tensor\(s\) emb.weight, lm_head.weight"):
        load_quantized(_Tied(), tmp_path)


# ---- fuzz ------------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("fuzz-src")
    net = nn.Sequential(nn.Linear(64, 32))
    cfg = MxConfig("mxfp4")
    quantize_(net, cfg)
    save_quantized(net, d, cfg)
    return {p.name: p.read_bytes() for p in d.iterdir()}


def _load_or_error(d: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into ``d`` (emptied first) and load them: a model or a CheckpointError only."""
    for p in d.iterdir():
        p.unlink()
    for name, data in files.items():
        (d / name).write_bytes(data)
    try:
        model = load_quantized(nn.Sequential(nn.Linear(64, 32)), d)
    except CheckpointError:
        return
    assert isinstance(model[0], MxLinear)


_FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_fuzz_truncated_shard(saved, tmp_path, cut):
    _load_or_error(tmp_path, {**saved, "model.safetensors": saved["model.safetensors"][:cut]})


@_FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 255)), min_size=1, max_size=4))
def test_fuzz_header_byte_flips(saved, tmp_path, flips):
    data = bytearray(saved["model.safetensors"])
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    _load_or_error(tmp_path, {**saved, "model.safetensors": bytes(data)})


@_FUZZ
@given(cfg=_json, qc=_json)
def test_fuzz_config_json(saved, tmp_path, cfg, qc):
    good = json.loads(saved["config.json"])
    for text in (json.dumps(cfg), json.dumps({**good, "quantization_config": qc})):
        _load_or_error(tmp_path, {**saved, "config.json": text.encode()})
    if isinstance(qc, dict):
        mixed = {**good["quantization_config"], **qc}
        _load_or_error(
            tmp_path, {**saved, "config.json": json.dumps({"quantization_config": mixed}).encode()}
        )


@_FUZZ
@given(index=_json, weight_map=st.dictionaries(st.text(max_size=12), _json, max_size=4))
def test_fuzz_index_json(saved, tmp_path, index, weight_map):
    for doc in (
        index,
        {"weight_map": weight_map},
        {"weight_map": {"0.weight_blocks": "model.safetensors", **weight_map}},
    ):
        _load_or_error(tmp_path, {**saved, INDEX: json.dumps(doc).encode()})
