"""Safetensors shard files of packed models: byte-reproducible writes, the mxgemm metadata every shard
carries (layout version, format, block size, scale mode) and its check on load, safe shard names, and
the rule for symbolic links in a model directory.

Links: Hugging Face snapshot directories are made of symlinks into the hub's blob store, so a link in
a model directory is followed when it resolves inside that directory or inside the Hugging Face cache
(``huggingface_hub``'s ``HF_HUB_CACHE``; else ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or
``~/.cache/huggingface/hub``); any other link is refused, so a model directory cannot make mxgemm read
files elsewhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from mxgemm.config import LAYOUT_VERSION, QUANT_METHOD, MxConfig

LAYOUT_KEY = "mxgemm_layout"
_CONFIG_KEYS = {"mxgemm_fmt": "fmt", "mxgemm_block_size": "block_size", "mxgemm_scale_mode": "scale_mode"}
TMP_SUFFIX = ".mxgemm-tmp"


def metadata(config: MxConfig) -> dict[str, str]:
    """The ``__metadata__`` of a packed shard: torch's ``format`` and what decoding its codes needs."""
    meta = {"format": "pt", LAYOUT_KEY: str(LAYOUT_VERSION)}
    meta.update({k: str(getattr(config, attr)) for k, attr in _CONFIG_KEYS.items()})
    return meta


def check_metadata(file: Path, meta: dict[str, str] | None, config: MxConfig) -> str | None:
    """What in shard ``file``'s metadata contradicts ``config`` (the checkpoint's quantization_config),
    or None. Shards written before the format was recorded (no ``mxgemm_fmt``) pass."""
    meta = meta or {}
    bad = [
        f"{key}={meta[key]!r} but quantization_config has {attr}={getattr(config, attr)!r}"
        for key, attr in _CONFIG_KEYS.items()
        if key in meta and meta[key] != str(getattr(config, attr))
    ]
    if LAYOUT_KEY in meta and meta[LAYOUT_KEY] != str(LAYOUT_VERSION):
        bad.append(f"{LAYOUT_KEY}={meta[LAYOUT_KEY]!r} but this mxgemm reads layout {LAYOUT_VERSION}")
    return f"{file}: shard metadata {'; '.join(bad)}" if bad else None


def checkpoint_files(path: Path) -> list[str]:
    """The names of the checkpoint files in directory ``path``: config.json, ``*.safetensors`` and
    ``*.safetensors.index.json``, sorted."""
    return sorted(
        p.name
        for p in path.iterdir()
        if (p.is_symlink() or not p.is_dir())
        and (p.name == "config.json" or p.name.endswith((".safetensors", ".safetensors.index.json")))
    )


def written_by_mxgemm(path: Path) -> bool:
    """Whether ``path/config.json`` holds an mxgemm ``quantization_config`` (mxgemm wrote the checkpoint)."""
    try:
        qc = json.loads((path / "config.json").read_text(encoding="utf-8")).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD


def foreign_checkpoint(path: Path) -> str | None:
    """Why directory ``path`` may not be written by mxgemm, or None: it holds a checkpoint (config.json,
    safetensors, index) that mxgemm did not write, say the full-precision model. Shared by
    :func:`mxgemm.save_quantized` and ``mxgemm pack``, so neither overwrites another's checkpoint."""
    found = checkpoint_files(path)
    if not found or written_by_mxgemm(path):
        return None
    return f"{path} holds a checkpoint mxgemm did not write ({', '.join(found)})"


def write(
    tensors: dict[str, torch.Tensor], path: Path, meta: dict[str, str], mode_of: Path | None = None
) -> None:
    """Write ``tensors`` to ``path`` through a temporary file renamed into place. The header's metadata
    keys are sorted (safetensors writes them in a random order), so equal content gives equal bytes.
    ``mode_of``: copy that file's permission bits (safetensors creates files 0600)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    tmp.unlink(missing_ok=True)  # never write through a link planted under the temporary name
    try:
        save_file(tensors, str(tmp), metadata=meta)
        with open(tmp, "r+b") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
            text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
            if len(text) > n:  # the same keys and values as safetensors' own compact JSON
                raise RuntimeError(f"sorted safetensors header of {path} grew from {n} to {len(text)} bytes")
            f.seek(8)
            f.write(text.ljust(n))
        if mode_of is not None:
            os.chmod(tmp, os.stat(mode_of).st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def plain_name(name: object) -> bool:
    """Whether ``name`` may name a shard: a ``*.safetensors`` file name, no directory part."""
    return (
        isinstance(name, str)
        and name.endswith(".safetensors")
        and Path(name).name == name
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
    )


def hf_cache() -> Path:
    """The Hugging Face hub cache directory (where snapshot links point)."""
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE).expanduser().resolve()
    except ImportError:
        pass
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser().resolve()
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return (Path(home) / "hub").resolve()


def link_problem(root: Path, path: Path) -> str | None:
    """Why ``path`` (inside model directory ``root``) may not be read, or None: it is a link (or
    lies under one) that resolves outside both ``root`` and the Hugging Face cache."""
    real = path.resolve()
    if real.is_relative_to(root.resolve()) or real.is_relative_to(hf_cache()):
        return None
    return f"{path} is a symbolic link to {real}, outside the model directory and the Hugging Face cache"
