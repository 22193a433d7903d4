"""`MxTensor`: a torch tensor subclass holding an MX/BFP-quantized tensor (codes, E8M0 scales, format).

The data is an :class:`~mxgemm.weight.MxWeight` (blocks along its last axis, packed) plus a permutation
from that stored layout to the logical one, so ``t``/``transpose``/``permute`` move no data and the
blocks always run along the axis they were made on. Products:

- ``mm``/``bmm``/``addmm``/``matmul``/``F.linear`` with an MxTensor operand compute the emulation: each
  MxTensor dequantized exactly to float32, the product in float32, one rounding to the result dtype
  (MxTensor × MxTensor included);
- ``F.linear(x, w)`` / ``x @ w.t()`` with a plain float16/bfloat16 ``x`` and a 2-D MxTensor ``w``
  quantized along K run the generated kernels through :func:`mxgemm.linear` (the custom op
  ``mxgemm::linear`` when traced): the same values up to the order of the float32 sums;
- ``X @ W.t()`` (``mm``, and ``addmm`` with a bias of the result's dtype) of two 2-D mxfp8_e4m3
  MxTensors with block-32 scales along K, on a Hopper GPU, runs on its fp8 tensor cores
  (:func:`mxgemm.codegen.wgmma_mx.matmul`; the custom op ``mxgemm::fp8_matmul`` when traced): float32
  sums of the tensor cores' 32-wide block sums, which keep fewer bits than float32 (within 2**-14 of
  ``|X| |W|`` of the emulation; ``$MXGEMM_BACKEND=emulated`` keeps the emulation).

Every other op sees the dequantized tensor (in the MxTensor's dtype) and returns plain tensors. The
class is a traceable wrapper subclass: it works under ``torch.compile(fullgraph=True)`` and as an
``nn.Parameter(..., requires_grad=False)``. It is for inference: no gradient flows into it.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map

from mxgemm import formats, reference, scales
from mxgemm.weight import MxWeight

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class MxTensor(torch.Tensor):
    """An MX/BFP-quantized tensor (see the module docstring).

    Attributes:
        q: the :class:`~mxgemm.weight.MxWeight` in the stored layout (blocks along its last axis).
        perm: logical dimension ``i`` is stored dimension ``perm[i]``.
        dtype: the dtype it stands for (what :meth:`dequantize` and the fallback ops give).
    """

    q: MxWeight
    perm: tuple[int, ...]

    @staticmethod
    def __new__(cls, q: MxWeight, perm: tuple[int, ...], dtype: torch.dtype):
        shape = [q.shape[p] for p in perm]
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=q.device, requires_grad=False
        )

    def __init__(self, q: MxWeight, perm: tuple[int, ...], dtype: torch.dtype):
        self.q = q
        self.perm = tuple(perm)

    # ---- construction and conversion ------------------------------------------------------------------

    @classmethod
    def to_mx(
        cls,
        x: torch.Tensor,
        fmt: str,
        *,
        block_size: int | None = None,
        scale_mode: str = "floor",
        rounding: str = "even",
        axis: int = -1,
        generator: torch.Generator | None = None,
    ) -> MxTensor:
        """Quantize ``x`` in blocks along ``axis``.

        Args:
            x: float32/float16/bfloat16 tensor, any device; ``x.shape[axis]`` a multiple of ``block_size``.
            fmt, block_size, scale_mode, rounding, generator: as in :func:`mxgemm.quantize`.
            axis: the dimension the blocks run along: K of the product it will take part in (the last
                of an activation or an ``[N, K]`` weight, the first of a ``[K, N]`` right operand).
        Returns:
            an MxTensor of ``x``'s shape, dtype and device.
        """
        if not isinstance(x, torch.Tensor) or isinstance(x, MxTensor):
            raise TypeError(f"MxTensor.to_mx: x must be a plain torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _FLOATS[:3]:
            raise TypeError(f"MxTensor.to_mx: x must be float32, float16 or bfloat16, got {x.dtype}")
        if x.dim() == 0 or not -x.dim() <= axis < x.dim():
            raise ValueError(f"MxTensor.to_mx: axis={axis} is out of range for x of shape {list(x.shape)}")
        axis %= x.dim()
        stored = [d for d in range(x.dim()) if d != axis] + [axis]  # stored dim j is logical dim stored[j]
        q = reference.quantize(
            x.permute(stored).contiguous(), fmt, block_size=block_size, scale_mode=scale_mode,
            rounding=rounding, generator=generator,
        )  # fmt: skip
        return cls(q, tuple(stored.index(i) for i in range(x.dim())), x.dtype)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The exact values (element × 2**(scale-127), NaN blocks NaN) as a plain tensor of this shape
        in ``dtype`` (default: the MxTensor's dtype)."""
        return _values(self.q).permute(self.perm).to(dtype or self.dtype)

    @property
    def fmt(self) -> str:
        return self.q.fmt

    @property
    def block_size(self) -> int:
        return self.q.block_size

    @property
    def axis(self) -> int:
        """The logical dimension the blocks run along."""
        return self.perm.index(len(self.perm) - 1)

    def __repr__(self) -> str:
        return (
            f"MxTensor(shape={list(self.shape)}, fmt={self.fmt}, block_size={self.block_size}, "
            f"axis={self.axis}, dtype={self.dtype}, device={self.device})"
        )

    # ---- tracing (torch.compile, export) --------------------------------------------------------------

    def __tensor_flatten__(self):
        q = self.q
        return ["blocks", "scales"], (
            q.fmt,
            q.block_size,
            q.shape,
            q.scale_mode,
            q.rounding,
            self.perm,
            self.dtype,
        )

    @property
    def blocks(self) -> torch.Tensor:
        return self.q.blocks

    @property
    def scales(self) -> torch.Tensor:
        return self.q.scales

    @staticmethod
    def __tensor_unflatten__(inner: dict, ctx: tuple, outer_size, outer_stride) -> MxTensor:
        fmt, block_size, shape, scale_mode, rounding, perm, dtype = ctx
        q = MxWeight(inner["blocks"], inner["scales"], fmt, block_size, shape, scale_mode, rounding)
        return MxTensor(q, perm, dtype)

    def _stable_hash_for_caching(self) -> str:
        """AOTAutograd's cache key: the metadata, and the inner tensors' shapes, dtypes and devices."""
        inner = [
            (tuple(t.shape), str(t.dtype), str(t.device), t.stride()) for t in (self.blocks, self.scales)
        ]
        return hashlib.sha256(
            repr((tuple(self.shape), self.__tensor_flatten__()[1], inner)).encode()
        ).hexdigest()

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        # anything else computes on the dequantized values
        plain = tree_map(lambda a: a.dequantize() if isinstance(a, MxTensor) else a, (args, kwargs))
        return func(*plain[0], **plain[1])

    def _with(self, q: MxWeight | None = None, perm=None, dtype=None) -> MxTensor:
        return MxTensor(q or self.q, self.perm if perm is None else perm, dtype or self.dtype)


