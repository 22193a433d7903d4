"""mxgemm: mixed-precision GEMM kernels for OCP MX and block-floating-point weights, built with TVM."""

__version__ = "0.1.0"

from mxgemm import formats  # noqa: E402
from mxgemm.checkpoint import from_pretrained, load_quantized, save_quantized  # noqa: E402
from mxgemm.codegen.build import Kernel, build  # noqa: E402
from mxgemm.config import MxConfig  # noqa: E402
from mxgemm.layout import transform_weight  # noqa: E402
from mxgemm.module import MxLinear, quantize_  # noqa: E402
from mxgemm.ops import linear  # noqa: E402
from mxgemm.reference import dequantize, quantize  # noqa: E402
from mxgemm.weight import MxWeight  # noqa: E402


def prim_func(*args, **kwargs):
    """See :func:`mxgemm.codegen.prim_func.prim_func` (imported on first use: TVM takes ~3 s to import)."""
    from mxgemm.codegen.prim_func import prim_func as _prim_func

    return _prim_func(*args, **kwargs)


__all__ = [
    "Kernel",
    "MxConfig",
    "MxLinear",
    "MxWeight",
    "build",
    "dequantize",
    "formats",
    "from_pretrained",
    "linear",
    "load_quantized",
    "prim_func",
    "quantize",
    "quantize_",
    "save_quantized",
    "transform_weight",
]
