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

GPT-OSS / transformers (``quant_method: "mxfp4"``, :class:`transformers.Mxfp4Config`): mxfp4 (E2M1),
group 32. A tensor ``<t>`` is stored as ``<t>_blocks`` uint8 ``[..., n, k/32, 16]`` (even index in
the low nibble) and ``<t>_scales`` uint8 ``[..., n, k/32]``: mxgemm's portable bytes, reshaped.
GPT-OSS stores only its MoE experts so: ``mlp.experts.gate_up_proj`` (``n`` = 2 x intermediate, gate and up
rows interleaved, ``k`` = hidden) and ``mlp.experts.down_proj`` (``n`` = hidden, ``k`` =
intermediate), each with a leading expert dimension (:func:`gpt_oss_experts` decodes them); mxgemm
reads and writes a quantized Linear ``<m>`` the same way (``<m>.weight_blocks``, ``<m>.weight_scales``).
transformers decodes E8M0 code 255 as ``x * 2**128`` (``ldexp``), mxgemm as NaN: a warning names
the tensor.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from mxgemm.config import QUANT_METHOD, MxConfig
from mxgemm.weight import MxWeight

CT_METHOD = "compressed-tensors"
CT_FORMATS = {  # compressed-tensors format -> (mxgemm format, bits)
    "mxfp4-pack-quantized": ("mxfp4", 4),
    "mxfp6-pack-quantized": ("mxfp6_e2m3", 6),
    "mxfp8-quantized": ("mxfp8_e4m3", 8),
}
CT_FORMATS_BY_FMT = {fmt: name for name, (fmt, _) in CT_FORMATS.items()}
CT_GROUP = 32
CT_255 = "as 2**128 (inf in bfloat16)"
GPT_OSS, GPT_OSS_METHOD = "gpt-oss", "mxfp4"  # the format's name here, its quant_method
GPT_OSS_GROUP, GPT_OSS_GROUP_BYTES = 32, 16  # fp4 codes per scale; their bytes, the last dim of *_blocks


class InteropError(ValueError):
    """A foreign checkpoint or quantization_config that mxgemm cannot read or write: the message says
    what."""


@dataclass(frozen=True)
class Naming:
    """How a checkpoint stores a quantized Linear ``<m>``: ``<m><blocks>`` (the codes: uint8 or
    ``codes_dtype`` of the same bytes, ``[n, k*bits/8]``, or ``[n, groups, group_bytes]`` where
    ``group_bytes`` is set) and ``<m><scales>`` (uint8 E8M0); ``method``: the writer; ``decodes_255``:
    how it decodes E8M0 code 255."""

    blocks: str
    scales: str
    codes_dtype: torch.dtype = torch.uint8
    method: str = QUANT_METHOD
    group_bytes: int = 0
    decodes_255: str = "as NaN"

    @property
    def foreign(self) -> bool:
        return self.method != QUANT_METHOD

    def names(self, module: str) -> tuple[str, str]:
        """(codes, scales) tensor names of the quantized Linear ``module``."""
        return module + self.blocks, module + self.scales

    def renames(self, module: str) -> list[tuple[str, str]]:
        """[(mxgemm's name, this checkpoint's name)] of ``module``'s codes, then its scales."""
        return list(zip(MXGEMM.names(module), self.names(module), strict=True))

    def stored(self, blocks: torch.Tensor) -> torch.Tensor:
        """mxgemm's codes (uint8 ``[..., k*bits/8]``) as this checkpoint stores them."""
        t = blocks.view(self.codes_dtype)
        return t.unflatten(-1, (-1, self.group_bytes)) if self.group_bytes else t

    def unstored(self, codes: torch.Tensor, name: str) -> torch.Tensor:
        """This checkpoint's codes tensor ``name`` as mxgemm's (uint8 ``[..., k*bits/8]``);
        InteropError if its dtype or last dim is not this writer's."""
        if codes.dtype != self.codes_dtype:
            raise InteropError(f"tensor {name!r} is {codes.dtype}, {self.method} stores {self.codes_dtype}")
        if not self.group_bytes:
            return codes.view(torch.uint8)
        if codes.dim() < 2 or codes.shape[-1] != self.group_bytes:
            raise InteropError(
                f"tensor {name!r} has shape {list(codes.shape)}, {self.method} stores "
                f"[..., groups, {self.group_bytes}]"
            )
        return codes.flatten(-2)

    def warn_255(self, scales: torch.Tensor, name: str, where: str = "", stacklevel: int = 2) -> None:
        """Warn if the E8M0 scales (uint8) tensor ``name`` (found ``where``) holds code 255, which this
        writer decodes otherwise than mxgemm (NaN)."""
        if scales.dtype == torch.uint8 and (nan := int((scales == 255).sum())):
            warnings.warn(
                f"tensor {name!r}{where} holds E8M0 code 255 in {nan} block(s): mxgemm decodes it as NaN "
                f"(OCP MX), {self.method} {self.decodes_255}",
                stacklevel=stacklevel + 1,
            )


