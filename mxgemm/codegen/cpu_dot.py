"""The kernel of the ``cpu_dot`` rule (:mod:`mxgemm.rules.cpu_dot` says when it applies): a
decode-fused GEMM for any number of rows on x86 CPUs with AVX-512: bf16 activations on AVX-512 BF16
dot products (``vdpbf16ps``: 16 fp32 lanes, each adding two bf16 products), or fp16/bf16 ones on fp32
multiply-adds (``dot="fma"``: CPUs without AVX512-BF16, and fp16 rows, which bf16 does not hold).

Weights × activations as an outer product: lane ``l`` of a 16-lane accumulator is output column
``n0 + l``; one ``vdpbf16ps`` adds ``x[m, 2p] W[n, 2p] + x[m, 2p+1] W[n, 2p+1]`` to it, the
activation pair broadcast to every lane (one 32-bit load), the weight pairs of 16 columns one
vector (``"fma"``: the pair widened to two fp32 vectors, two multiply-adds with the two activations,
which are widened to fp32 once per K chunk). The codes come in that order
(:func:`mxgemm.layout.pair_tiles`: 32 bytes a vector, or two vectors for 4-bit codes, low nibbles
then high ones), so 32 of them zero-extended to 16 bits
decode to 32 bf16 weights with no shuffle: each code is the index of a table lookup in a register
(``vpermw``, 32 entries, or ``vpermi2w``, 64; 8-bit floats take two of those on their 7 magnitude
bits, 7/8-bit ints two or four, and selects), whose table holds the element values (every element
value of every format is exact in bf16).

The E8M0 scale applies per 32-wide K block: a block's 16 dot steps go to zeroed fp32 partial sums,
which are added to the accumulators times the 16 columns' scales (exact: a power of two). Scales
come as ``[n/16, k/32, 16]`` bytes (:func:`mxgemm.layout.scale_tiles`).

Per parallel task, ``nr`` groups of 16 columns; per ``kc`` of K, the task decodes its codes once
into an L1-resident buffer, then runs the ``mr × nr`` register tile over all rows (in groups of
:data:`MS` rows whose accumulators are kept in a buffer across K chunks; rows past a multiple of
``mr`` one at a time). ``vdpbf16ps`` treats bf16 subnormals as zero and flushes
subnormal results: products of magnitude below 2**-126 are lost (fp32 summation order otherwise).

LLVM has the dot product and the table lookups as intrinsics over ``bfloat`` / ``i16`` vectors,
which TVM's bf16 legalization does not pass through; they are called through three small LLVM IR
functions imported into the module (``pragma_import_llvm``) and inlined.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import torch
from tvm import tirx

from mxgemm import formats

DOTS = ("bf16", "fma")  # how a pair of K neighbours is multiplied (see :func:`kernel`)
PAIR = 16  # columns per vector (fp32 lanes)
PAIR_VECTORS = {1: 2, 2: 1}  # vectors of weights per 32 code bytes, by bytes a lane's pair takes
BLOCK = 32  # K per scale step
MS = 64  # rows whose accumulators a task keeps across K chunks
PREFETCH = 1  # K chunks ahead that the decode prefetches codes (past a tile's end: the next tile's)
KCS = tuple(range(32, 513, 32))  # K chunks a task decodes at a time
MAX_TILE = 24  # partial sums of a register tile, at most (AVX-512 has 32 vector registers)

LLVM_IR = """
define <16 x float> @mxgemm_dpbf16(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) alwaysinline {
  %ab = bitcast <16 x i32> %a to <32 x bfloat>
  %bb = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(
      <16 x float> %acc, <32 x bfloat> %ab, <32 x bfloat> %bb)
  ret <16 x float> %r
}
define <32 x i16> @mxgemm_lut32(<32 x i16> %idx, <32 x i16> %table) alwaysinline {
  %r = call <32 x i16> @llvm.x86.avx512.permvar.hi.512(<32 x i16> %table, <32 x i16> %idx)
  ret <32 x i16> %r
}
define <32 x i16> @mxgemm_lut64(<32 x i16> %idx, <32 x i16> %lo, <32 x i16> %hi) alwaysinline {
  %r = call <32 x i16> @llvm.x86.avx512.vpermi2var.hi.512(<32 x i16> %lo, <32 x i16> %idx, <32 x i16> %hi)
  ret <32 x i16> %r
}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
declare <32 x i16> @llvm.x86.avx512.permvar.hi.512(<32 x i16>, <32 x i16>)
declare <32 x i16> @llvm.x86.avx512.vpermi2var.hi.512(<32 x i16>, <32 x i16>, <32 x i16>)
"""


@dataclass(frozen=True)
class Hints:
    """mr: rows of the register tile; nr: 16-column groups of a task (the tile's other side; its
    ``mr · nr`` accumulators and as many partial sums take registers); kc: K decoded per chunk (the
    L1 buffer holds ``kc · nr · 32`` bytes; a multiple of 32 up to 512)."""

    mr: int = 4
    nr: int = 2
    kc: int = 256

    def __post_init__(self) -> None:
        ok = self.mr in (1, 2, 4, 6, 8) and self.nr in (1, 2, 4) and self.kc in KCS
        if not ok or self.mr * self.nr > MAX_TILE:
            raise ValueError(f"cpu_dot hints out of range: {self}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def pair_bytes(bits: int) -> int:
    """Bytes of a lane's code pair: 1 for 4-bit codes (a byte holds two), else 2 (one a byte)."""
    return 1 if bits == 4 else 2


