"""Quantized checkpoints: safetensors in the portable layout + ``quantization_config`` in config.json.

A quantized Linear ``<m>`` is stored as ``<m>.weight_blocks`` / ``<m>.weight_scales`` (uint8, see
:mod:`mxgemm.packing`); every other tensor as is. Loading reads tensors only through safetensors (no
pickle), swaps the Linears that the checkpoint holds quantized for :class:`MxLinear`, and checks
every tensor's presence, shape and dtype, naming the tensor and file on any mismatch. Checkpoints of
compressed-tensors' MX formats and of GPT-OSS' mxfp4 layout load too, and can be written
(:mod:`mxgemm.interop`).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from mxgemm import interop, shards, system
from mxgemm.config import MxConfig
from mxgemm.module import MxLinear, _set_submodule

BLOCKS, SCALES = ".weight_blocks", ".weight_scales"
SINGLE_FILE, INDEX = "model.safetensors", "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A quantized checkpoint that cannot be loaded: the message names the tensor or file."""


def read_config(path: str | Path) -> tuple[dict, MxConfig]:
    """(config.json as a dict, its MxConfig) of a quantized model directory."""
    cfg, config, _ = read_quantization(path)
    return cfg, config


def read_quantization(path: str | Path) -> tuple[dict, MxConfig, interop.Naming]:
    """(config.json as a dict, its MxConfig, how its tensors are named) of a quantized model directory:
    mxgemm's, compressed-tensors' MX formats, or transformers' mxfp4 (GPT-OSS)."""
    cfg_path = _checked(Path(path) / "config.json")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {cfg_path}: {e}") from e
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cfg_path} holds {type(cfg).__name__}, expected a JSON object")
    if "quantization_config" not in cfg:
        raise CheckpointError(f"{cfg_path} has no quantization_config: not an mxgemm-packed model")
    qc = cfg["quantization_config"]
    if not isinstance(qc, dict):
        raise CheckpointError(f"{cfg_path}: quantization_config is {qc!r}, expected a JSON object")
    try:
        if (reader := interop.READERS.get(qc.get("quant_method"))) is not None:
            return cfg, *reader(qc)
        return cfg, MxConfig.from_dict(qc), interop.MXGEMM
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{cfg_path}: {e}") from e


def save_quantized(model: nn.Module, path: str | Path, config: MxConfig, format: str = "mxgemm") -> None:  # noqa: A002
    """Write ``model`` (after :func:`mxgemm.quantize_`) as ``path/model.safetensors`` + config.json.

    ``format="compressed-tensors"`` writes compressed-tensors' layout of the same bytes instead
    (mxfp4, mxfp6_e2m3 and mxfp8_e4m3 with blocks of 32), which vLLM and compressed-tensors read;
    ``format="gpt-oss"`` writes GPT-OSS' ``quant_method: "mxfp4"`` layout (mxfp4 with blocks of 32).
    mxgemm reads both back (:mod:`mxgemm.interop`).

    config.json is the model's own (``model.config.to_dict()`` for Hugging Face models, if any) with
    ``quantization_config`` added; it is written last, so its presence marks a complete checkpoint.
    ``path`` is new, empty, or holds an earlier mxgemm checkpoint, which the save replaces whole (its
    index and every ``*.safetensors`` go first). Anything else that holds a checkpoint or config.json
    (say, the full-precision model) is refused with a :class:`CheckpointError` before anything is written.
    """
    path = Path(path)
    if format != "mxgemm" and format not in interop.WRITERS:
        raise ValueError(f"format must be one of {('mxgemm', *interop.WRITERS)}, got {format!r}")
    qc, naming = config.to_dict(), interop.MXGEMM
    if format in interop.WRITERS:
        plain = [n for n, m in model.named_modules() if type(m) is nn.Linear]
        try:
            qc, naming = interop.WRITERS[format](config, plain)
        except interop.InteropError as e:
            raise CheckpointError(f"cannot save {path} as {format}: {e}") from e
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"cannot save into {path}: it exists and is not a directory")
    if path.exists() and (why := shards.foreign_checkpoint(path)) is not None:
        raise CheckpointError(f"cannot save into {path}: {why}; save into a new or empty directory")
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if naming.foreign:
        tensors = _renamed(tensors, model, naming)
    old = [n for n in shards.checkpoint_files(path) if n != "config.json"]  # an earlier mxgemm save's
    for name in sorted(old, key=lambda n: not n.endswith(".index.json")):  # the index first
        (path / name).unlink()
    shards.write(_unshare(tensors), path / SINGLE_FILE, shards.metadata(config))
    cfg = model.config.to_dict() if hasattr(getattr(model, "config", None), "to_dict") else {}
    cfg["quantization_config"] = qc
    tmp = path / ".config.json.tmp"
    tmp.unlink(missing_ok=True)  # never write through a link planted under the temporary name
    tmp.write_text(json.dumps(cfg, indent=2, default=str))
    os.replace(tmp, path / "config.json")


