"""mxgemm.quantize / dequantize / MxWeight, bit-exact against the independent oracle (tests/oracle.py)."""

from __future__ import annotations

import math
import pickle
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mxgemm
from mxgemm import formats
from mxgemm.weight import MxWeight
from tests import oracle

FORMATS = list(oracle.SPECS)
SCALE_MODES = list(oracle.SCALE_MODES)
ROUNDINGS = list(oracle.ROUNDINGS)  # the deterministic modes; stochastic is tested on its own
BLOCK_SIZES = (8, 32, 256)

PROPERTY = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


def _rng(*key: object) -> np.random.Generator:
    """A generator seeded from ``key`` (stable across runs and processes)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _check_against_oracle(
    x: torch.Tensor, fmt: str, block_size: int, scale_mode: str, rounding: str
) -> mxgemm.MxWeight:
    """Quantize ``x`` with mxgemm and the oracle; values, scales and codes must agree exactly."""
    q = mxgemm.quantize(x, fmt, block_size=block_size, scale_mode=scale_mode, rounding=rounding)
    x_np = x.double().numpy() if x.dtype == torch.float64 else x.float().numpy()
    method = "table" if x.dtype == torch.float64 else "auto"
    want = oracle.quantize(x_np, fmt, block_size, scale_mode=scale_mode, rounding=rounding, method=method)
    what = f"{fmt} block={block_size} {scale_mode} {rounding} {x.dtype} {list(x.shape)}"
    oracle.assert_same_floats(mxgemm.dequantize(q).numpy(), want.values, what)
    np.testing.assert_array_equal(q.scales.numpy(), want.scales, err_msg=what)
    finite = ~want.nan_blocks()  # element codes of NaN blocks are not specified
    np.testing.assert_array_equal(q.codes().numpy()[finite], want.codes[finite], err_msg=what)
    return q


# ---- inputs --------------------------------------------------------------------------------------


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape) * 3.0


def _wide(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Magnitudes log-uniform over 2**-140 .. 2**120 (float32 subnormals included), random signs."""
    sign = rng.choice([-1.0, 1.0], shape)
    return sign * np.exp2(rng.uniform(-140, 120, shape))


