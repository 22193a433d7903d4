"""The MX checkpoints other tools write: how they name and type a quantized Linear's tensors.

compressed-tensors (llm-compressor's format, which vLLM serves): ``quantization_config.quant_method``
``"compressed-tensors"`` with the formats ``mxfp4-pack-quantized`` (E2M1), ``mxfp6-pack-quantized``
(E2M3) and ``mxfp8-quantized`` (E4M3), group 32. A quantized Linear ``<m>`` holds ``<m>.weight_packed``
uint8 ``[n, k/2]`` (fp4: even index in the low nibble) or ``[n, 3k/4]`` (fp6: four codes in three
bytes, little endian), or ``<m>.weight`` float8_e4m3fn ``[n, k]`` (fp8), plus ``<m>.weight_scale`` uint8
``[n, k/32]`` (E8M0, bias 127). These are the bytes of mxgemm's portable layout, so reading and
writing them renames tensors and nothing else. One difference: E8M0 code 255 is NaN in OCP MX (and
here), where compressed-tensors computes ``2**128`` (inf in bf16); a checkpoint holding it gets a
warning naming the tensor.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from mxgemm.config import QUANT_METHOD, MxConfig

CT_METHOD = "compressed-tensors"
CT_FORMATS = {  # compressed-tensors format -> (mxgemm format, bits)
    "mxfp4-pack-quantized": ("mxfp4", 4),
    "mxfp6-pack-quantized": ("mxfp6_e2m3", 6),
    "mxfp8-quantized": ("mxfp8_e4m3", 8),
}
CT_FORMATS_BY_FMT = {fmt: name for name, (fmt, _) in CT_FORMATS.items()}
CT_GROUP = 32


@dataclass(frozen=True)
class Naming:
    """How a checkpoint stores a quantized Linear ``<m>``: ``<m><blocks>`` (the codes, uint8 or
    ``codes_dtype`` of the same bytes) and ``<m><scales>`` (uint8 E8M0); ``method``: the writer."""

    blocks: str
    scales: str
    codes_dtype: torch.dtype = torch.uint8
    method: str = QUANT_METHOD

    @property
    def foreign(self) -> bool:
        return self.method != QUANT_METHOD

    def names(self, module: str) -> tuple[str, str]:
        """(codes, scales) tensor names of the quantized Linear ``module``."""
        return module + self.blocks, module + self.scales

    def renames(self, module: str) -> list[tuple[str, str]]:
        """[(mxgemm's name, this checkpoint's name)] of ``module``'s codes, then its scales."""
        return list(zip(MXGEMM.names(module), self.names(module), strict=True))


MXGEMM = Naming(".weight_blocks", ".weight_scales")


class InteropError(ValueError):
    """A foreign quantization_config that mxgemm cannot read: the message says what."""


def compressed_tensors(qc: dict[str, Any], a_dtype: str = "bfloat16") -> tuple[MxConfig, Naming]:
    """(MxConfig, Naming) of a compressed-tensors ``quantization_config`` whose every config group is
    one of :data:`CT_FORMATS` (weights only: quantized activations are not applied, with a warning)."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise InteropError("compressed-tensors quantization_config has no config_groups")
    names = {g.get("format") or qc.get("format") for g in groups.values() if isinstance(g, dict)}
    fmt_name = next(iter(names)) if len(names) == 1 else None
    if fmt_name not in CT_FORMATS:
        raise InteropError(
            f"compressed-tensors format(s) {sorted(map(str, names))} in config_groups: mxgemm reads one of "
            f"{', '.join(CT_FORMATS)} for the whole model"
        )
    fmt, bits = CT_FORMATS[fmt_name]
    for name, g in groups.items():
        w = g.get("weights") or {}
        want = {"num_bits": bits, "type": "float", "strategy": "group", "group_size": CT_GROUP}
        got = {k: w.get(k) for k in want}
        if got != want or w.get("symmetric") is False:
            raise InteropError(
                f"compressed-tensors group {name!r}: weights {got} are not {fmt_name} ({want})"
            )
        if g.get("input_activations") or g.get("output_activations"):
            warnings.warn(
                f"compressed-tensors group {name!r} quantizes activations too: mxgemm runs its weights "
                f"with {a_dtype} activations",
                stacklevel=3,
            )
    ignore = [m for m in qc.get("ignore") or [] if isinstance(m, str) and not m.startswith("re:")]
    config = MxConfig(fmt, block_size=CT_GROUP, a_dtype=a_dtype, modules_to_not_convert=ignore)
    naming = (
        Naming(".weight", ".weight_scale", torch.float8_e4m3fn, CT_METHOD)
        if bits == 8
        else Naming(".weight_packed", ".weight_scale", torch.uint8, CT_METHOD)
    )
    return config, naming


def compressed_tensors_config(config: MxConfig, ignore: list[str]) -> tuple[dict[str, Any], Naming]:
    """(the compressed-tensors ``quantization_config``, Naming) that stores ``config``'s weights, with
    the Linears named in ``ignore`` left in full precision; InteropError for other formats/blocks."""
    if config.fmt not in CT_FORMATS_BY_FMT or config.block_size != CT_GROUP:
        raise InteropError(
            f"compressed-tensors stores {', '.join(CT_FORMATS_BY_FMT)} with blocks of {CT_GROUP}; "
            f"this model is {config.fmt} with blocks of {config.block_size}"
        )
    if config.activations is not None:
        raise InteropError(
            "this model quantizes its activations (MxConfig.activations); mxgemm writes only "
            "weight-only compressed-tensors checkpoints: save it in mxgemm's format"
        )
    name = CT_FORMATS_BY_FMT[config.fmt]
    bits = CT_FORMATS[name][1]
    weights = {"num_bits": bits, "type": "float", "symmetric": True, "group_size": CT_GROUP}
    weights.update(strategy="group", dynamic=False, scale_dtype="torch.uint8")
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}
    qc = {
        "config_groups": {"group_0": {**group, "format": None}},
        "quant_method": CT_METHOD,
        "kv_cache_scheme": None,
        "format": name,
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": sorted(ignore),
    }
    return qc, compressed_tensors(qc, config.a_dtype)[1]