def _renamed(
    tensors: dict[str, torch.Tensor], model: nn.Module, naming: interop.Naming
) -> dict[str, torch.Tensor]:
    """``tensors`` (a state dict of ``model``) with each MxLinear's blocks and scales under
    ``naming``'s names, the codes as it stores them."""
    out = dict(tensors)
    for name, mod in model.named_modules():
        if isinstance(mod, MxLinear):
            for ours, theirs in naming.renames(name):
                if ours in out:
                    t = out.pop(ours)
                    out[theirs] = naming.stored(t) if ours.endswith(BLOCKS) else t
    return out


def _unshare(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing storage (tied weights): give each its own copy."""
    seen: set[int] = set()
    out = {}
    for k, v in tensors.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen and v.numel() else v
        seen.add(ptr)
    return out


def _tensor_files(path: Path) -> dict[str, Path]:
    """tensor name → the safetensors file holding it (index.json if present, else every *.safetensors).
    An index may name only plain ``*.safetensors`` file names inside ``path``."""
    index = _checked(path / INDEX)
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"cannot read {index}: {e}") from e
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: weight_map is {type(weight_map).__name__}, expected an object")
        bad = [f for f in weight_map.values() if not shards.plain_name(f)]
        if bad:
            raise CheckpointError(
                f"{index} names shard {bad[0]!r}: a shard must be a *.safetensors file name inside {path}"
            )
        return {name: path / fname for name, fname in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors file in {path}")
    out: dict[str, Path] = {}
    for f in files:
        for name in _open(f).keys():  # noqa: SIM118
            if name in out:
                raise CheckpointError(
                    f"tensor {name!r} is in both {out[name]} and {f} (and {path} has no {INDEX})"
                )
            out[name] = f
    return out


def _checked(file: Path) -> Path:
    """``file`` of a model directory, if it may be read there (:func:`mxgemm.shards.link_problem`)."""
    if (why := shards.link_problem(file.parent, file)) is not None:
        raise CheckpointError(why)
    return file


def _open(file: Path):
    if not file.is_file():
        raise CheckpointError(f"missing checkpoint file {file}")
    _checked(file)
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"corrupt or unreadable safetensors file {file}: {e}") from e


def _foreign_tensor(t: torch.Tensor, name: str, file: Path, naming: interop.Naming) -> torch.Tensor:
    """A foreign checkpoint's codes as mxgemm's uint8 bytes (:meth:`~mxgemm.interop.Naming.unstored`),
    its scales as they are (with a warning where they hold E8M0 code 255, which that writer decodes
    otherwise)."""
    if name.endswith(naming.blocks):
        try:
            return naming.unstored(t, name)
        except interop.InteropError as e:
            raise CheckpointError(f"{file}: {e}") from e
    naming.warn_255(t, name, f" in {file}", stacklevel=3)
    return t


def _tied_elsewhere(state: dict[str, torch.Tensor], files: dict[str, Path]) -> set[str]:
    """Names of ``state`` that the checkpoint does not hold but that share their tensor with one it
    does (tied weights, e.g. ``lm_head.weight`` and the input embedding): loading that one loads them."""
    groups: dict[tuple, list[str]] = {}
    for name, t in state.items():
        if t.numel():
            groups.setdefault((t.device, t.data_ptr(), t.dtype, tuple(t.shape)), []).append(name)
    return {
        name
        for names in groups.values()
        if len(names) > 1 and any(n in files for n in names)
        for name in names
        if name not in files
    }


def load_quantized(model: nn.Module, path: str | Path, device: torch.device | str | None = None) -> nn.Module:
    """Load an mxgemm checkpoint into ``model`` (an unquantized instance of the same architecture).

    Every ``nn.Linear`` whose weight the checkpoint holds as ``_blocks``/``_scales`` becomes an
    :class:`MxLinear`; all tensors are then loaded and checked. Returns ``model`` on ``device``.
    """
    device = system.check_device(device)
    path = Path(path)
    _, config, naming = read_quantization(path)
    files = _tensor_files(path)
    stored: dict[str, str] = {}  # our tensor name -> its name in a foreign checkpoint
    for name, mod in list(model.named_modules()):
        codes, scales = naming.names(name)
        quantized = codes in files and (not naming.foreign or scales in files)
        if type(mod) is nn.Linear and quantized:
            _set_submodule(
                model,
                name,
                MxLinear(
                    mod.in_features,
                    mod.out_features,
                    mod.bias is not None,
                    fmt=config.fmt,
                    block_size=config.block_size,
                    a_dtype=config.a_dtype,
                    scale_mode=config.scale_mode,
                    rounding=config.rounding,
                    activations=config.activations,
                ),
            )
            if naming.foreign:
                for ours, theirs in naming.renames(name):
                    if theirs in files:
                        files[ours] = files.pop(theirs)
                        stored[ours] = theirs
    if device is not None:
        model.to(device)
    state = model.state_dict()
    tied = _tied_elsewhere(state, files)
    missing = [k for k in state if k not in files and k not in tied]
    if missing:
        packed = [k for k in missing if f"{k}_blocks" in files]  # GPT-OSS MoE experts, say
        raise CheckpointError(
            f"{path}: checkpoint lacks tensor(s) {', '.join(missing[:10])}"
            + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            + (
                f"; it holds {packed[0]}_blocks/_scales: quantized tensors of modules other than Linear "
                "(mxgemm.interop.gpt_oss_experts decodes GPT-OSS experts)"
                if packed
                else ""
            )
        )
    buffers = {name for name, _ in model.named_buffers()}  # non-persistent ones are not in state_dict
    extra = [k for k in files if k not in state and k not in buffers]
    if extra:
        warnings.warn(
            f"{path}: ignored tensors the model does not have: {', '.join(extra[:10])}", stacklevel=2
        )
    handles = {}
    with torch.no_grad():
        for name, target in state.items():
            if name in tied:
                continue
            file = files[name]
            if file not in handles:
                handles[file] = _open(file)
                if (why := shards.check_metadata(file, handles[file].metadata(), config)) is not None:
                    raise CheckpointError(why)
            try:
                t = handles[file].get_tensor(stored.get(name, name))
            except (SafetensorError, OSError, RuntimeError, ValueError) as e:
                raise CheckpointError(
                    f"cannot read tensor {stored.get(name, name)!r} from {file}: {e}"
                ) from e
            if name in stored:
                t = _foreign_tensor(t, stored[name], file, naming)
            if tuple(t.shape) != tuple(target.shape):
                raise CheckpointError(
                    f"tensor {name!r} in {file} has shape {list(t.shape)}, "
                    f"the model expects {list(target.shape)}"
                )
            if (target.dtype == torch.uint8) != (t.dtype == torch.uint8):
                raise CheckpointError(
                    f"tensor {name!r} in {file} is {t.dtype}, the model expects {target.dtype}"
                )
            owner = model.get_submodule(name.rpartition(".")[0])
            if isinstance(owner, MxLinear) and name.endswith(BLOCKS):
                owner.load_blocks(t)  # into the kernel layout (the state-dict tensor may be a copy)
            else:
                target.copy_(t)
    return model


def from_pretrained(
    path: str | Path, device: torch.device | str = "cpu", auto_class: str = "AutoModel"
) -> nn.Module:
    """A Hugging Face model from an mxgemm-packed directory (needs ``transformers``)."""
    import transformers

    system.check_device(device)
    path = Path(path)
    read_config(path)
    hf_config = transformers.AutoConfig.from_pretrained(str(path))
    model = getattr(transformers, auto_class).from_config(hf_config)
    return load_quantized(model, path, device).eval()
