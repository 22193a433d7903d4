"""mxgemm: mixed-precision GEMM kernels for OCP MX and block-floating-point weights, built with TVM."""

from mxgemm import formats
from mxgemm.reference import dequantize, quantize
from mxgemm.weight import MxWeight

__version__ = "0.1.0"

__all__ = ["MxWeight", "dequantize", "formats", "quantize", "__version__"]
