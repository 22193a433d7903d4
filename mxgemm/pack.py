"""`mxgemm pack`: quantize a Hugging Face checkpoint's linear weights into the portable MX/BFP layout.

The offline phase (gpt-fast's ``create_quantized_state_dict``); loading the result is the runtime phase.

Input: a model directory with ``config.json`` and ``model.safetensors`` or shards named by
``model.safetensors.index.json``. A tensor ``<module>.weight`` is quantized when it is 2-D and fp32 /
fp16 / bf16, its in_features (last dim) is a multiple of the block size, the module is not an embedding
(last name component contains ``embed`` or is ``wte``/``wpe``/``shared``) and ``config.skips(module)``
is false. It becomes the uint8 tensors ``<module>.weight_blocks`` and ``<module>.weight_scales``
(:class:`~mxgemm.weight.MxWeight` ``blocks``/``scales``, the portable layout); every other tensor is
copied unchanged.

Output: one shard per input shard (same file names, safetensors metadata :func:`mxgemm.shards.metadata`;
byte-reproducible), ``model.safetensors.index.json``, every other file and folder of the source, and
``config.json`` with ``quantization_config`` (:meth:`MxConfig.to_dict`).
``output_format="compressed-tensors"`` names and types the same bytes as compressed-tensors does, with
its ``quantization_config`` (mxfp4, mxfp6_e2m3, mxfp8_e4m3, blocks of 32); ``output_format="gpt-oss"``
stores them as GPT-OSS does (transformers' ``quant_method: "mxfp4"``; mxfp4, blocks of 32): see
:mod:`mxgemm.interop`. Shards
are read tensor by tensor and written to a temporary file, then renamed into place. A manifest
(:data:`MANIFEST`) records the configuration and each finished shard's source size and mtime, so an
interrupted run resumes where it stopped. The index and config.json are written last, then the manifest
is removed: a directory whose config.json holds an mxgemm ``quantization_config`` is complete. The
source directory is only read.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from mxgemm import interop, shards
from mxgemm.config import QUANT_METHOD, MxConfig
from mxgemm.metrics import sqnr_db
from mxgemm.reference import dequantize, quantize

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MANIFEST = ".mxgemm-pack.json"
MANIFEST_VERSION = 1
FLOAT_DTYPES = ("F32", "F16", "BF16")  # safetensors dtype names of the weights pack quantizes
EMBEDDING_NAMES = ("wte", "wpe", "shared")
# Top-level source entries not copied: VCS / download caches, and full-precision weights in other
# files or formats that the packed shards replace.
SKIPPED_DIRS = (".git", ".cache")
REPLACED_WEIGHTS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "tf_model*.h5",
    "flax_model*.msgpack",
)
_TMP_SUFFIX = shards.TMP_SUFFIX
_MAX_HEADER = 100_000_000  # bytes; safetensors' own limit


class PackError(ValueError):
    """A source or output directory that :func:`pack` cannot use; the message names file and problem."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of a safetensors header: dtype name (``"F32"``...), shape, and size in bytes."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class LayerRow:
    """One quantized layer: module name, weight shape ``(N, K)``, bits per weight incl. scales, SQNR."""

    name: str
    shape: tuple[int, ...]
    bits_per_weight: float
    sqnr_db: float