def _blockwise(rng: np.random.Generator, shape: tuple[int, ...], block_size: int) -> np.ndarray:
    """Normal values times one power of two per block, 2**-150 .. 2**126 (both scale clamps)."""
    *lead, k = shape
    per_block = np.exp2(rng.integers(-150, 127, (*lead, k // block_size)).astype(np.float64))
    return rng.standard_normal(shape) * np.repeat(per_block, block_size, axis=-1)


def _inputs(rng: np.random.Generator, block_size: int) -> list[torch.Tensor]:
    shape = (4, 256)
    return [
        torch.from_numpy(_normal(rng, shape).astype(np.float32)),
        torch.from_numpy(_wide(rng, shape).astype(np.float32)),
        torch.from_numpy(_blockwise(rng, shape, block_size).astype(np.float32)),
        torch.from_numpy(_normal(rng, shape) * 1000.0).to(torch.float16),
        torch.from_numpy(np.exp2(rng.uniform(-24, 15, shape)) * rng.choice([-1, 1], shape)).to(torch.float16),
        torch.from_numpy(_wide(rng, shape)).to(torch.bfloat16),
    ]


def _edge_blocks(fmt: str, block_size: int, rng: np.random.Generator) -> np.ndarray:
    """Edge cases as float32 ``[n_blocks, block_size]``, one block per row."""
    spec = oracle.SPECS[fmt]
    bs = block_size
    top = 2.0 ** (spec.emax + 1)  # floor mode: the block maximum lies in [2**emax, top) * 2**s
    grid = spec.grid
    mids = (grid[1:] + grid[:-1]) / 2  # exact ties between neighbouring grid points
    min_sub = grid[1]
    blocks: list[np.ndarray] = []

    def add(values, fill: float = 0.0) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        for start in range(0, values.size, bs):
            chunk = values[start : start + bs]
            blocks.append(np.concatenate([chunk, np.full(bs - chunk.size, fill)]))

    def add_anchored(payload, anchor: float) -> None:
        """Blocks of ``payload`` each holding ``anchor`` (which fixes the shared exponent)."""
        payload = np.asarray(payload, dtype=np.float64).ravel()
        for start in range(0, payload.size, bs - 1):
            chunk = np.concatenate([[anchor], payload[start : start + bs - 1]])
            add(rng.permutation(chunk))

    add(np.zeros(bs))
    add(np.full(bs, -0.0))
    add(np.where(np.arange(bs) % 2 == 0, 0.0, -0.0))
    add(np.concatenate([[3e38], np.full(bs - 1, 1e-38)]))
    add(np.concatenate([[-1e30], -np.full(bs - 1, 1e-30)]))
    add(np.concatenate([[1.0], np.full(bs - 1, 1e-45)]))
    add(np.full(bs, 1e-45))  # shared exponent below -127: clamped
    add(np.full(bs, -1e-40))
    add(rng.standard_normal(bs) * 2.0**-130)
    add(np.full(bs, 3e38))  # shared exponent above 127 for some formats/modes: clamped
    add(np.full(bs, -3.4028234663852886e38))
    add(rng.standard_normal(bs) * 2.0**126)
    for special in (math.nan, math.inf, -math.inf):
        block = rng.standard_normal(bs)
        block[rng.integers(bs)] = special
        add(block)
    add(np.full(bs, math.nan))
    for k in (0, -9, 17, -125, 100):
        scale = 2.0**k
        anchor = spec.max_normal * scale  # floor and rceil both give shared exponent k
        signs = rng.choice([-1.0, 1.0], mids.size)
        add_anchored(mids * signs * scale, anchor)
        add_anchored(grid * rng.choice([-1.0, 1.0], grid.size) * scale, -anchor)
        below = np.array([0.1, 0.25, 0.3, 0.5, 0.7, 0.75, 0.9, 1.25, 1.5, 1.75, 2.5]) * min_sub
        add_anchored(np.concatenate([below, -below]) * scale, anchor)
        f32 = np.float32(anchor)
        add_anchored([np.nextafter(f32, np.float32(np.inf)), np.nextafter(f32, np.float32(0))], anchor)
        add_anchored(np.nextafter(np.float32(mids * scale), np.float32(np.inf)), anchor)
        add_anchored(np.nextafter(np.float32(mids * scale), np.float32(0)), anchor)
        add(rng.uniform(-1, 1, bs) * anchor)
        # Between max normal and the next binade: floor saturates, rceil takes the next exponent.
        add_anchored([(spec.max_normal + top) / 2 * scale], anchor)
        add([np.nextafter(np.float32(top * scale), np.float32(0))], fill=anchor / 3)
        add([top * scale, anchor], fill=-anchor / 7)
    x = np.stack(blocks)
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


# ---- against the oracle --------------------------------------------------------------------------


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_random_inputs_match_oracle(fmt, scale_mode, rounding):
    for block_size in BLOCK_SIZES:
        for x in _inputs(_rng(fmt, scale_mode, rounding, block_size), block_size):
            _check_against_oracle(x, fmt, block_size, scale_mode, rounding)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_edge_inputs_match_oracle(fmt, scale_mode, rounding):
    for block_size in BLOCK_SIZES:
        x = _edge_blocks(fmt, block_size, _rng("edge", fmt, block_size))
        _check_against_oracle(torch.from_numpy(x), fmt, block_size, scale_mode, rounding)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(64,), (3, 64), (2, 3, 64), (1, 1, 256)])
def test_ranks_match_oracle(fmt, shape):
    x = torch.from_numpy(_wide(_rng(fmt, shape), shape).astype(np.float32))
    q = _check_against_oracle(x, fmt, 32, "floor", "even")
    assert q.shape == shape
    assert q.scales.shape == (*shape[:-1], shape[-1] // 32)
    assert mxgemm.dequantize(q).shape == shape
    _check_against_oracle(x, fmt, 8, "rceil", "away")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_float64_input_rounds_once(fmt, rounding):
    """fp64 inputs keep all 53 bits: each value is rounded once, straight to the element grid."""
    rng = _rng("f64", fmt, rounding)
    spec = oracle.SPECS[fmt]
    mids = (spec.grid[1:] + spec.grid[:-1]) / 2
    nudge = rng.choice([-1.0, 1.0], mids.size) * mids * 2.0**-40  # off each tie by less than a float32 ulp
    x = np.concatenate([mids + nudge, _normal(rng, (256 - mids.size % 256,))])
    x = np.concatenate([x, np.zeros(-x.size % 32)])
    x[::32] = spec.max_normal
    _check_against_oracle(torch.from_numpy(x.reshape(-1, 32)), fmt, 32, "floor", rounding)


def test_float64_tie_breaker_below_float32_resolution():
    # 1.0625 is a tie between 1.0 and 1.125 in e4m3; 2**-40 above it must round up (float32 would not).
    above = 1.0625 + 2.0**-40
    x = torch.tensor([[448.0, above, -above, 1.0625] + [0.0] * 4], dtype=torch.float64)
    got = mxgemm.dequantize(mxgemm.quantize(x, "mxfp8_e4m3", block_size=8))
    assert got[0, :4].tolist() == [448.0, 1.125, -1.125, 1.0]


@settings(PROPERTY)
@given(
    fmt=st.sampled_from(FORMATS),
    scale_mode=st.sampled_from(SCALE_MODES),
    rounding=st.sampled_from(ROUNDINGS),
    block_size=st.sampled_from([8, 32]),
    data=st.data(),
)
def test_property_matches_oracle(fmt, scale_mode, rounding, block_size, data):
    rows = data.draw(st.integers(1, 3))
    k = block_size * data.draw(st.integers(1, 3))
    x = data.draw(hnp.arrays(np.float32, (rows, k), elements=st.floats(width=32)))
    _check_against_oracle(torch.from_numpy(x), fmt, block_size, scale_mode, rounding)


def test_oracle_even_paths_agree():
    """The oracle's two ways of rounding to nearest-even (ml_dtypes / np.round vs table) agree."""
    rng = _rng("oracle-self")
    for fmt, spec in oracle.SPECS.items():
        mids = (spec.grid[1:] + spec.grid[:-1]) / 2
        v = np.concatenate([mids, -mids, spec.grid, _normal(rng, (1000,)), [1e3, -1e3, 0.0, -0.0]])
        v = v.astype(np.float32).astype(np.float64)
        auto_values, auto_codes = oracle.round_elements(v, spec, "even")
        table_values, table_codes = oracle.round_elements(v, spec, "even", method="table")
        np.testing.assert_array_equal(auto_codes, table_codes, err_msg=fmt)
        np.testing.assert_array_equal(auto_values.view(np.uint64), table_values.view(np.uint64), err_msg=fmt)


# ---- properties that need no oracle --------------------------------------------------------------


@settings(PROPERTY)
@given(
    fmt=st.sampled_from(FORMATS),
    scale_mode=st.sampled_from(SCALE_MODES),
    rounding=st.sampled_from([*ROUNDINGS, "stochastic"]),
    block_size=st.sampled_from([8, 32]),
    data=st.data(),
)
def test_quantize_dequantize_is_idempotent(fmt, scale_mode, rounding, block_size, data):
    """Re-quantizing a dequantized tensor changes nothing.

    ``floor``: the same blocks and scales (the block maximum stays in the top binade). ``rceil``: the
    same values, but the scale may drop: the maximum can round down to max_normal / 2 or less (mxfp4:
    3.1 → 3.0 with scale 2**0; 3.0 then takes 2**-1), so only values are compared, and scales never grow.
    Inputs of the modes other than floor are kept within ±2**127: above, the nearest MX value can
    exceed float32's range (see test_rceil_can_round_above_float32_max), dequantizes to inf and
    re-quantizes to NaN. ``even`` with a rounding that is not to nearest is left out: ``even`` picks
    the exponent from the block maximum rounded to nearest at the element's width, so a maximum that
    the elements' rounding then takes down a binade gets a smaller scale on the next pass, which
    saturates (mxfp8_e4m3, rounding ``zero``: 31 → 30 with scale 2**-3, then 30 → 28 with 2**-4; the
    second step is torchao's EVEN for 30 as well).
    """
    assume(scale_mode != "even" or rounding in ("even", "away"))
    x = data.draw(hnp.arrays(np.float32, (2, block_size * 2), elements=st.floats(width=32)))
    if scale_mode != "floor":  # rceil, even, ceil, mse: a scale above floor can round past float32
        x = np.where(np.isfinite(x), np.clip(x, -(2.0**127), 2.0**127), x).astype(np.float32)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32)))
    q = mxgemm.quantize(
        torch.from_numpy(x),
        fmt,
        block_size=block_size,
        scale_mode=scale_mode,
        rounding=rounding,
        generator=gen,
    )
    d = mxgemm.dequantize(q)
    q2 = mxgemm.quantize(
        d, fmt, block_size=block_size, scale_mode=scale_mode, rounding=rounding, generator=gen
    )
    oracle.assert_same_floats(mxgemm.dequantize(q2).numpy(), d.numpy(), "values")
    if scale_mode == "floor":
        assert torch.equal(q2.scales, q.scales)
        assert torch.equal(q2.blocks, q.blocks)
    else:
        finite = q.scales != 255
        assert torch.equal(q2.scales == 255, ~finite)
        assert torch.all(q2.scales[finite] <= q.scales[finite])