def supports(fmt: formats.Format) -> bool:
    """Formats whose codes the kernel decodes: 3–8-bit codes (2-bit codes, four a byte, are not)."""
    return fmt.bits >= 3


def table(fmt: formats.Format) -> list[int]:
    """The bf16 bit patterns of the kernel's lookup tables, a multiple of 32 entries: every code's
    element value in code order (4-bit codes: twice, as ``vpermw`` reads 5 index bits; 8-bit floats:
    the positive codes only, their sign is ORed in)."""
    n = 2**fmt.bits // (2 if fmt.bits == 8 and fmt.kind == "float" else 1)
    codes = torch.arange(max(32, n), dtype=torch.int32) % n
    return fmt.decode(codes.to(torch.uint8)).to(torch.bfloat16).view(torch.int16).tolist()


def kernel(  # noqa: PLR0913
    fmt: formats.Format,
    *,
    n: int,
    k: int,
    bias: bool,
    hints: Hints,
    a_dtype: str = "bfloat16",
    dot: str = "bf16",
) -> tirx.PrimFunc:
    """The kernel as a PrimFunc: A ``a_dtype [m, k]`` (``m`` dynamic), C ``uint8 [n/16, k/2, 32]``
    (4-bit codes ``[n/16, k/4, 32]``: :func:`mxgemm.layout.pair_tiles`), S ``uint8 [n/16, k/32, 16]``
    (:func:`mxgemm.layout.scale_tiles`), Bias ``a_dtype [n]`` (if ``bias``), Y ``a_dtype [m, n]``.
    ``dot``: ``"bf16"``, the pairs' products by ``vdpbf16ps`` (bfloat16 activations); ``"fma"``, each
    pair of bf16 weights widened to two fp32 vectors (a shift, an AND) and two fp32 multiply-adds
    with the activations in fp32 (float16 or bfloat16 activations; AVX-512 without BF16)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    if dot not in DOTS or (dot == "bf16" and a_dtype != "bfloat16"):
        raise ValueError(f"cpu_dot: no {dot!r} dot products for {a_dtype} activations (dots: {DOTS})")
    with IRBuilder() as ib:
        with T.prim_func():
            _Kernel(T, fmt, n, k, bias, hints, a_dtype, dot).emit()
    return ib.get()


def fits(h: Hints, n: int, k: int) -> bool:
    """Whether ``h`` tiles an ``[n, k]`` weight."""
    return n % (PAIR * h.nr) == 0 and k % h.kc == 0


class _Kernel:
    def __init__(self, T, fmt, n, k, bias, h, a_dtype, dot):  # noqa: N803, PLR0913
        self.T, self.fmt, self.n, self.k, self.bias, self.h = T, fmt, n, k, bias, h
        self.a_dtype, self.dot = a_dtype, dot
        self.c = pair_bytes(fmt.bits)
        if not fits(h, n, k):
            raise ValueError(f"cpu_dot hints {h} do not tile [{n}, {k}]")

    def emit(self) -> None:
        T, h, n, k, c = self.T, self.h, self.n, self.k, self.c
        T.func_name("main")
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        m = tirx.Var("m", "int64")
        a_h, c_h, s_h = T.arg("A", T.handle()), T.arg("C", T.handle()), T.arg("S", T.handle())
        bias_h = T.arg("Bias", T.handle()) if self.bias else None
        y_h = T.arg("Y", T.handle())
        self.A = A = T.match_buffer(a_h, (m, k), self.a_dtype)
        self.C = T.match_buffer(c_h, (n // PAIR, k // (2 * PAIR_VECTORS[c]), 2 * PAIR), "uint8")
        S = T.match_buffer(s_h, (n // PAIR, k // BLOCK, PAIR), "uint8")
        self.Bias = Bias = T.match_buffer(bias_h, (n,), self.a_dtype) if self.bias else None
        self.Y = Y = T.match_buffer(y_h, (m, n), self.a_dtype)
        a32 = T.decl_buffer((m * (k // 2),), "uint32", data=A.data)
        self.y16 = T.decl_buffer((m * n,), "uint16", data=Y.data)
        self.b16 = T.decl_buffer((n,), "uint16", data=Bias.data) if self.bias else None
        with T.attr(0, "pragma_import_llvm", LLVM_IR):
            with T.parallel(0, n // (PAIR * h.nr)) as task:
                entries = table(self.fmt)
                lut = T.alloc_buffer((len(entries),), "uint16", scope="local")
                for i, v in enumerate(entries):
                    T.buffer_store(lut, tirx.const(v & 0xFFFF, "uint16"), [i])
                buf = T.alloc_buffer((h.kc // 2 * h.nr * PAIR,), "uint32", scope="local")
                accm = T.alloc_buffer((MS * h.nr * PAIR,), "float32", scope="local")
                # fma: the group's activations of a K chunk in fp32, so that each is one broadcast
                fma = self.dot == "fma"
                self.xf = T.alloc_buffer((MS * h.kc,), "float32", scope="local") if fma else None
                ms_rows = MS // h.mr * h.mr  # rows per group, a multiple of the tile's
                with T.serial(0, (m + ms_rows - 1) // ms_rows) as ms:
                    m0 = ms * ms_rows
                    rows = tirx.Min(m - m0, tirx.const(ms_rows, "int64"))
                    with T.serial(0, k // h.kc) as kc:
                        self.decode_chunk(task, kc, buf, lut)
                        if self.xf is not None:
                            self.widen_chunk(m0, rows, kc)
                        with T.serial(0, rows // h.mr) as mb:
                            self.tile(a32, S, buf, accm, task, kc, m0, mb * h.mr, h.mr)
                        if h.mr > 1:  # the last rows, one at a time
                            with T.serial(0, rows % h.mr) as i:
                                self.tile(a32, S, buf, accm, task, kc, m0, rows // h.mr * h.mr + i, 1)
                    with T.serial(0, rows) as i:
                        self.epilogue(task, accm, m0 + i, i)

    def decode_chunk(self, task, kc, buf, lut) -> None:
        """The task's codes of K chunk ``kc`` decoded into ``buf`` (pair ``p`` of column group ``r`` at
        ``(p · nr + r) · 16`` words), and those of chunk ``kc + PREFETCH`` prefetched."""
        T, h = self.T, self.h
        v = PAIR_VECTORS[self.c]
        buf16 = T.decl_buffer((h.kc * h.nr * PAIR,), "uint16", data=buf.data)
        with T.serial(0, h.kc // (2 * v)) as q:
            for r in range(h.nr):
                g = task * h.nr + r
                group = kc * (h.kc // (2 * v)) + q
                codes = self.C[g, group, tirx.Ramp(0, 1, 2 * PAIR)]
                ahead = T.address_of(self.C[g, group + PREFETCH * (h.kc // (2 * v)), 0])
                T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", ahead, 0, 3, 1))
                wide = tirx.Cast("uint16x32", codes)
                for sv in range(v):  # 4-bit codes: low nibbles, then high ones
                    idx = wide >> tirx.const(4, "uint16") if sv else wide
                    at = ((q * v + sv) * h.nr + r) * 2 * PAIR
                    T.buffer_store(buf16, self.decode(idx, lut), [tirx.Ramp(at, 1, 2 * PAIR)])

    def widen_chunk(self, m0, rows, kc) -> None:
        """The activations of rows ``m0 ..`` (``rows`` of them), K chunk ``kc``, into :attr:`xf` as fp32
        (row ``i`` at ``i · kc``), 16 at a time."""
        T, kcw = self.T, self.h.kc
        with T.serial(0, rows) as i:
            for c in range(kcw // PAIR):
                vals = tirx.Cast("float32x16", self.A[m0 + i, tirx.Ramp(kc * kcw + c * PAIR, 1, PAIR)])
                T.buffer_store(self.xf, vals, [tirx.Ramp(i * kcw + c * PAIR, 1, PAIR)])

    def epilogue(self, task, accm, row, i) -> None:
        """Row ``row`` of Y (row ``i`` of the group in ``accm``): plus the bias, rounded to bf16."""
        h, n = self.h, self.n
        for r in range(h.nr):
            col = (task * h.nr + r) * PAIR
            val = accm[tirx.Ramp((i * h.nr + r) * PAIR, 1, PAIR)]
            bf16 = self.a_dtype == "bfloat16"
            if self.bias and bf16:
                bb = tirx.Cast("uint32x16", self.b16[tirx.Ramp(col, 1, PAIR)])
                val = val + tirx.reinterpret("float32x16", bb << tirx.const(16, "uint32"))
            elif self.bias:
                val = val + tirx.Cast("float32x16", self.Bias[tirx.Ramp(col, 1, PAIR)])
            if bf16:
                self.T.buffer_store(self.y16, _to_bf16(val), [tirx.Ramp(row * n + col, 1, PAIR)])
            else:
                self.T.buffer_store(self.Y, tirx.Cast("float16x16", val), [row, tirx.Ramp(col, 1, PAIR)])

    def decode(self, idx, lut):
        """uint16x32 codes (4-bit codes: in the low nibble, bit 4 ignored) → their 32 bf16 weights.
        Up to 5 bits: one ``vpermw``; 6: one ``vpermi2w``; 8-bit floats: two on the sign-less 7 bits,
        a select, the sign ORed in; 7/8-bit ints: one per 64 codes and selects."""
        T, f = self.T, self.fmt
        u16 = "uint16"
        tables = [lut[tirx.Ramp(32 * t, 1, 32)] for t in range(len(table(f)) // 32)]
        if f.bits <= 5:
            return T.call_extern("uint16x32", "mxgemm_lut32", idx, tables[0])

        def lut64(t, ix=idx):
            return T.call_extern("uint16x32", "mxgemm_lut64", ix, tables[2 * t], tables[2 * t + 1])

        if f.bits == 6:
            return lut64(0)
        if f.kind == "float":  # sign-magnitude: the table of the positive half, then the sign
            bit6 = (idx & tirx.const(64, u16)) != tirx.Broadcast(tirx.const(0, u16), 32)
            mag = tirx.Select(bit6, lut64(1), lut64(0))
            return mag | ((idx & tirx.const(0x80, u16)) << tirx.const(8, u16))
        out = lut64(0)
        for t in range(1, len(tables) // 2):  # the 64-code quarter by bits 6..7
            sel = (idx >> tirx.const(6, u16)) == tirx.Broadcast(tirx.const(t, u16), 32)
            out = tirx.Select(sel, lut64(t), out)
        return out

    def tile(self, a32, S, buf, accm, task, kc, m0, i0, mr) -> None:
        """The register tile of rows ``m0 + i0 ..`` (``mr`` of them) × ``nr`` column groups over one K
        chunk: its accumulators from ``accm`` (zero at the first chunk), block by block of 16 dot
        steps into partial sums scaled into them."""
        T, h, k = self.T, self.h, self.k
        f32 = "float32x16"
        zero = tirx.Broadcast(tirx.const(0.0, "float32"), PAIR)
        acc = T.alloc_buffer((mr * h.nr * PAIR,), "float32", scope="local")
        part = T.alloc_buffer((mr * h.nr * PAIR,), "float32", scope="local")
        tiles = list(itertools.product(range(mr), range(h.nr)))

        def at(i, r):
            return tirx.Ramp((i * h.nr + r) * PAIR, 1, PAIR)

        def slot(i, r):
            return tirx.Ramp(((i0 + i) * h.nr + r) * PAIR, 1, PAIR)

        for i, r in tiles:
            T.buffer_store(acc, tirx.Select(kc == 0, zero, accm[slot(i, r)]), [at(i, r)])
        with T.serial(0, h.kc // BLOCK) as blk:
            for i, r in tiles:
                T.buffer_store(part, zero, [at(i, r)])
            for p in range(BLOCK // 2):
                pp = blk * (BLOCK // 2) + p
                w = [buf[tirx.Ramp((pp * h.nr + r) * PAIR, 1, PAIR)] for r in range(h.nr)]
                if self.dot == "fma":  # the even and the odd K of each lane's pair, as fp32
                    hi = tirx.const(0xFFFF0000, "uint32")
                    w = [(_f32(v << tirx.const(16, "uint32")), _f32(v & hi)) for v in w]
                for i in range(mr):
                    row = m0 + i0 + i
                    kk = kc * (h.kc // 2) + pp
                    if self.dot == "bf16":
                        a = tirx.Broadcast(a32[row * (k // 2) + kk], PAIR)
                    else:
                        at_x = (i0 + i) * h.kc + 2 * (blk * (BLOCK // 2) + p)
                        a = [tirx.Broadcast(self.xf[at_x + e], PAIR) for e in (0, 1)]
                    for r in range(h.nr):
                        if self.dot == "bf16":
                            dot = T.call_extern(f32, "mxgemm_dpbf16", part[at(i, r)], a, w[r])
                        else:
                            dot = _fma(a[1], w[r][1], _fma(a[0], w[r][0], part[at(i, r)]))
                        T.buffer_store(part, dot, [at(i, r)])
            for r in range(h.nr):
                codes = S[task * h.nr + r, kc * (h.kc // BLOCK) + blk, tirx.Ramp(0, 1, PAIR)]
                sc = _scale(tirx.Cast("uint32x16", codes))
                for i in range(mr):
                    T.buffer_store(acc, acc[at(i, r)] + part[at(i, r)] * sc, [at(i, r)])
        for i, r in tiles:
            T.buffer_store(accm, acc[at(i, r)], [slot(i, r)])


def _f32(bits):
    """uint32x16 bit patterns as float32x16."""
    return tirx.reinterpret("float32x16", bits)


def _fma(a, b, c):
    """float32x16 ``a · b + c``, one rounding (``vfmadd``)."""
    return tirx.call_llvm_pure_intrin("float32x16", "llvm.fma.v16f32", a, b, c)


def _scale(code):
    """uint32x16 E8M0 codes → float32x16 ``2**(c-127)`` (code 0: 2**-127; 255: NaN), as
    :func:`mxgemm.codegen.decode.scale_expr`."""
    u = "uint32"
    zero_or_nan = tirx.Or(code == tirx.const(0, u), code == tirx.const(255, u))
    special = tirx.Cast("uint32x16", zero_or_nan) << tirx.const(22, u)
    return tirx.reinterpret("float32x16", (code << tirx.const(23, u)) | special)


def _to_bf16(val):
    """float32x16 → uint16x16 bf16 bit patterns, rounded to nearest even (NaN kept NaN)."""
    u = "uint32"
    bits = tirx.reinterpret("uint32x16", val)
    lsb = (bits >> tirx.const(16, u)) & tirx.const(1, u)
    rounded = (bits + tirx.const(0x7FFF, u) + lsb) >> tirx.const(16, u)
    nan = tirx.NE(val, val)
    quiet = (bits >> tirx.const(16, u)) | tirx.const(0x40, u)
    return tirx.Cast("uint16x16", tirx.Select(nan, quiet, rounded))
