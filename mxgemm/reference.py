"""Reference quantization to MX/BFP and back, in torch (CPU or CUDA): the oracle for every kernel.

Semantics (OCP MX v1.0, microxcaling):

1. ``x`` is split into blocks of ``block_size`` consecutive elements along its last axis.
2. Each block gets a shared exponent ``s`` (E8M0 code ``s + 127``) from its max magnitude ``amax``:
   ``floor``: ``floor(log2(amax)) - emax_elem``; ``rceil``: ``ceil(log2(amax / max_normal))``.
   ``s`` is clamped to [-127, 127]; an all-zero block gets -127; a block holding NaN or ±Inf gets the
   NaN code 255 and dequantizes to NaN.
3. Each element ``x / 2**s`` is rounded to the element grid (subnormals kept) with ``rounding``:
   ``even`` (nearest, ties to even), ``away`` (nearest, ties away from zero), ``zero`` (toward 0),
   ``up`` (toward +inf), ``down`` (toward -inf), ``stochastic`` (down or up with probability given by
   the distance, drawn from ``generator``), then saturated to ±max normal.
All arithmetic is exact (float64); inputs are fp32/fp16/bf16 (fp64 accepted).
"""

from __future__ import annotations

import torch

from mxgemm import formats, options, packing, scales
from mxgemm.weight import MxWeight

ROUNDINGS = options.ROUNDINGS
_CPU_CHUNK = 32768
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """float64 ``2**e`` for an integer tensor ``e`` in [-1022, 1023], exactly: ``e`` placed in the
    exponent field. (``torch.ldexp`` and ``torch.pow`` are not exact on CUDA: on an H100,
    ``ldexp(1, -4)`` gave 0.06249999999999999, which moved exact ties and grid points.)"""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def _round(t: torch.Tensor, rounding: str, generator: torch.Generator | None) -> torch.Tensor:
    """Round float64 ``t`` to integers with ``rounding``."""
    if rounding == "even":
        return torch.round(t)
    if rounding == "away":
        return torch.copysign(torch.floor(t.abs() + 0.5), t)
    if rounding == "zero":
        return torch.trunc(t)
    if rounding == "up":
        return torch.ceil(t)
    if rounding == "down":
        return torch.floor(t)
    u = torch.rand(t.shape, generator=generator, device=t.device, dtype=torch.float64)
    return torch.floor(t + u)


def round_to_grid(
    v: torch.Tensor, fmt: formats.Format, rounding: str = "even", generator: torch.Generator | None = None
) -> torch.Tensor:
    """float64 values → the nearest element values of ``fmt`` per ``rounding``, saturated (float64)."""
    if fmt.kind == "int":
        ulp = torch.full_like(v, fmt.min_subnormal)
    else:
        _, e2 = torch.frexp(v)
        e = (e2 - 1).clamp(min=1 - fmt.bias)  # exponent of v's binade, at least the min normal's
        ulp = pow2(e - fmt.mbits)
    q = _round(v / ulp, rounding, generator) * ulp
    q = q.clamp(-fmt.max_normal, fmt.max_normal)
    return torch.copysign(q, v)  # rounding never flips a sign; keeps -0.0 as ml_dtypes does


