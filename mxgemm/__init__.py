"""mxgemm: mixed-precision GEMM kernels for OCP MX and block-floating-point weights, built with TVM.

The public names are imported on first use, so ``import mxgemm`` (and ``mxgemm --help``) loads neither
torch nor TVM until something needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {  # name -> module that defines it
    "CheckpointError": "mxgemm.checkpoint",
    "FakeQuantLinear": "mxgemm.qat",
    "Kernel": "mxgemm.codegen.build",
    "MxActConfig": "mxgemm.config",
    "MxConfig": "mxgemm.config",
    "MxLinear": "mxgemm.module",
    "MxTensor": "mxgemm.mx_tensor",
    "MxWeight": "mxgemm.weight",
    "build": "mxgemm.codegen.build",
    "convert_qat_": "mxgemm.qat",
    "dequantize": "mxgemm.reference",
    "fake_quantize": "mxgemm.fake_quant",
    "from_pretrained": "mxgemm.checkpoint",
    "linear": "mxgemm.ops",
    "load_quantized": "mxgemm.checkpoint",
    "prepare_qat_": "mxgemm.qat",
    "prim_func": "mxgemm.codegen.prim_func",
    "quantize": "mxgemm.reference",
    "quantize_": "mxgemm.module",
    "save_quantized": "mxgemm.checkpoint",
    "transform_weight": "mxgemm.layout",
}
_SUBMODULES = (
    "bench",
    "checkpoint",
    "codegen",
    "config",
    "demo",
    "formats",
    "interop",
    "layout",
    "module",
    "ops",
    "pack",
)

__all__ = [
    "CheckpointError",
    "FakeQuantLinear",
    "Kernel",
    "MxActConfig",
    "MxConfig",
    "MxLinear",
    "MxTensor",
    "MxWeight",
    "build",
    "convert_qat_",
    "dequantize",
    "fake_quantize",
    "formats",
    "from_pretrained",
    "linear",
    "load_quantized",
    "prepare_qat_",
    "prim_func",
    "quantize",
    "quantize_",
    "save_quantized",
    "transform_weight",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"mxgemm.{name}")
    else:
        raise AttributeError(f"module 'mxgemm' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_SUBMODULES})


def _install_hf_hook() -> None:
    from mxgemm import hf_hook

    hf_hook.install()


_install_hf_hook()  # transformers' from_pretrained knows quant_method "mxgemm" (mxgemm.hf)