def test_rceil_scale_can_drop_on_requantization():
    """The documented exception to code idempotence (see the test above)."""
    x = torch.tensor([[3.1] + [0.0] * 31])
    q = mxgemm.quantize(x, "mxfp4", scale_mode="rceil")
    q2 = mxgemm.quantize(mxgemm.dequantize(q), "mxfp4", scale_mode="rceil")
    assert (q.scales.item(), q2.scales.item()) == (127, 126)
    assert torch.equal(mxgemm.dequantize(q2), mxgemm.dequantize(q))


@pytest.mark.parametrize("fmt, element_code", [("mxfp8_e4m3", 0x78), ("mxfp8_e5m2", 0x78), ("mxfp4", 0x6)])
def test_rceil_can_round_above_float32_max(fmt, element_code):
    """Near float32's max, rceil's nearest MX value can be 2**128 (e4m3: scale 2**120 × 256): in
    float32 that is inf, as the oracle says too. floor never goes there (it saturates below 2**128)."""
    x = torch.full((1, 8), 3.4e38)
    q = mxgemm.quantize(x, fmt, block_size=8, scale_mode="rceil")
    element = formats.get(fmt).decode(torch.tensor([element_code], dtype=torch.uint8)).item()
    assert element * 2.0 ** (q.scales.item() - 127) == 2.0**128
    assert torch.all(q.codes() == element_code)
    assert torch.all(torch.isposinf(mxgemm.dequantize(q)))
    assert torch.all(torch.isfinite(mxgemm.dequantize(mxgemm.quantize(x, fmt, block_size=8))))


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_float64_is_exact_at_every_scale(fmt):
    """Every MX value fits float64 (the largest, 57344 × 2**127, is about 1e43): dequantizing to float64
    must not go through float32's range."""
    spec = oracle.SPECS[fmt]
    f = formats.get(fmt)
    scale_codes = np.array([0, 1, 100, 127, 200, 253, 254], dtype=np.uint8)
    codes = np.arange(2**f.bits, dtype=np.uint8)
    values = oracle.decode(codes, spec)
    keep = np.isfinite(values)
    if f.kind == "int":
        keep &= codes != 2 ** (f.bits - 1)  # -2**(M-1): never produced
    codes = codes[keep][: codes[keep].size // 8 * 8]
    q = MxWeight(
        mxgemm.packing.pack(torch.from_numpy(np.tile(codes, (scale_codes.size, 1))), f.bits),
        torch.from_numpy(np.repeat(scale_codes[:, None], codes.size // 8, axis=1)),
        fmt,
        8,
        (scale_codes.size, codes.size),
    )
    want = oracle.decode(codes, spec)[None, :] * oracle.scale_factors(scale_codes)[:, None]
    got = mxgemm.dequantize(q, torch.float64).numpy()
    bad = got != want
    assert not bad.any(), f"{int(bad.sum())} differ, e.g. got {got[bad][:3]} want {want[bad][:3]}"


def _element_ulp(v: np.ndarray, f: formats.Format) -> np.ndarray:
    """Spacing of ``f``'s grid in the binade of |v| (float64; subnormal spacing below min normal)."""
    if f.kind == "int":
        return np.full_like(v, f.min_subnormal)
    _, e = np.frexp(np.abs(v))
    binade = np.maximum(e - 1, round(math.log2(f.min_normal)))
    return np.ldexp(1.0, binade - f.mbits)


@settings(PROPERTY)
@given(
    fmt=st.sampled_from(FORMATS),
    scale_mode=st.sampled_from(SCALE_MODES),
    rounding=st.sampled_from(ROUNDINGS),
    data=st.data(),
)
def test_rounding_error_bounds(fmt, scale_mode, rounding, data):
    """Unsaturated elements: nearest modes within half an ulp, directed modes within one ulp and on the
    right side; saturated elements are exactly ±max_normal × scale."""
    f = formats.get(fmt)
    x = data.draw(
        hnp.arrays(np.float32, (2, 64), elements=st.floats(width=32, allow_nan=False, allow_infinity=False))
    )
    if scale_mode != "floor":  # see test_rceil_can_round_above_float32_max
        x = np.clip(x, -(2.0**127), 2.0**127).astype(np.float32)
    q = mxgemm.quantize(torch.from_numpy(x), fmt, block_size=32, scale_mode=scale_mode, rounding=rounding)
    s = np.repeat(q.scales.numpy().astype(np.int64) - 127, 32, axis=-1)
    v = np.ldexp(x.astype(np.float64), -s)  # element domain, exact
    r = np.ldexp(mxgemm.dequantize(q).numpy().astype(np.float64), -s)
    sat = np.abs(v) > f.max_normal
    np.testing.assert_array_equal(r[sat], np.copysign(f.max_normal, v[sat]))
    v, r = v[~sat], r[~sat]
    err, ulp = np.abs(r - v), _element_ulp(v, f)
    if rounding in ("even", "away"):
        assert np.all(err <= ulp / 2)
    else:
        assert np.all(err <= ulp)  # float64 err: 1 ulp minus a tiny value can round to 1 ulp
        if rounding == "up":
            assert np.all(r >= v)
        elif rounding == "down":
            assert np.all(r <= v)
        else:
            assert np.all(np.abs(r) <= np.abs(v))
    assert np.all((r == 0) | (np.sign(r) == np.sign(v)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_modes_choose_documented_exponents(fmt):
    """floor: floor(log2 amax) - emax; rceil: the smallest s with amax <= max_normal * 2**s."""
    f = formats.get(fmt)
    amax = np.float32((f.max_normal + 2.0 ** (f.emax + 1)) / 2)  # between max normal and the next binade
    x = torch.tensor([[float(amax)] + [0.5] * 7])
    floor = mxgemm.quantize(x, fmt, block_size=8, scale_mode="floor").scales.item() - 127
    rceil = mxgemm.quantize(x, fmt, block_size=8, scale_mode="rceil").scales.item() - 127
    assert floor == math.floor(math.log2(amax)) - f.emax == 0
    assert rceil == 1
    at_max = torch.tensor([[f.max_normal] + [0.0] * 7])
    assert mxgemm.quantize(at_max, fmt, block_size=8, scale_mode="rceil").scales.item() == 127


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_nan_and_inf_blocks(fmt):
    x = torch.zeros(4, 8)
    x[1, 3] = math.nan
    x[2, 0] = math.inf
    x[3, 7] = -math.inf
    q = mxgemm.quantize(x, fmt, block_size=8)
    assert q.scales[:, 0].tolist() == [0, 255, 255, 255]
    d = mxgemm.dequantize(q)
    assert torch.all(d[0] == 0)
    assert torch.all(torch.isnan(d[1:]))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4"])
def test_negative_zero_kept_for_float_formats(fmt):
    x = torch.tensor([[-0.0, 0.0, -1e-30, 1.0, -0.0, 0.0, 0.0, 0.0]])
    d = mxgemm.dequantize(mxgemm.quantize(x, fmt, block_size=8))
    assert torch.signbit(d[0, :3]).tolist() == [True, False, True]
    d0 = mxgemm.dequantize(mxgemm.quantize(torch.full((1, 8), -0.0), fmt, block_size=8))
    assert torch.all(torch.signbit(d0))


def test_mxint8_equals_bfp8_block_32():
    x = torch.from_numpy(_wide(_rng("int8"), (5, 128)).astype(np.float32))
    for scale_mode in SCALE_MODES:
        a = mxgemm.quantize(x, "mxint8", scale_mode=scale_mode)
        b = mxgemm.quantize(x, "bfp8", block_size=32, scale_mode=scale_mode)
        assert torch.equal(a.blocks, b.blocks) and torch.equal(a.scales, b.scales)


def test_format_object_accepted():
    x = torch.randn(2, 64)
    a = mxgemm.quantize(x, formats.get("mxfp6_e2m3"))
    b = mxgemm.quantize(x, "mxfp6_e2m3")
    assert a.fmt == "mxfp6_e2m3"
    assert torch.equal(a.blocks, b.blocks) and torch.equal(a.scales, b.scales)


def test_noncontiguous_and_grad_inputs():
    x = torch.randn(64, 6)
    a = mxgemm.quantize(x.t(), "mxfp4")
    b = mxgemm.quantize(x.t().contiguous(), "mxfp4")
    assert torch.equal(a.blocks, b.blocks) and torch.equal(a.scales, b.scales)
    g = mxgemm.quantize(x.t().contiguous().requires_grad_(), "mxfp4")
    assert torch.equal(g.blocks, b.blocks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_dequantize_dtype(dtype):
    q = mxgemm.quantize(torch.randn(3, 64), "mxfp8_e4m3")
    d = mxgemm.dequantize(q, dtype)
    assert d.dtype == dtype
    assert torch.equal(d, mxgemm.dequantize(q).to(dtype))


def test_defaults_are_recorded():
    q = mxgemm.quantize(torch.randn(2, 64), "mxfp4")
    assert (q.fmt, q.block_size, q.scale_mode, q.rounding, q.shape) == ("mxfp4", 32, "floor", "even", (2, 64))
    q = mxgemm.quantize(torch.randn(2, 64), "bfp4", block_size=16, scale_mode="rceil", rounding="zero")
    assert (q.fmt, q.block_size, q.scale_mode, q.rounding) == ("bfp4", 16, "rceil", "zero")


def test_empty_leading_dimension():
    q = mxgemm.quantize(torch.zeros(0, 64), "mxfp4")
    assert q.blocks.shape == (0, 32) and q.scales.shape == (0, 2)
    assert mxgemm.dequantize(q).shape == (0, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    for fmt in FORMATS:
        x = torch.from_numpy(_wide(_rng("cuda", fmt), (4, 256)).astype(np.float32))
        for scale_mode in SCALE_MODES:
            for rounding in ROUNDINGS:
                cpu = mxgemm.quantize(x, fmt, scale_mode=scale_mode, rounding=rounding)
                gpu = mxgemm.quantize(x.cuda(), fmt, scale_mode=scale_mode, rounding=rounding)
                assert gpu.device.type == "cuda"
                _assert_same_weight(cpu, gpu.to("cpu"))
                dequantized = mxgemm.dequantize(gpu).cpu().numpy()
                oracle.assert_same_floats(dequantized, mxgemm.dequantize(cpu).numpy(), fmt)


# ---- stochastic rounding -------------------------------------------------------------------------


STOCHASTIC_FORMATS = ["mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "bfp3"]


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", STOCHASTIC_FORMATS)
def test_stochastic_rounding_is_unbiased(fmt, scale_mode):
    """Each element goes to one of its two grid neighbours; over n draws the mean is the (saturated)
    input within 6 standard deviations of the binomial."""
    spec = oracle.SPECS[fmt]
    n, k = 4000, 64
    row = _normal(_rng("sr", fmt), (k,)).astype(np.float32)
    row[0] = 1e-3  # far below the others: subnormal range
    x = torch.from_numpy(np.tile(row, (n, 1)))
    gen = torch.Generator().manual_seed(1234)
    q = mxgemm.quantize(x, fmt, scale_mode=scale_mode, rounding="stochastic", generator=gen)
    s = oracle.block_exponents(row, spec, 32, scale_mode)
    np.testing.assert_array_equal(q.scales.numpy(), np.tile(s + 127, (n, 1)))
    s = np.repeat(s, 32)
    v = np.ldexp(row.astype(np.float64), -s.astype(np.int64))
    _, _, lo, hi = oracle.neighbours(v, spec)
    sign = np.where(np.signbit(v), -1.0, 1.0)
    r = np.ldexp(mxgemm.dequantize(q).numpy().astype(np.float64), -s.astype(np.int64))
    assert np.all((r == sign * lo) | (r == sign * hi))
    a = np.minimum(np.abs(v), spec.max_normal)
    width = hi - lo
    p = np.divide(a - lo, width, out=np.zeros_like(a), where=width > 0)
    sigma = width * np.sqrt(p * (1 - p) / n)
    bias = np.abs(r.mean(axis=0) - sign * a)
    assert np.all(bias <= 6 * sigma), (bias / np.maximum(sigma, 1e-300)).max()
    both = (r == sign * lo).any(axis=0) & (r == sign * hi).any(axis=0)
    assert both[(p > 0.01) & (p < 0.99)].all()


def test_stochastic_is_reproducible_with_a_seeded_generator():
    x = torch.randn(16, 256)
    run = [
        mxgemm.quantize(x, "mxfp4", rounding="stochastic", generator=torch.Generator().manual_seed(seed))
        for seed in (7, 7, 8)
    ]
    assert torch.equal(run[0].blocks, run[1].blocks)
    assert torch.equal(run[0].scales, run[2].scales)
    assert not torch.equal(run[0].blocks, run[2].blocks)


def test_stochastic_without_generator_uses_global_rng():
    x = torch.randn(4, 64)
    torch.manual_seed(3)
    a = mxgemm.quantize(x, "mxfp4", rounding="stochastic")
    torch.manual_seed(3)
    b = mxgemm.quantize(x, "mxfp4", rounding="stochastic")
    assert torch.equal(a.blocks, b.blocks)
    down = mxgemm.dequantize(mxgemm.quantize(x, "mxfp4", rounding="down"))
    up = mxgemm.dequantize(mxgemm.quantize(x, "mxfp4", rounding="up"))
    d = mxgemm.dequantize(a)
    assert torch.all((d == down) | (d == up))


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("k, block_size", [(48, 32), (40, None), (12, 8), (128, 256)])
def test_k_not_a_multiple_of_block_size(k, block_size):
    with pytest.raises(ValueError, match="block_size") as info:
        mxgemm.quantize(torch.randn(2, k), "mxfp4", block_size=block_size)
    assert str(k) in str(info.value)


@pytest.mark.parametrize("block_size", [4, 48, 512, 0, -8, True, 32.0, "32"])
def test_bad_block_size(block_size):
    with pytest.raises(ValueError, match="block_size"):
        mxgemm.quantize(torch.randn(2, 1024), "mxfp4", block_size=block_size)


@pytest.mark.parametrize(
    "dtype",
    [torch.int32, torch.int8, torch.uint8, torch.int64, torch.bool, torch.complex64, torch.complex128],
)
def test_non_float_input_is_a_type_error(dtype):
    with pytest.raises(TypeError, match=str(dtype)):
        mxgemm.quantize(torch.zeros(2, 64, dtype=dtype), "mxfp4")


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match="ndarray"):
        mxgemm.quantize(np.zeros((2, 64), dtype=np.float32), "mxfp4")


def test_scalar_input():
    with pytest.raises(ValueError, match="dimension"):
        mxgemm.quantize(torch.tensor(1.0), "mxfp4")


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"fmt": "mxfp5"}, "format"),
        ({"scale_mode": "round"}, "scale_mode"),
        ({"scale_mode": "FLOOR"}, "scale_mode"),
        ({"rounding": "nearest"}, "rounding"),
        ({"rounding": "Even"}, "rounding"),
    ],
)
def test_unknown_option_names_argument_and_value(kwargs, argument):
    args = {"fmt": "mxfp4", **kwargs}
    value = kwargs[next(iter(kwargs))]
    with pytest.raises(ValueError) as info:
        mxgemm.quantize(torch.randn(2, 64), args.pop("fmt"), **args)
    assert argument in str(info.value) and repr(value) in str(info.value)


# ---- MxWeight ------------------------------------------------------------------------------------


def _weight(fmt: str = "mxfp6_e3m2", shape: tuple[int, ...] = (3, 4, 64), **kwargs) -> MxWeight:
    x = torch.from_numpy(_normal(_rng("w", fmt, shape), shape).astype(np.float32))
    return mxgemm.quantize(x, fmt, **kwargs)


def _assert_same_weight(a: MxWeight, b: MxWeight) -> None:
    assert torch.equal(a.blocks, b.blocks) and torch.equal(a.scales, b.scales)
    assert a.blocks.dtype == b.blocks.dtype == torch.uint8
    assert (a.fmt, a.block_size, a.shape, a.scale_mode, a.rounding) == (
        b.fmt,
        b.block_size,
        b.shape,
        b.scale_mode,
        b.rounding,
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_mxweight_pickles(fmt):
    q = _weight(fmt, block_size=8, scale_mode="rceil", rounding="away")
    q2 = pickle.loads(pickle.dumps(q))
    _assert_same_weight(q, q2)
    assert torch.equal(mxgemm.dequantize(q2), mxgemm.dequantize(q))


def test_mxweight_to_cpu():
    q = _weight()
    moved = q.to("cpu")
    assert isinstance(moved, MxWeight)
    assert moved.device == torch.device("cpu")
    _assert_same_weight(q, moved)
    moved = q.to(torch.device("cpu"))
    _assert_same_weight(q, moved)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e5m2", "bfp5", "mxint8"])
def test_mxweight_state_dict_roundtrips_through_safetensors(fmt, tmp_path):
    from safetensors.torch import load_file, save_file

    q = _weight(fmt, shape=(6, 128))
    sd = q.state_dict("model.layers.0.mlp.weight_")
    assert sorted(sd) == ["model.layers.0.mlp.weight_blocks", "model.layers.0.mlp.weight_scales"]
    assert sorted(q.state_dict()) == ["blocks", "scales"]
    path = tmp_path / "w.safetensors"
    save_file(sd, str(path))
    loaded = load_file(str(path))
    assert all(t.dtype == torch.uint8 for t in loaded.values())
    q2 = MxWeight(
        loaded["model.layers.0.mlp.weight_blocks"],
        loaded["model.layers.0.mlp.weight_scales"],
        q.fmt,
        q.block_size,
        q.shape,
        q.scale_mode,
        q.rounding,
    )
    _assert_same_weight(q, q2)
    assert torch.equal(mxgemm.dequantize(q2), mxgemm.dequantize(q))


@pytest.mark.parametrize(
    "fmt, block_size, bits_per_weight",
    [
        ("mxfp4", 32, 4.25),
        ("mxfp6_e3m2", 32, 6.25),
        ("mxfp8_e4m3", 32, 8.25),
        ("mxint8", 32, 8.25),
        ("bfp4", 8, 5.0),
        ("bfp3", 256, 3 + 8 / 256),
        ("bfp2", 16, 2.5),
    ],
)
def test_mxweight_sizes(fmt, block_size, bits_per_weight):
    q = _weight(fmt, shape=(4, 256), block_size=block_size)
    f = formats.get(fmt)
    assert q.blocks.shape == (4, 256 * f.bits // 8)
    assert q.scales.shape == (4, 256 // block_size)
    assert q.nbytes == 4 * 256 * f.bits // 8 + 4 * 256 // block_size
    assert q.bits_per_weight == bits_per_weight
    assert q.codes().shape == (4, 256)
    assert torch.equal(q.codes(), mxgemm.packing.unpack(q.blocks, f.bits))


def test_mxweight_rejects_wrong_blocks_and_scales():
    q = _weight("mxfp4", shape=(4, 64))
    good = (q.blocks, q.scales, "mxfp4", 32, (4, 64))
    MxWeight(*good)
    bad = [
        (q.blocks[:, :-1], q.scales),  # one byte short
        (torch.zeros(4, 33, dtype=torch.uint8), q.scales),
        (q.blocks.reshape(-1), q.scales),
        (q.blocks.to(torch.int8), q.scales),
        (q.blocks, q.scales[:, :1]),
        (q.blocks, q.scales.to(torch.int32)),
        (q.blocks.t(), q.scales),
    ]
    for blocks, scales in bad:
        with pytest.raises(ValueError, match="MxWeight"):
            MxWeight(blocks, scales, *good[2:])
    with pytest.raises(ValueError, match="mxfp8_e4m3"):
        MxWeight(q.blocks, q.scales, "mxfp8_e4m3", 32, (4, 64))  # 8-bit codes need 64 bytes a row
    with pytest.raises(ValueError):
        MxWeight(q.blocks, q.scales, "nope", 32, (4, 64))


def test_mxweight_rejects_k_not_a_multiple_of_block_size():
    """K=40 with blocks of 32: blocks [4, 20] and scales [4, 1] must not make a valid weight."""
    with pytest.raises(ValueError):
        MxWeight(
            torch.zeros(4, 20, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8), "mxfp4", 32, (4, 40)
        )


@pytest.mark.parametrize("block_size", [0, 48, 512])
def test_mxweight_rejects_bad_block_size(block_size):
    k = 1024 if block_size == 512 else 96
    scales = torch.zeros(4, k // block_size if block_size else 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="block_size"):
        MxWeight(torch.zeros(4, k // 2, dtype=torch.uint8), scales, "mxfp4", block_size, (4, k))