@dataclass
class PackReport:
    """What :func:`pack` did.

    Attributes:
        out_dir: the packed model directory.
        config: the settings used.
        layers: quantized layers in checkpoint order.
        unaligned: 2-D weights left in full precision because in_features % block_size != 0.
        source_bytes: bytes of all source tensors. output_bytes: of all output tensors (the index's
            ``total_size``).
        seconds: wall time of the call.
        resumed_shards: shards finished by an earlier, interrupted run and not redone.
    """

    out_dir: Path
    config: MxConfig
    layers: list[LayerRow]
    unaligned: list[str]
    source_bytes: int
    output_bytes: int
    seconds: float
    resumed_shards: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.source_bytes / self.output_bytes

    def table(self) -> str:
        """The per-layer table: name, shape, bits/weight, SQNR dB."""
        shapes = ["x".join(map(str, r.shape)) for r in self.layers]
        w = max([len("layer"), *(len(r.name) for r in self.layers)])
        sw = max([len("shape"), *map(len, shapes)])
        lines = [f"{'layer':<{w}}  {'shape':>{sw}}  {'bits/w':>6}  {'SQNR dB':>7}"]
        lines += [
            f"{r.name:<{w}}  {s:>{sw}}  {r.bits_per_weight:>6.2f}  {r.sqnr_db:>7.2f}"
            for r, s in zip(self.layers, shapes, strict=True)
        ]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: layers, total tensor sizes before and after, ratio, time."""
        return (
            f"packed {len(self.layers)} layers ({self.config.fmt}): {_mb(self.source_bytes)} -> "
            f"{_mb(self.output_bytes)} ({self.ratio:.2f}x) in {self.seconds:.1f} s"
        )


@dataclass
class _Source:
    dir: Path
    config: dict[str, Any]
    shards: dict[str, dict[str, TensorInfo]]  # shard file name -> its tensors
    copied: list[str]  # other files and folders (relative paths, folders first), copied unchanged
    replaced: list[str]  # top-level full-precision weight files not copied


def pack(
    src_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: MxConfig,
    *,
    progress: bool = True,
    output_format: str = "mxgemm",
) -> PackReport:
    """Quantize the model in ``src_dir`` into ``out_dir`` (module docstring: what, where, resume).

    Args:
        src_dir: Hugging Face model directory (config.json + safetensors); never modified.
        out_dir: new or empty directory, or one left by an interrupted pack with the same ``config``
            (resumed; a symbolic link in it is refused); not ``src_dir`` nor inside it.
        config: format, block size, scale mode, rounding, ``modules_to_not_convert``.
        progress: show a tqdm bar over tensors on stderr.
        output_format: ``"mxgemm"``, ``"compressed-tensors"`` (what vLLM and compressed-tensors read) or
            ``"gpt-oss"`` (GPT-OSS' layout, transformers' ``quant_method: "mxfp4"``).

    Returns:
        :class:`PackReport`. Warns (``UserWarning``) listing the layers left in full precision because
        their in_features is not a multiple of the block size, and any full-precision weight files of
        other formats that were not copied.

    Raises:
        PackError: unusable source or output directory (the message names the file), checked before
            anything is written.
    """
    t0 = time.perf_counter()
    naming = _naming(config, output_format)
    src, out = Path(src_dir).resolve(), Path(out_dir).resolve()
    if not src.is_dir():
        raise PackError(f"model directory {src} does not exist or is not a directory")
    if out == src or out.is_relative_to(src):
        raise PackError(f"output directory {out} is the model directory {src} or inside it: pick another one")
    source = _read_source(src)
    unaligned = _check_names(source, config, naming)
    manifest = _prepare_output(out, config, output_format)
    if unaligned:
        warnings.warn(
            f"{len(unaligned)} layer(s) left in full precision: in_features is not a multiple of "
            f"block_size={config.block_size}: {', '.join(unaligned)}",
            stacklevel=2,
        )
    if source.replaced:
        warnings.warn(
            f"not copied from {src} (full-precision weights the packed shards replace): "
            f"{', '.join(source.replaced)}",
            stacklevel=2,
        )

    layers: list[LayerRow] = []
    resumed: list[str] = []
    total = sum(map(len, source.shards.values()))
    with tqdm(total=total, unit="tensor", desc="pack", file=sys.stderr, disable=not progress) as bar:
        for shard, tensors in source.shards.items():
            stamp = _stamp(src / shard)
            done = manifest["shards"].get(shard)
            if done is not None and done["source"] == stamp and (out / shard).is_file():
                rows = [
                    LayerRow(r["name"], tuple(r["shape"]), r["bits_per_weight"], r["sqnr_db"])
                    for r in done["layers"]
                ]
                resumed.append(shard)
                bar.update(len(tensors))
            else:
                bar.set_postfix_str(shard)
                rows = _pack_shard(src / shard, out / shard, tensors, config, bar, naming)
                manifest["shards"][shard] = {"source": stamp, "layers": [asdict(r) for r in rows]}
                _write_json(out / MANIFEST, manifest)
            layers += rows

    _copy_others(source, out)
    output_bytes = _write_index(out, list(source.shards))
    qc = config.to_dict()
    if naming.foreign:
        ignore = {*config.modules_to_not_convert, *_unconverted(source, config)}
        qc = interop.WRITERS[output_format](config, sorted(ignore))[0]
    _write_json(out / CONFIG, {**source.config, "quantization_config": qc})
    (out / MANIFEST).unlink()
    return PackReport(
        out_dir=out,
        config=config,
        layers=layers,
        unaligned=unaligned,
        source_bytes=sum(i.nbytes for t in source.shards.values() for i in t.values()),
        output_bytes=output_bytes,
        seconds=time.perf_counter() - t0,
        resumed_shards=resumed,
    )


def _copy_others(source: _Source, out: Path) -> None:
    """Copy the source's other files and folders (tokenizer, pooling config, ...) into ``out`` as
    regular files and folders, never writing through a link found in ``out``."""
    for rel in source.copied:
        s, d = source.dir / rel, out / rel
        if d.is_symlink():
            raise PackError(f"{d} is a symbolic link: pack writes only regular files inside {out}")
        if s.is_dir():
            d.mkdir(exist_ok=True)
        else:
            _copy_file(s, d)


def _walk(root: Path, path: Path, seen: frozenset[Path] = frozenset()) -> list[str]:
    """``path`` and, for a folder, everything below it, as paths relative to ``root``, folders before
    their contents; raises PackError on a link :func:`mxgemm.shards.link_problem` refuses or a cycle."""
    if (why := shards.link_problem(root, path)) is not None:
        raise PackError(why)
    out = [str(path.relative_to(root))]
    if path.is_dir():
        real = path.resolve()
        if real in seen:
            raise PackError(f"{path} is a link to one of its own parent folders ({real})")
        for child in sorted(path.iterdir()):
            out += _walk(root, child, seen | {real})
    return out


def _write_index(out: Path, shards: list[str]) -> int:
    """Write the index of the output shards; returns its ``total_size`` (bytes of all tensors)."""
    weight_map, total = {}, 0
    for shard in shards:
        for name, info in _read_header(out / shard).items():
            weight_map[name] = shard
            total += info.nbytes
    _write_json(
        out / INDEX, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    )
    return total


def linear_module(name: str, info: TensorInfo, config: MxConfig) -> str | None:
    """The module name if tensor ``name`` is a linear layer's weight that ``config`` quantizes, alignment
    aside (see the module docstring); otherwise None."""
    if not name.endswith(".weight") or len(info.shape) != 2 or info.dtype not in FLOAT_DTYPES:
        return None
    module = name.removesuffix(".weight")
    last = module.rsplit(".", 1)[-1].lower()
    if not module or "embed" in last or last in EMBEDDING_NAMES or config.skips(module):
        return None
    return module


def _quantizes(name: str, info: TensorInfo, config: MxConfig) -> bool:
    return linear_module(name, info, config) is not None and info.shape[1] % config.block_size == 0


def _read_source(src: Path) -> _Source:
    cfg_path = src / CONFIG
    for p in (cfg_path, src / INDEX):
        if p.exists() and (why := shards.link_problem(src, p)) is not None:
            raise PackError(why)
    cfg = _load_json(cfg_path, "model config")
    qc = cfg.get("quantization_config")
    if qc is not None:
        method = qc.get("quant_method") if isinstance(qc, dict) else None
        if method == QUANT_METHOD:
            raise PackError(
                f"{cfg_path} already has an mxgemm quantization_config: {src} is already packed; "
                "pack its full-precision source instead"
            )
        raise PackError(
            f"{cfg_path} has a quantization_config (quant_method {method!r}): pack needs a "
            "full-precision model"
        )

    index = src / INDEX
    if index.exists():
        weight_map = _load_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise PackError(f"{index} has no weight_map (expected {{tensor name: shard file}})")
        names = sorted(set(weight_map.values()))
        for n in names:
            if not isinstance(n, str) or Path(n).name != n or not n.endswith(".safetensors"):
                raise PackError(f"{index} names shard {n!r}: expected a *.safetensors file name in {src}")
            if not (src / n).is_file():
                raise PackError(f"{index} names shard {n}, which is missing from {src}")
    elif (src / SINGLE_FILE).is_file():
        names = [SINGLE_FILE]
    else:
        found = sorted(p.name for p in src.glob("*.safetensors"))
        hint = f" (found {', '.join(found)}: a sharded checkpoint needs its index)" if found else ""
        raise PackError(f"no {SINGLE_FILE} or {INDEX} in {src}{hint}; pack reads safetensors checkpoints")

    tensors: dict[str, dict[str, TensorInfo]] = {}
    seen: dict[str, str] = {}
    for n in names:
        if (why := shards.link_problem(src, src / n)) is not None:
            raise PackError(why)
        tensors[n] = _read_header(src / n)
        for t in tensors[n]:
            if t in seen:
                raise PackError(f"tensor {t} is in both {src / seen[t]} and {src / n}")
            seen[t] = n

    copied, replaced = [], []
    for p in sorted(src.iterdir()):
        if p.name in (CONFIG, INDEX, *names) or p.name in SKIPPED_DIRS:
            continue
        if p.is_file() and any(p.match(pat) for pat in REPLACED_WEIGHTS):
            replaced.append(p.name)
        else:
            copied += _walk(src, p)
    return _Source(src, cfg, tensors, copied, replaced)


def _check_names(source: _Source, config: MxConfig, naming: interop.Naming = interop.MXGEMM) -> list[str]:
    """The unaligned linear layers; raises if an output name would collide with a source tensor."""
    every = {t for tensors in source.shards.values() for t in tensors}
    unaligned = []
    for shard, tensors in source.shards.items():
        for name, info in tensors.items():
            if _quantizes(name, info, config):
                module = name.removesuffix(".weight")
                clash = (set(naming.names(module)) - {name}) & every
                if clash:
                    raise PackError(
                        f"{source.dir / shard}: tensor {name} would be packed to {min(clash)}, which the "
                        "checkpoint already holds"
                    )
            elif linear_module(name, info, config) is not None:
                unaligned.append(linear_module(name, info, config))
    return unaligned


def _prepare_output(out: Path, config: MxConfig, output_format: str = QUANT_METHOD) -> dict[str, Any]:
    """Check ``out`` and return the manifest to continue: a new one, or an interrupted run's."""
    manifest_path = out / MANIFEST
    want = config.to_dict()
    if output_format != QUANT_METHOD:
        want["output_format"] = output_format
    if out.exists() and not out.is_dir():
        raise PackError(f"output {out} exists and is not a directory")
    if manifest_path.exists():
        manifest = _load_json(manifest_path, "pack manifest")
        had = manifest.get("config")
        if manifest.get("version") != MANIFEST_VERSION or not isinstance(manifest.get("shards"), dict):
            raise PackError(
                f"{manifest_path} is not a manifest this mxgemm wrote: use a new or empty directory"
            )
        if had != want:
            diff = ", ".join(
                f"{k} {had.get(k)!r} there, {want.get(k)!r} now"
                for k in sorted(set(want) | set(had if isinstance(had, dict) else {}))
                if not isinstance(had, dict) or had.get(k) != want.get(k)
            )
            raise PackError(
                f"{out} holds an interrupted pack with other settings ({diff}; see {manifest_path}): use a "
                "new or empty output directory, or rerun with the same settings to resume"
            )
        for tmp in _regular_files(out):
            if tmp.name.endswith(_TMP_SUFFIX):
                tmp.unlink()
        return manifest
    if out.exists() and any(out.iterdir()):
        if shards.written_by_mxgemm(out):
            raise PackError(
                f"{out} already holds a finished mxgemm pack ({out / CONFIG} has its quantization_config): "
                "use a new or empty output directory"
            )
        if (why := shards.foreign_checkpoint(out)) is not None:
            raise PackError(f"cannot pack into {out}: {why}; use a new or empty directory")
        raise PackError(
            f"output directory {out} is not empty and is not an interrupted mxgemm pack (no {MANIFEST}): "
            "use a new or empty directory"
        )
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"version": MANIFEST_VERSION, "config": want, "shards": {}}
    _write_json(manifest_path, manifest)
    return manifest