def _check(x: torch.Tensor, fmt: formats.Format, block_size: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"quantize: x must be float32, float16, bfloat16 or float64, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("quantize: x must have at least one dimension (blocks run along the last)")
    if x.shape[-1] % block_size:
        raise ValueError(
            f"quantize: the last dimension K={x.shape[-1]} of x (shape {list(x.shape)}) is not a "
            f"multiple of block_size={block_size}"
        )


def quantize(
    w: torch.Tensor,
    fmt: str | formats.Format,
    *,
    block_size: int | None = None,
    scale_mode: str = "floor",
    rounding: str = "even",
    generator: torch.Generator | None = None,
) -> MxWeight:
    """Quantize ``w`` along its last axis (module docstring gives the semantics).

    Args:
        w: float32/float16/bfloat16 tensor ``[..., K]``, any device; K a multiple of ``block_size``.
        fmt: format name or :class:`~mxgemm.formats.Format` (``mxgemm.formats.names()``).
        block_size: power of two in 8..256; default 32.
        scale_mode: ``"floor"`` (OCP, default), ``"rceil"``, ``"even"``, ``"ceil"`` or ``"mse"``
            (per block, the neighbour of floor's exponent with the least squared error;
            :func:`mxgemm.scales.shared_exponents` gives each rule).
        rounding: one of ``even`` (default), ``away``, ``zero``, ``up``, ``down``, ``stochastic``.
        generator: random source for ``stochastic`` (on ``w``'s device).

    Returns:
        :class:`MxWeight` with uint8 ``blocks [..., K*bits/8]`` and ``scales [..., K/block_size]``.
    """
    f = formats.get(fmt)
    bs = formats.check_block_size(block_size, f)
    scales.check_scale_mode(scale_mode)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    _check(w, f, bs)

    *lead, k = w.shape
    blocks = w.detach().reshape(-1, bs)
    codes, exps = [], []
    for chunk in _chunks(blocks):
        c, e = _quantize_blocks(chunk, f, scale_mode, rounding, generator)
        codes.append(c)
        exps.append(e)
    codes_t = torch.cat(codes).reshape(*lead, k)
    scale_codes = torch.cat(exps).reshape(*lead, k // bs)
    return MxWeight(
        packing.pack(codes_t, f.bits), scale_codes, f.name, bs, tuple(w.shape), scale_mode, rounding
    )


def _chunk_rows(blocks: torch.Tensor) -> int:
    """Rows per chunk: on CPU small enough (~32K elements) that the temporaries stay in cache."""
    if blocks.device.type != "cpu":
        return max(1, blocks.shape[0])
    return max(1, _CPU_CHUNK // blocks.shape[1])


def _chunks(blocks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``blocks`` split into :func:`_chunk_rows` rows; whole for a symbolic row count (torch.export
    with a dynamic batch: a split would put a guard on it)."""
    if isinstance(blocks.shape[0], torch.SymInt):
        return (blocks,)
    return blocks.split(_chunk_rows(blocks))


def _scaled(x: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """float64 blocks ``[nblocks, bs]`` times ``2**-exp`` (int32 ``[nblocks]``), exactly."""
    return x * pow2(-exp).unsqueeze(-1)


def _least_squares_exponent(x: torch.Tensor, floor: torch.Tensor, f: formats.Format) -> torch.Tensor:
    """Per block, of the exponents ``floor - 1``, ``floor`` and ``floor + 1`` (clamped), the one whose
    round-to-nearest-even reconstruction has the least squared error (floor on ties)."""
    best, best_err = floor, None
    for d in (0, 1, -1):
        e = (floor + d).clamp(scales.MIN_EXP, scales.MAX_EXP)
        q = round_to_grid(_scaled(x, e), f, "even", None)
        err = (q * pow2(e).unsqueeze(-1) - x).square().sum(-1)
        if best_err is None:
            best_err = err
        else:
            better = err < best_err
            best, best_err = torch.where(better, e, best), torch.where(better, err, best_err)
    return best


def _grid_blocks(
    blocks: torch.Tensor, f: formats.Format, scale_mode: str, rounding: str, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[nblocks, bs]`` → (float64 element values on ``f``'s grid ``[nblocks, bs]``, int32 shared
    exponents ``[nblocks]``, bool ``[nblocks]`` whether the block is finite)."""
    x = blocks.to(torch.float64)
    amax = x.abs().amax(-1)
    finite = torch.isfinite(amax)
    x = torch.where(finite.unsqueeze(-1), x, 0.0)
    exp = scales.shared_exponents(torch.where(finite, amax, 0.0), f, scale_mode)
    if scale_mode == "mse":
        exp = _least_squares_exponent(x, exp, f)
    return round_to_grid(_scaled(x, exp), f, rounding, generator), exp, finite


def _quantize_blocks(
    blocks: torch.Tensor, f: formats.Format, scale_mode: str, rounding: str, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[nblocks, bs]`` → (uint8 codes ``[nblocks, bs]``, uint8 E8M0 codes ``[nblocks]``)."""
    q, exp, finite = _grid_blocks(blocks, f, scale_mode, rounding, generator)
    scale_codes = torch.where(finite, exp + scales.E8M0_BIAS, scales.E8M0_NAN).to(torch.uint8)
    return f.encode(q), scale_codes


def fake_quantize_values(
    x: torch.Tensor,
    fmt: str | formats.Format,
    *,
    block_size: int | None = None,
    scale_mode: str = "floor",
    rounding: str = "even",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dequantize(quantize(x, ...), x.dtype)`` without the codes, and where each element saturated.

    Args:
        x: float32/float16/bfloat16/float64 ``[..., K]``, K a multiple of ``block_size``; blocks run
            along the last axis. Other arguments as in :func:`quantize`.

    Returns:
        (values ``x.dtype`` ``[..., K]``, bool ``[..., K]`` True where ``|x| > max_normal * 2**s``,
        the block's representable range, so the value was clamped; NaN-scale blocks count as inside).
    """
    f = formats.get(fmt)
    bs = formats.check_block_size(block_size, f)
    scales.check_scale_mode(scale_mode)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    _check(x, f, bs)
    blocks = x.detach().reshape(-1, bs)
    values, clamped = [], []
    for chunk in _chunks(blocks):
        q, exp, finite = _grid_blocks(chunk, f, scale_mode, rounding, generator)
        v = q * pow2(exp).unsqueeze(-1)
        values.append(torch.where(finite.unsqueeze(-1), v, torch.nan).to(x.dtype))
        limit = f.max_normal * pow2(exp).unsqueeze(-1)
        clamped.append(chunk.to(torch.float64).abs() > limit)
    return torch.cat(values).reshape(x.shape), torch.cat(clamped).reshape(x.shape)


def dequantize(q: MxWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``MxWeight`` → tensor of ``q.shape`` in ``dtype`` on ``q.device``.

    Element value × 2**(scale-127) is computed exactly (in float32, or float64 when ``dtype`` is
    float64, where MX values beyond float32's range stay finite), NaN-scale blocks give NaN, then cast.
    """
    f = q.format
    work = torch.float64 if dtype == torch.float64 else torch.float32
    codes = q.codes().reshape(-1, q.block_size)
    factors = scales.scale_factors(q.scales).reshape(-1, 1).to(work)
    rows = _chunk_rows(codes)
    out = [
        (f.decode(c).to(work) * s).to(dtype)
        for c, s in zip(codes.split(rows), factors.split(rows), strict=True)
    ]
    return torch.cat(out).reshape(q.shape)