MXGEMM = Naming(".weight_blocks", ".weight_scales")
GPT_OSS_NAMING = Naming(
    ".weight_blocks", ".weight_scales", torch.uint8, GPT_OSS, GPT_OSS_GROUP_BYTES,
    "(transformers' mxfp4) as x * 2**128 (inf in bfloat16 where |x| >= 1)",
)  # fmt: skip


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
        Naming(".weight", ".weight_scale", torch.float8_e4m3fn, CT_METHOD, decodes_255=CT_255)
        if bits == 8
        else Naming(".weight_packed", ".weight_scale", torch.uint8, CT_METHOD, decodes_255=CT_255)
    )
    return config, naming


def compressed_tensors_config(config: MxConfig, ignore: list[str]) -> tuple[dict[str, Any], Naming]:
    """(the compressed-tensors ``quantization_config``, Naming) that stores ``config``'s weights, with
    the Linears named in ``ignore`` left in full precision; InteropError for other formats/blocks."""
    _check_writable(config, CT_METHOD, list(CT_FORMATS_BY_FMT), CT_GROUP)
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


def _check_writable(config: MxConfig, writer: str, fmts: list[str], block: int) -> None:
    """InteropError unless ``config`` is weight-only, one of ``fmts``, with blocks of ``block``."""
    if config.fmt not in fmts or config.block_size != block:
        raise InteropError(
            f"{writer} stores {', '.join(fmts)} with blocks of {block}; "
            f"this model is {config.fmt} with blocks of {config.block_size}"
        )
    if config.activations is not None:
        raise InteropError(
            f"this model quantizes its activations (MxConfig.activations); mxgemm writes only "
            f"weight-only {writer} checkpoints: save it in mxgemm's format"
        )


def gpt_oss(qc: dict[str, Any], a_dtype: str = "bfloat16") -> tuple[MxConfig, Naming]:
    """(MxConfig, Naming) of a transformers ``quant_method: "mxfp4"`` (GPT-OSS) ``quantization_config``.
    Its ``modules_to_not_convert`` patterns (``model.layers.*.self_attn``) are dropped: what is quantized
    is read from the tensors present."""
    skip = qc.get("modules_to_not_convert") or []
    if not isinstance(skip, list):
        raise InteropError(f"mxfp4 quantization_config: modules_to_not_convert is {skip!r}, expected a list")
    plain = [m for m in skip if isinstance(m, str) and not any(c in m for c in "*?[]()|\\^$+{}")]
    config = MxConfig("mxfp4", block_size=GPT_OSS_GROUP, a_dtype=a_dtype, modules_to_not_convert=plain)
    return config, GPT_OSS_NAMING


def gpt_oss_config(config: MxConfig, ignore: list[str]) -> tuple[dict[str, Any], Naming]:
    """(the ``quant_method: "mxfp4"`` ``quantization_config``, Naming) that stores ``config``'s weights
    in the GPT-OSS layout, the Linears named in ``ignore`` left in full precision; InteropError unless
    ``config`` is weight-only mxfp4 with blocks of 32."""
    _check_writable(config, GPT_OSS, ["mxfp4"], GPT_OSS_GROUP)
    return {"quant_method": GPT_OSS_METHOD, "modules_to_not_convert": sorted(ignore)}, GPT_OSS_NAMING


def gpt_oss_experts(blocks: torch.Tensor, scales: torch.Tensor, name: str = "experts") -> MxWeight:
    """GPT-OSS MoE expert weights as an mxfp4 :class:`MxWeight` of shape ``[E, n, k]`` (no copy).

    ``blocks``: uint8 ``[E, n, k/32, 16]`` (``<p>_blocks``), ``scales``: uint8 ``[E, n, k/32]``
    (``<p>_scales``), for ``<p>`` = ``mlp.experts.gate_up_proj`` (n = 2 x intermediate with gate and up
    rows interleaved, k = hidden) or ``mlp.experts.down_proj`` (n = hidden, k = intermediate).
    transformers' ``GptOssExperts`` holds the transpose, ``[E, k, n]``. ``name`` is used in the
    warning given where ``scales`` holds code 255 (NaN here, ``x * 2**128`` in transformers)."""
    codes = GPT_OSS_NAMING.unstored(blocks, f"{name}_blocks")
    if blocks.dim() != 4 or tuple(scales.shape) != tuple(blocks.shape[:-1]):
        raise InteropError(
            f"GPT-OSS experts: blocks {list(blocks.shape)} / scales {list(scales.shape)} are not "
            "uint8 [E, n, k/32, 16] / [E, n, k/32]"
        )
    GPT_OSS_NAMING.warn_255(scales, f"{name}_scales")
    e, n, g = scales.shape
    return MxWeight(codes, scales, "mxfp4", GPT_OSS_GROUP, (e, n, g * GPT_OSS_GROUP))


READERS = {CT_METHOD: compressed_tensors, GPT_OSS_METHOD: gpt_oss}  # quant_method -> reader
WRITERS = {CT_METHOD: compressed_tensors_config, GPT_OSS: gpt_oss_config}  # save/pack format -> writer