def _naming(config: MxConfig, output_format: str) -> interop.Naming:
    """How the packed tensors are named: mxgemm's, or one of :data:`mxgemm.interop.WRITERS`' (PackError
    if it cannot hold ``config``)."""
    if output_format == QUANT_METHOD:
        return interop.MXGEMM
    if output_format not in interop.WRITERS:
        raise PackError(
            f"output_format must be one of {(QUANT_METHOD, *interop.WRITERS)}, got {output_format!r}"
        )
    try:
        return interop.WRITERS[output_format](config, [])[1]
    except interop.InteropError as e:
        raise PackError(f"cannot pack as {output_format}: {e}") from e


def _unconverted(source: _Source, config: MxConfig) -> list[str]:
    """Linear-like modules (2-D float ``.weight``, not an embedding) that stay in full precision."""
    anything = MxConfig(config.fmt, block_size=config.block_size, modules_to_not_convert=[])
    return [
        module
        for tensors in source.shards.values()
        for name, info in tensors.items()
        if (module := linear_module(name, info, anything)) is not None and not _quantizes(name, info, config)
    ]


def _pack_shard(
    src: Path,
    dst: Path,
    tensors: dict[str, TensorInfo],
    config: MxConfig,
    bar: tqdm,
    naming: interop.Naming = interop.MXGEMM,
) -> list[LayerRow]:
    """Quantize/copy one shard tensor by tensor into ``dst`` (written whole, then renamed into place)."""
    out: dict[str, torch.Tensor] = {}
    rows = []
    with safe_open(str(src), framework="pt") as f:
        for name, info in tensors.items():
            w = f.get_tensor(name)
            if _quantizes(name, info, config):
                q = quantize(
                    w,
                    config.fmt,
                    block_size=config.block_size,
                    scale_mode=config.scale_mode,
                    rounding=config.rounding,
                    generator=config.generator(name),
                )
                module = linear_module(name, info, config)
                codes, scales = naming.names(module)
                out[codes], out[scales] = naming.stored(q.blocks), q.scales
                rows.append(LayerRow(module, info.shape, q.bits_per_weight, sqnr_db(w, dequantize(q))))
            else:
                out[name] = w
            bar.update()
    shards.write(out, dst, shards.metadata(config), mode_of=src)
    return rows