@functools.cache
def _code_values(fmt: str) -> tuple[float, ...]:
    """The value of every code of ``fmt``, as Python floats: computed with the tracing modes off, so a
    trace (fake tensors, functionalization) never captures or caches a tensor of another mode."""
    with _disable_current_modes():
        f = formats.get(fmt)
        return tuple(f.decode(torch.arange(2**f.bits, dtype=torch.int64)).tolist())


def _values(q: MxWeight) -> torch.Tensor:
    """float32 values of ``q`` in its stored layout, exact (:func:`mxgemm.dequantize`'s, in ops that
    trace: the code table is a constant made here)."""
    table = torch.tensor(_code_values(q.fmt), dtype=torch.float32, device=q.device)
    *lead, k = q.shape
    v = table[q.codes().to(torch.int64)].reshape(*lead, k // q.block_size, q.block_size)
    return (v * scales.scale_factors(q.scales).unsqueeze(-1)).reshape(q.shape)


# ---- the ops an MxTensor keeps (views, copies) and the products ------------------------------------------


def _map_q(t: MxTensor, fn) -> MxTensor:
    q = t.q
    return t._with(
        MxWeight(fn(q.blocks), fn(q.scales), q.fmt, q.block_size, q.shape, q.scale_mode, q.rounding)
    )


def _same(func):
    return lambda t, *a, **k: _map_q(t, lambda x: func(x, *a, **k))


def _to_copy(t: MxTensor, *, dtype=None, device=None, **kwargs) -> MxTensor:
    moved = _map_q(t, lambda x: x.to(device=device)) if device is not None else t
    if dtype is not None and dtype not in _FLOATS:
        return NotImplemented  # e.g. .int(): the dequantized values, converted
    return moved._with(dtype=dtype)


def _transpose(t: MxTensor, d0: int, d1: int) -> MxTensor:
    perm = list(t.perm)
    d0, d1 = d0 % t.dim(), d1 % t.dim()
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return t._with(perm=tuple(perm))


def _permute(t: MxTensor, dims) -> MxTensor:
    return t._with(perm=tuple(t.perm[d % t.dim()] for d in dims))


def _same_shape_view(t: MxTensor, size, *rest, **kw):
    """``view``/``expand``/``_unsafe_view`` to the shape it has (what matmul does to its operands)."""
    return _map_q(t, aten.alias.default) if list(size) == list(t.shape) else NotImplemented


def _dense(a) -> torch.Tensor:
    return a.dequantize(torch.float32) if isinstance(a, MxTensor) else a.float()


def _result_dtype(*ops) -> torch.dtype:
    dt = ops[0].dtype
    for o in ops[1:]:
        dt = torch.promote_types(dt, o.dtype)
    return dt


def _kernel_weight(a, b) -> MxWeight | None:
    """W when ``a @ b`` is ``x @ W.T`` that :func:`mxgemm.linear` computes: ``a`` a plain 2-D float16/
    bfloat16 tensor, ``b`` the transpose of a 2-D MxTensor quantized along K on ``a``'s device."""
    if isinstance(a, MxTensor) or not isinstance(b, MxTensor) or a.dim() != 2 or b.dim() != 2:
        return None
    if b.perm != (1, 0) or a.dtype not in (torch.float16, torch.bfloat16) or a.device != b.device:
        return None
    return b.q


def _fp8_pair(a, b, dt: torch.dtype) -> tuple[MxWeight, MxWeight] | None:
    """(X, W) when ``a @ b`` is ``X @ W.T`` that :func:`mxgemm.codegen.wgmma_mx.matmul` computes in
    ``dt``: both 2-D mxfp8_e4m3 MxTensors with block-32 scales along K on one Hopper GPU, ``b`` the
    transpose of W, ``dt`` one of its output dtypes."""
    if not (isinstance(a, MxTensor) and isinstance(b, MxTensor)) or a.dim() != 2 or b.dim() != 2:
        return None
    if a.perm != (0, 1) or b.perm != (1, 0) or a.device != b.device or a.device.type != "cuda":
        return None
    from mxgemm import ops
    from mxgemm.codegen import wgmma_mx

    if ops.emulated():
        return None
    if str(dt).removeprefix("torch.") not in wgmma_mx.OUT_DTYPES:
        return None

    for q in (a.q, b.q):
        if formats.get(q.fmt).name != wgmma_mx.FORMAT or q.block_size != wgmma_mx.BLOCK:
            return None
    n, k = b.q.shape
    if n % 64 or wgmma_mx.applies(n, k, wgmma_mx.hints_for(n)) or not wgmma_mx.device_ok(a.device):
        return None
    return a.q, b.q


def _mm(a, b):
    q = _kernel_weight(a, b)
    if q is not None:
        from mxgemm import ops

        return ops.linear(a, q)
    dt = _result_dtype(a, b)
    pair = _fp8_pair(a, b, dt)
    if pair is not None:
        from mxgemm.codegen import wgmma_mx

        x, w = pair
        return wgmma_mx.op(x.blocks, x.scales, w.blocks, w.scales, dt)
    return torch.mm(_dense(a), _dense(b)).to(dt)


def _bmm(a, b):
    return torch.bmm(_dense(a), _dense(b)).to(_result_dtype(a, b))


def _addmm(bias, a, b, *, beta=1, alpha=1):
    q = _kernel_weight(a, b)
    if q is not None and beta == 1 and alpha == 1 and not isinstance(bias, MxTensor):
        if bias.dtype == a.dtype and bias.dim() == 1 and bias.shape[0] == b.shape[1]:
            from mxgemm import ops

            return ops.linear(a, q, bias)
    dt = _result_dtype(bias, a, b)
    pair = _fp8_pair(a, b, dt)
    if pair is not None and beta == 1 and alpha == 1 and not isinstance(bias, MxTensor):
        if bias.dtype == dt and bias.dim() == 1 and bias.shape[0] == b.shape[1]:
            from mxgemm.codegen import wgmma_mx

            x, w = pair
            return wgmma_mx.op(x.blocks, x.scales, w.blocks, w.scales, dt, bias)
    out = torch.addmm(_dense(bias), _dense(a), _dense(b), beta=beta, alpha=alpha)
    return out.to(dt)


_HANDLERS: dict[Any, Any] = {
    aten.detach.default: _same(aten.detach.default),
    aten.alias.default: _same(aten.alias.default),
    aten.clone.default: _same(aten.clone.default),
    aten._to_copy.default: _to_copy,
    aten.t.default: lambda t: _transpose(t, 0, 1) if t.dim() == 2 else t,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.view.default: _same_shape_view,
    aten._unsafe_view.default: _same_shape_view,
    aten.expand.default: _same_shape_view,
    aten.mm.default: _mm,
    aten.bmm.default: _bmm,
    aten.addmm.default: _addmm,
}


def to_mx(x: torch.Tensor, fmt: str, **kwargs) -> MxTensor:
    """:meth:`MxTensor.to_mx`."""
    return MxTensor.to_mx(x, fmt, **kwargs)
