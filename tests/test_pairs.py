"""The fp16- and bf16-pair decodes of the ``mma`` rule (:mod:`mxgemm.codegen.pairs`), run on the CPU
(LLVM), bit-exact against ml_dtypes / the two's complement oracle for every code of every format."""

import ml_dtypes
import numpy as np
import pytest
import torch

import mxgemm
from mxgemm import formats, packing
from mxgemm.codegen import pairs
from mxgemm.layout import plane_widths, to_planes
from tests import oracle

CASES = [
    (f, dt) for dt in ("float16", "bfloat16") for f in formats.names() if pairs.supported(formats.get(f), dt)
]
NP_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _words(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes ``[cases, 8]`` → uint32 ``[cases, planes, 2]``: each plane's ``w`` bytes as the
    kernel loads them (little endian, zero-extended)."""
    planes = to_planes(packing.pack(torch.from_numpy(codes), bits), bits)
    out = np.zeros((codes.shape[0], len(planes), 2), np.uint32)
    for p, plane in enumerate(planes):
        raw = np.zeros((codes.shape[0], 8), np.uint8)
        raw[:, : plane.shape[1]] = plane.numpy()
        out[:, p] = raw.view(np.uint32)
    return out


def _high_nibbles(words: np.ndarray, at: int, rng) -> np.ndarray:
    """The high (2-bit) plane of 6-bit runs (``_words``' plane 1) as :func:`pairs.six_words` takes it:
    nibble ``p`` (codes ``2p``, ``2p + 1``) at bits ``at .. at + 3`` of byte ``p``, random bits
    around it (as the ``wgmma_w`` kernel's gather leaves them)."""
    hi = np.zeros(words.shape[0], np.uint32)
    for p in range(4):
        nib = words[:, 1, 0] >> np.uint32(4 * p) & np.uint32(15)
        junk = rng.integers(0, 256, words.shape[0], dtype=np.uint32) & np.uint32(~(15 << at) & 255)
        hi |= (nib << np.uint32(at) | junk) << np.uint32(8 * p)
    return hi


def _decode_fn(fmt, cases: int, how: str, dtype: str, at: int = 0):
    """LLVM function ``f(W, H, O)``: ``O[c, pair]`` the pairs of run ``c`` (``W``: ``_words``; ``H``:
    :func:`_high_nibbles`, read by ``how`` "six" only) decoded ``how``: "right" / "left"
    (:func:`pairs.decode_pair`), "quad" (:func:`pairs.decode_quad`), "six" / "sixw"
    (:func:`pairs.six_pair`, the high plane from ``H`` / from ``W`` by :func:`pairs.six_high`)."""
    import tvm
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    n_planes = len(plane_widths(fmt.bits))
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("main")
            w = T.match_buffer(T.arg("W", T.handle()), (cases, n_planes, 2), "uint32")
            hi = T.match_buffer(T.arg("H", T.handle()), (cases,), "uint32")
            o = T.match_buffer(T.arg("O", T.handle()), (cases, 4), "uint32")
            with T.serial(0, cases) as c:
                quads = pairs.decode_quad(fmt, w[c, 0, 0], cuda=False) if how == "quad" else None
                high = pairs.six_high(w[c, 1, 0], cuda=False) if how == "sixw" else hi[c]
                six = pairs.six_words(w[c, 0, 0], high, at, cuda=False) if how.startswith("six") else None
                for pair in range(4):
                    if how == "quad":
                        bits = quads[pair]
                    elif how.startswith("six"):
                        bits = pairs.six_pair(fmt, *six, pair, cuda=False, dtype=dtype)
                    else:
                        wd = lambda p, i: w[c, p, i]  # noqa: E731
                        bits = pairs.decode_pair(fmt, wd, pair, cuda=False, left=how == "left", dtype=dtype)
                    T.buffer_store(o, bits, [c, pair])
    return tvm.compile(tvm.IRModule({"main": ib.get()}), target="llvm")["main"]


def _run(fmt, codes: np.ndarray, how: str, dtype: str, at: int = 0) -> np.ndarray:
    """uint32 ``[runs, 4]``: the pairs of the runs of 8 ``codes`` (uint8 ``[runs, 8]``), decoded ``how``."""
    import tvm

    words = _words(codes, fmt.bits)
    hi = (
        _high_nibbles(words, at, np.random.default_rng(at))
        if how == "six"
        else np.zeros(len(codes), np.uint32)
    )
    out = np.zeros((codes.shape[0], 4), np.uint32)
    args = [tvm.runtime.tensor(a) for a in (words, hi, out)]
    _decode_fn(fmt, codes.shape[0], how, dtype, at)(*args)
    return args[2].numpy()


def _fma_bf16x2(a: np.ndarray, fin: pairs.Finish) -> np.ndarray:
    """PTX ``fma.rn.bf16x2 d, a & ~sign, b, c | (a & sign)`` (:class:`pairs.Finish`) on uint32 words
    (float64 holds every product and sum of these operands exactly, so one rounding to bf16 is the
    instruction's)."""
    lanes = lambda w: np.asarray(w, np.uint32).reshape(-1, 1).view(ml_dtypes.bfloat16)  # noqa: E731
    a = np.asarray(a, np.uint32)
    x, c = a & np.uint32(~fin.sign & 0xFFFFFFFF), a & np.uint32(fin.sign) | np.uint32(fin.c)
    d = lanes(x).astype(np.float64) * lanes(fin.b).astype(np.float64) + lanes(c).astype(np.float64)
    return d.astype(ml_dtypes.bfloat16).view(np.uint32).reshape(a.shape)


@pytest.mark.parametrize(
    ("name", "dtype", "how", "at"),
    [(*c, how, 0) for c in CASES for how in ("right", "left")]
    + [(*c, "quad", 0) for c in CASES if pairs.quad_supported(formats.get(c[0]), c[1])]
    + [
        (*c, how, at)
        for c in CASES
        if pairs.six_supported(formats.get(c[0]), c[1])
        for how, at in (("six", 0), ("six", 4), ("sixw", 0))
    ],
)
def test_every_code_pair_bit_exact(name, dtype, how, at):
    """Every code at every position of a run of 8 (and each next to every other code) decodes to
    its value times the format's offset, exactly, in fp16 and in bf16 (both byte-lane choices:
    ``how`` "right" / "left"; "quad": :func:`pairs.decode_quad`'s four pairs a word, where it serves;
    "six": :func:`pairs.six_pair` from a code a byte, the high plane's nibbles at bit ``at`` (0 or 4)
    of its bytes among random bits (as ``wgmma_w`` gathers them), "sixw": from the plane's word
    (:func:`pairs.six_high`, as ``mma`` has it); the same bits as :func:`pairs.decode_pair`'s)."""
    fmt = formats.get(name)
    spec = oracle.SPECS[name]
    n = 2**fmt.bits
    rng = np.random.default_rng(fmt.bits)
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    codes = np.empty((n * n, 8), np.uint8)
    for pos in range(0, 8, 2):  # the pair (a, b) at every pair position, random codes elsewhere
        codes[:, pos], codes[:, pos + 1] = a.ravel(), b.ravel()
    codes = np.concatenate([np.roll(codes, s, axis=1) for s in range(0, 8, 2)])
    codes[:, :] = np.where(rng.random(codes.shape) < 0.25, rng.integers(0, n, codes.shape), codes)
    raw = _run(fmt, codes, how, dtype, at)
    if how.startswith("six"):
        np.testing.assert_array_equal(raw, _run(fmt, codes, "right", dtype))
    if (fma := pairs.bf16_fma(fmt, dtype)) is not None:
        raw = _fma_bf16x2(raw, fma)
    with np.errstate(invalid="ignore"):  # e5m2's NaN/inf codes decode to NaN/inf: NaN × factor
        got = raw.view(NP_DTYPES[dtype]).reshape(-1, 8).astype(np.float64) * pairs.out_factor(fmt)
    want = oracle.decode(codes, spec)
    special = ~np.isfinite(want)  # NaN/inf codes (never produced by quantize)
    if name == "mxfp8_e5m2":  # they land on the inf/NaN codes
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(
            got[np.isinf(want)], want[np.isinf(want)]
        )
    np.testing.assert_array_equal(got[~special], want[~special])
    assert mxgemm.formats.get(name).bits == spec.bits


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_folded_scale_keeps_every_pair_exact(name, dtype):
    """The block scale folded into the pairs (:func:`pairs.fold`): for every exponent of the fold's
    range, every code's pair times its multiplier (the kernel's one fma, emulated with one rounding)
    is exact (its value times the power of two, the format's values over the oracle), and the
    multiplier a normal number; one binade below the range, some code or the multiplier is not."""
    fmt, spec = formats.get(name), oracle.SPECS[name]
    fold = pairs.fold(fmt, dtype)
    codes = np.resize(np.arange(2**fmt.bits, dtype=np.uint8), max(8, 2**fmt.bits)).reshape(-1, 8)
    raw = _run(fmt, codes, "right", dtype)
    fma = pairs.bf16_fma(fmt, dtype)
    if fma is not None and not fold.merged:  # integer codes: the magic number, then the multiplier
        raw = _fma_bf16x2(raw, fma)
    with np.errstate(invalid="ignore"):  # e5m2's NaN codes
        lanes = raw.view(NP_DTYPES[dtype]).reshape(-1).astype(np.float64)
    want = oracle.decode(codes, spec).reshape(-1)
    finite = np.isfinite(want)
    bias, shift = {"float16": (15, 10), "bfloat16": (127, 7)}[dtype]

    def folded(c: int) -> tuple[np.ndarray, bool]:
        """The pairs times the multiplier of exponent ``c``, rounded once; whether it is normal."""
        e = fold.offset + c  # the multiplier's exponent field
        word = (e << shift) * 0x10001 & 0xFFFFFFFF
        factor = np.array([word], np.uint32).view(NP_DTYPES[dtype]).astype(np.float64)[0]
        with np.errstate(invalid="ignore", over="ignore"):
            prod = (lanes * factor).astype(NP_DTYPES[dtype]).astype(np.float64)
        return prod, 1 <= e <= 2 * bias and factor == 2.0 ** (e - bias)

    for c in range(fold.c0 - fold.spread, fold.c0 + 1):
        prod, normal = folded(c)
        assert normal, (name, dtype, c)
        np.testing.assert_array_equal(prod[finite] * pairs.out_factor(fmt) * 2.0**-c, want[finite])
        with np.errstate(invalid="ignore"):  # e5m2's NaN codes
            exact = lanes * 2.0 ** (c + (112 if fold.merged else 0))
        np.testing.assert_array_equal(prod[np.isfinite(exact)], exact[np.isfinite(exact)])
    prod, normal = folded(fold.c0 - fold.spread - 1)
    with np.errstate(invalid="ignore"):
        exact = lanes * 2.0 ** (fold.c0 - fold.spread - 1 + (112 if fold.merged else 0))
    assert not normal or not np.array_equal(prod[np.isfinite(exact)], exact[np.isfinite(exact)])


def test_unsupported_format_is_refused():
    wide = formats.Format("e6m1", "float", 8, 6, 1, "none", 32, None)
    assert not pairs.supported(wide) and not pairs.supported(wide, "bfloat16")
    long = formats.Format("e2m8", "float", 11, 2, 8, "none", 32, None)
    assert pairs.supported(long) and not pairs.supported(long, "bfloat16")  # 8 mantissa bits > bf16's 7
    int9 = formats.Format("int9", "int", 9, 0, 8, "none", 32, None)
    assert pairs.supported(int9) and not pairs.supported(int9, "bfloat16")
    assert ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).bits == 8


def test_scale_exponent_and_nan_flags_every_code():
    """The ring's block scales (:func:`~mxgemm.codegen.decode.scale_exponent`): every E8M0 code at
    every byte of a word (random codes in the other bytes) gives ml_dtypes' value bit-exactly, code
    0 the subnormal 2**-127 and code 255 +inf; :func:`~mxgemm.codegen.decode.nan_scales` is nonzero
    exactly for words holding a 255 (and for a lone code 255)."""
    import tvm
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    from mxgemm.codegen.decode import nan_scales, scale_exponent

    rng = np.random.default_rng(5)
    words = rng.integers(0, 255, (256, 4), dtype=np.uint8)  # no 255 but where placed
    for b in range(4):
        words[:, b] = np.arange(256)
    w32 = np.ascontiguousarray(words).view(np.uint32)[:, 0]
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("main")
            w = T.match_buffer(T.arg("W", T.handle()), (256,), "uint32")
            o = T.match_buffer(T.arg("O", T.handle()), (256, 5), "float32")
            f = T.match_buffer(T.arg("F", T.handle()), (256, 2), "uint32")
            with T.serial(0, 256) as c:
                for b in range(4):
                    T.buffer_store(o, scale_exponent(w[c], b), [c, b])
                T.buffer_store(o, scale_exponent(tvm.tirx.Cast("uint32", c), None), [c, 4])
                T.buffer_store(f, nan_scales(w[c]), [c, 0])
                T.buffer_store(f, nan_scales(tvm.tirx.Cast("uint32", c)), [c, 1])
    fn = tvm.compile(tvm.IRModule({"main": ib.get()}), target="llvm")["main"]
    out, flags = np.zeros((256, 5), np.float32), np.zeros((256, 2), np.uint32)
    fn(tvm.runtime.tensor(w32), (o_t := tvm.runtime.tensor(out)), (f_t := tvm.runtime.tensor(flags)))
    got, flags = o_t.numpy(), f_t.numpy()
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    want[255] = np.inf  # the NaN code: flagged, not encoded
    for col in range(5):
        assert np.array_equal(got[:, col].view(np.uint32), want.view(np.uint32)), col
    assert np.array_equal(flags[:, 0] != 0, np.arange(256) == 255)  # the word holds a 255 only there
    assert np.array_equal(flags[:, 1] != 0, np.arange(256) == 255)