def _read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of a safetensors file, from its JSON header (no tensor data is read)."""
    try:
        with safe_open(str(path), framework="pt"):
            pass  # safetensors' own checks: offsets cover the file exactly, dtypes known
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 0 < n <= _MAX_HEADER:
                raise ValueError(f"header length {n}")
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        return {
            k: TensorInfo(v["dtype"], tuple(v["shape"]), v["data_offsets"][1] - v["data_offsets"][0])
            for k, v in header.items()
        }
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise PackError(f"{path} is not a readable safetensors file ({type(e).__name__}: {e})") from None


def _load_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise PackError(f"{what} {path} is missing")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PackError(f"{what} {path} is not readable JSON: {e}") from None
    if not isinstance(d, dict):
        raise PackError(f"{what} {path} holds {type(d).__name__}, expected a JSON object")
    return d


def _regular_files(out: Path) -> list[Path]:
    """Every file below ``out``, which an interrupted pack left; raises PackError on a symbolic link
    there (pack writes only regular files inside ``out``, never through a link)."""
    files = []
    for root, dirs, names in os.walk(out):
        for name in dirs + names:
            if (p := Path(root) / name).is_symlink():
                raise PackError(f"{p} is a symbolic link: pack writes only regular files inside {out}")
        files += [Path(root) / name for name in names]
    return files


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + _TMP_SUFFIX)
    tmp.unlink(missing_ok=True)  # never write through a link planted under the temporary name
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> str:
    """``shutil.copy2`` through a temporary file, so a rerun replaces a read-only or half-copied file."""
    tmp = Path(dst).with_name(Path(dst).name + _TMP_SUFFIX)
    tmp.unlink(missing_ok=True)  # never write through a link planted under the temporary name
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)
    return str(dst)


def _stamp(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


__all__ = ["LayerRow", "PackError", "PackReport", "TensorInfo", "linear_module", "pack"]
