"""`MxConfig`: how a model is quantized; serialized as ``quantization_config`` in config.json."""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from mxgemm import formats, scales
from mxgemm.options import A_DTYPE_NAMES, ROUNDINGS

QUANT_METHOD = "mxgemm"
LAYOUT_VERSION = 1  # the portable layout of mxgemm.packing; bump when it changes
A_DTYPES = {name: getattr(torch, name) for name in A_DTYPE_NAMES}


@dataclass
class MxActConfig:
    """How activations are quantized on the fly (per block along K, before the matmul).

    Attributes:
        fmt: format name (``mxgemm.formats.names()``).
        block_size: elements per scale along K; None → the format's default (32).
        scale_mode: as for weights (:func:`mxgemm.quantize`).
        rounding: a deterministic rounding (``stochastic`` would make inference draw random numbers).
    """

    fmt: str = "mxfp8_e4m3"
    block_size: int | None = None
    scale_mode: str = "floor"
    rounding: str = "even"

    def __post_init__(self) -> None:
        f = formats.get(self.fmt)
        self.block_size = formats.check_block_size(self.block_size, f)
        scales.check_scale_mode(self.scale_mode)
        allowed = tuple(r for r in ROUNDINGS if r != "stochastic")
        if self.rounding not in allowed:
            raise ValueError(f"activation rounding must be one of {allowed}, got {self.rounding!r}")

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`mxgemm.fake_quantize` / :func:`mxgemm.quantize`."""
        return {"block_size": self.block_size, "scale_mode": self.scale_mode, "rounding": self.rounding}


@dataclass
class MxConfig:
    """Validated quantization settings.

    Attributes:
        fmt: format name (``mxgemm.formats.names()``).
        block_size: elements per scale; None → the format's default (32).
        scale_mode: ``"floor"`` or ``"rceil"``. rounding: see :func:`mxgemm.quantize`.
        a_dtype: activation dtype the kernels run in, ``"float16"`` or ``"bfloat16"``.
        modules_to_not_convert: module names (or name suffixes) left in full precision.
        seed: random seed of ``rounding="stochastic"`` (required there; see :meth:`generator`).
        activations: quantize each layer's input too (:class:`MxActConfig`, or its dict); None (the
            default) keeps activations in ``a_dtype``.
    """

    fmt: str = "mxfp4"
    block_size: int | None = None
    scale_mode: str = "floor"
    rounding: str = "even"
    a_dtype: str = "bfloat16"
    modules_to_not_convert: list[str] = field(default_factory=lambda: ["lm_head"])
    seed: int | None = None
    activations: MxActConfig | None = None

    def __post_init__(self) -> None:
        f = formats.get(self.fmt)
        self.block_size = formats.check_block_size(self.block_size, f)
        scales.check_scale_mode(self.scale_mode)
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if self.rounding == "stochastic" and self.seed is None:
            raise ValueError("rounding='stochastic' needs a seed (MxConfig(seed=...), mxgemm pack --seed N)")
        self.a_dtype = str(self.a_dtype).removeprefix("torch.")
        if self.a_dtype not in A_DTYPES:
            raise ValueError(f"a_dtype must be one of {tuple(A_DTYPES)}, got {self.a_dtype!r}")
        if isinstance(self.modules_to_not_convert, str) or not all(
            isinstance(m, str) for m in self.modules_to_not_convert
        ):
            raise ValueError(
                f"modules_to_not_convert must be a list of names, got {self.modules_to_not_convert!r}"
            )
        self.modules_to_not_convert = list(self.modules_to_not_convert)
        if isinstance(self.activations, dict):
            self.activations = MxActConfig(**self.activations)
        elif self.activations is not None and not isinstance(self.activations, MxActConfig):
            raise ValueError(f"activations must be an MxActConfig, a dict or None, got {self.activations!r}")

    @property
    def torch_a_dtype(self) -> torch.dtype:
        return A_DTYPES[self.a_dtype]

    def skips(self, module_name: str) -> bool:
        """Whether ``module_name`` is listed (exactly, or as a dotted suffix) in modules_to_not_convert."""
        return any(module_name == m or module_name.endswith("." + m) for m in self.modules_to_not_convert)

    def generator(self, name: str, device: torch.device | str = "cpu") -> torch.Generator | None:
        """The random source for stochastic rounding of tensor ``name`` (on ``device``), seeded from
        ``seed`` and the name, so every layer draws its own numbers and a resumed pack gives the same
        bytes; None for the deterministic roundings."""
        if self.rounding != "stochastic":
            return None
        return torch.Generator(device=device).manual_seed(
            ((self.seed << 32) ^ zlib.crc32(name.encode())) % 2**64
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``quantization_config`` entry of config.json."""
        return {"quant_method": QUANT_METHOD, "layout_version": LAYOUT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MxConfig:
        """Inverse of :meth:`to_dict`; rejects other quant methods and unknown layout versions."""
        if not isinstance(d, dict):
            raise ValueError(f"quantization_config is {d!r}, expected a JSON object")
        if d.get("quant_method") != QUANT_METHOD:
            raise ValueError(
                f"quantization_config.quant_method is {d.get('quant_method')!r}, expected 'mxgemm'"
            )
        if d.get("layout_version") != LAYOUT_VERSION:
            raise ValueError(
                f"quantization_config.layout_version is {d.get('layout_version')!r}; this mxgemm reads "
                f"{LAYOUT_VERSION}: repack the model with this version"
            )
        known = {
            "fmt",
            "block_size",
            "scale_mode",
            "rounding",
            "a_dtype",
            "modules_to_not_convert",
            "seed",
            "activations",
        }
        return cls(**{k: v for k, v in d.items() if k in known})
