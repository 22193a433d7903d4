"""Two codes per integer op: MX/BFP element codes → fp16 pairs (``half2`` bits in a uint32), the A
operand of ``mma.sync`` straight from registers.

A pair's two codes are moved to the same offset of the two 16-bit halves of a word (one ``prmt``),
so every shift and mask decodes both (the SIMD-within-a-register trick of FasterTransformer and Marlin).
Float codes: sign to bit 15, exponent and mantissa to the low end of the fp16 exponent field and the
top of its mantissa, which is the value times ``2**(bias - 15)`` (subnormals map to fp16 subnormals,
ebits ≤ 5 and mbits ≤ 10 for every format; e2m1 and e4m3, in either dtype: one sign-replicating
``prmt``, a shift and a mask a pair, :func:`_sign_pair`; 6-bit floats, whose codes come in two
planes: a run of 8 first made a byte a code, two ``lop3`` and four shifts, :func:`six_words`, then
the same three ops a pair, :func:`six_pair`); :func:`out_factor` undoes it once per output. Integer
codes: ``code ^ 2**(bits-1)`` in the mantissa of 1024.0 is ``1024 + 2**(bits-1) + q``; one exact
half2 subtraction gives ``q``, and :func:`out_factor` applies ``2**-(bits-2)``.

``left``: the pair goes to the byte lane from which every field moves left. ptxas issues a left shift
as ``IMAD.SHL`` on the FMA pipe, a right one as ``SHF`` on the ALU pipe, where the ring kernels'
decode is the busiest pipe; which is faster depends on the kernel (a tuning hint of the ``mma`` rule).

bf16 pairs (``mma.sync`` with bf16 activations) hold the same values as the fp16 ones, so
:func:`out_factor` does not depend on the dtype. Most need one exact ``fma.rn.bf16x2`` after
:func:`decode_pair` (:func:`bf16_fma` gives its operands; TVM would split a bf16x2 expression into
two scalar ops):

- float codes go to the low end of bf16's 8-bit exponent field (value times ``2**(bias - 127)``,
  subnormal codes to bf16 subnormals) and the fma multiplies by ``2**112``, to the fp16 offset: normal
  bf16 numbers, so the fp32 accumulator never sees a subnormal product (e2m1 and e4m3: one
  sign-replicating ``prmt``, a shift and a mask a pair, :func:`_sign_pair`). e5m2, whose
  all-ones exponent is inf/NaN, is decoded to fp16 and widened exactly instead (two ``cvt`` and a
  ``prmt``), so its specials stay inf/NaN;
- integer codes of up to 7 bits: the magic number 128.0 (7 mantissa bits), subtracted by the fma;
  8-bit codes, one bit too many for it: the low 7 bits in the magic number's mantissa (``128 + lo``)
  and the sign bit left at bit 7 of the word, where the fma's addend takes it from: ``-128`` or, with
  bit 7 (bf16's lowest exponent bit) set, ``-256`` (:class:`Finish`: two ``lop3`` and the fma).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.ir import Expr as PrimExpr

from mxgemm.codegen.decode import U32, u32
from mxgemm.formats import Format
from mxgemm.layout import plane_widths


def _rep(mask16: int) -> PrimExpr:
    """A 16-bit mask in both halves of a uint32."""
    return u32(mask16 | mask16 << 16)


def _shift(x: PrimExpr, s: int) -> PrimExpr:
    return x if s == 0 else (x << u32(s) if s > 0 else x >> u32(-s))


# prmt with every selector bit (a byte's sign replicated), which CUDA's __byte_perm does not promise
PRMT = (
    "__device__ __forceinline__ unsigned mxgemm_prmt(unsigned a, unsigned b, unsigned s) {\n"
    '  unsigned d;\n  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));\n  return d;\n'
    "}\n"
)


SELECT = (
    "__device__ __forceinline__ unsigned mxgemm_select(unsigned a, unsigned b, unsigned c) {\n"
    "  unsigned d;\n"
    '  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(d) : "r"(a), "r"(b), "r"(c));\n  return d;\n'
    "}\n"
)


def select(a: PrimExpr, b: PrimExpr, mask: int, cuda: bool) -> PrimExpr:
    """The bits of ``a`` where ``mask`` is set, of ``b`` elsewhere: one ``lop3`` on CUDA (inline PTX:
    nvcc splits the C expression in two where it knows bits of ``a``), shifts and masks elsewhere."""
    if cuda:
        return cuda_func_call("mxgemm_select", a, b, u32(mask), source_code=SELECT, return_type=U32)
    return a & u32(mask) | b & u32(~mask & 0xFFFFFFFF)


def prmt(a: PrimExpr, b: PrimExpr, sel: int, cuda: bool) -> PrimExpr:
    """PTX ``prmt`` (default mode): byte ``i`` of the result is byte ``sel >> 4i & 7`` of the 8 bytes
    ``b:a``, or where bit ``4i + 3`` of ``sel`` is set, that byte's top bit in all 8 bits (a sign
    replicated; CUDA's ``__byte_perm`` masks the selector to 3 bits a byte, so this is inline PTX).
    One instruction on CUDA; shifts and masks elsewhere (the CPU tests)."""
    if cuda and not sel & 0x8888:
        return tirx.call_pure_extern(U32, "__byte_perm", a, b, u32(sel))
    if cuda:
        return cuda_func_call("mxgemm_prmt", a, b, u32(sel), source_code=PRMT, return_type=U32)
    out = None
    for i in range(4):
        src = sel >> 4 * i & 7
        if sel >> 4 * i & 8:
            top = (a if src < 4 else b) >> u32(8 * (src % 4) + 7) & u32(1)
            byte = top * u32(0xFF << 8 * i)
        else:
            byte = _shift((a if src < 4 else b) & u32(0xFF << 8 * (src % 4)), 8 * (i - src % 4))
        out = byte if out is None else out | byte
    return out


def _field(
    word: PrimExpr, w: int, bit: int, dest: int, cuda: bool, left: bool = False
) -> tuple[PrimExpr, int]:
    """The pair of ``w``-bit codes at bits ``bit`` and ``bit + w`` of ``word`` moved to the same offset
    ``o`` of both 16-bit halves: (the moved word, ``o``). One ``prmt`` of ``word << w`` (which holds
    the first code where ``word`` holds the second) and ``word``: the codes' byte goes to byte 0/2 or
    1/3, whichever leaves ``o`` nearest ``dest`` (where the field's bits are wanted; ``left``: the
    highest ``o`` not above ``dest``, where there is one); other bits are garbage."""
    byte, within = (bit + w) // 8, (bit + w) % 8
    lanes = [lane for lane in (0, 1) if 8 * lane + within <= dest] if left else []
    lo = max(lanes) if lanes else min((0, 1), key=lambda lane: abs(dest - (8 * lane + within)))
    sel = byte << 4 * lo | (4 + byte) << 4 * (lo + 2)
    return prmt(word << u32(w), word, sel, cuda), 8 * lo + within


MANT = {"float16": 10, "bfloat16": 7}  # explicit mantissa bits of the pair's halves


def _half_to_bf16(bits: PrimExpr, cuda: bool) -> PrimExpr:
    """An fp16 pair (uint32 bits) as the bf16 pair of the same values, which bf16 must hold exactly:
    each half widened to fp32, whose top 16 bits are then its bf16 bits."""
    f32 = [
        tirx.reinterpret(U32, tirx.Cast("float32", tirx.reinterpret("float16", tirx.Cast("uint16", h))))
        for h in (bits & u32(0xFFFF), bits >> u32(16))
    ]
    return prmt(f32[0], f32[1], 0x7632, cuda)


def decode_pair(
    fmt: Format,
    word: Callable[[int, int], PrimExpr],
    pair: int,
    cuda: bool = True,
    left: bool = False,
    dtype: str = "float16",
) -> PrimExpr:
    """uint32 bits of the ``dtype`` pair (``"float16"`` or ``"bfloat16"``) of codes ``2 pair`` and
    ``2 pair + 1`` (low and high half) of a run of 8 codes of ``fmt``, given as their bit planes
    (:func:`mxgemm.layout.plane_widths`, low bits first): ``word(plane, i)`` is uint32 word ``i`` of
    the plane's ``w`` bytes (little endian; two words for 8-bit planes, else one, zero-extended).
    ``cuda``: ``prmt`` as one instruction; ``left``: fields moved by left shifts where the lanes
    allow it (the same bits). The pair holds the codes' values times ``1 / out_factor(fmt)`` once
    :func:`bf16_fma` (if not None) is applied to it.
    """
    bf16 = dtype == "bfloat16"
    if bf16 and fmt.specials == "ieee":
        return _half_to_bf16(decode_pair(fmt, word, pair, cuda, left), cuda)
    if fmt.kind == "float" and fmt.bits in (4, 8) and fmt.specials != "ieee":
        return _sign_pair(fmt, word, pair, cuda, dtype)
    mant = MANT[dtype]
    terms: list[PrimExpr] = []
    off = 0
    top = fmt.bits - 1  # the sign bit of float codes
    for p, w in enumerate(plane_widths(fmt.bits)):
        bit = 2 * pair * w  # of code 2 pair in the plane's bitstream
        if fmt.kind == "int":
            z, o = _field(word(p, bit // 32), w, bit % 32, off, cuda, left)
            terms.append(_shift(z, off - o) & _rep((2**w - 1) << off))
        else:
            plain = min(w, top - off)  # exponent/mantissa bits of this plane
            dest = off + mant - fmt.mbits
            sign_at = 15 - (top - off) if off + w > top else dest  # where the field best sits
            z, o = _field(
                word(p, bit // 32), w, bit % 32, min(dest, sign_at) if left else sign_at, cuda, left
            )
            if plain > 0:
                terms.append(_shift(z, dest - o) & _rep((2**plain - 1) << dest))
            if off + w > top:  # the sign bit is in this plane
                terms.append(_shift(z, 15 - (o + top - off)) & _rep(0x8000))
        off += w
    bits = terms[0]
    for t in terms[1:]:
        bits = bits | t
    if fmt.kind == "float":
        return bits
    half = 2 ** (fmt.bits - 1)
    if bf16 and fmt.bits == 8:  # 128 + the low 7 bits, the sign bit kept at bit 7 (Finish.sign)
        return bits | _rep(0x4300)
    one = 0x4300 if bf16 else 0x6400  # 2**mant: the magic number whose mantissa holds the code
    biased = (bits ^ _rep(half)) | _rep(one)  # 2**mant + half + q in each lane
    if bf16:
        return biased
    magic = tirx.Broadcast(tirx.const(2.0**mant + half, dtype), 2)
    return tirx.reinterpret(U32, tirx.reinterpret(f"{dtype}x2", biased) - magic)


def _sign_pair(
    fmt: Format, word: Callable[[int, int], PrimExpr], pair: int, cuda: bool, dtype: str
) -> PrimExpr:
    """:func:`decode_pair`'s ``dtype`` pair of one-plane float codes of 4 or 8 bits (``word`` and
    ``pair`` as there) in 3 integer ops: one ``prmt`` puts each code in the top bits of its half's low
    byte and its sign in all of the high byte (in its sign-replicating mode; a 4-bit pair is one
    byte's two codes: the low one taken from the word moved up a nibble, one shift a word), a shift
    moves the exponent and mantissa to the low end of the dtype's exponent field (and a sign copy to
    bit 15), a mask keeps those."""
    dest = MANT[dtype] - fmt.mbits  # the field's lowest bit
    field = (2 ** (fmt.bits - 1) - 1) << dest
    if fmt.bits == 8:  # codes 2p, 2p + 1: bytes 2 (p % 2) and the next of word p // 2
        w, byte = word(0, pair // 2), 2 * (pair % 2)
        sel = byte | (8 | byte) << 4 | (byte + 1) << 8 | (8 | byte + 1) << 12
        return (prmt(w, w, sel, cuda) << u32(dest)) & _rep(0x8000 | field)
    w = word(0, 0)  # codes 2p, 2p + 1: the low and high nibble of byte p
    sel = pair | (8 | pair) << 4 | (4 + pair) << 8 | (12 + pair) << 12
    return (prmt(w << u32(4), w, sel, cuda) << u32(dest - 4)) & _rep(0x8000 | field)


def six_supported(fmt: Format, dtype: str) -> bool:
    """Whether :func:`six_words` and :func:`six_pair` serve ``fmt`` in ``dtype``: 6-bit float codes
    (mxfp6), two planes (low 4 bits, high 2)."""
    return fmt.kind == "float" and fmt.bits == 6 and supported(fmt, dtype)


def six_words(
    lo: PrimExpr, hi: PrimExpr, at: PrimExpr | int = 0, cuda: bool = True
) -> tuple[PrimExpr, PrimExpr]:
    """A run of 8 six-bit codes a byte, in 6 integer ops: the uint32 words ``(even, odd)`` whose byte
    ``p`` holds code ``2p`` / ``2p + 1``, its low 5 bits at bits 2–6 and its sign (bit 5) at bit 7
    (bits 0–1 are garbage), for :func:`six_pair`. ``lo``: the low plane's word (byte ``p``: code
    ``2p``'s low 4 bits, then ``2p + 1``'s); ``hi``: the high plane, bits ``at .. at + 3`` of byte
    ``p`` holding the top 2 bits of codes ``2p`` and ``2p + 1`` (low bits first; its other bits
    anything); ``at``: 0 to 4 (a uint32 expression or an int)."""
    odd = hi << (u32(4) - at)  # (the even word's bits: 2 higher, a left shift on the FMA pipe)
    pick = lambda a, b: select(a, b, 0x3F3F3F3F, cuda)  # bits 0-5 of a byte from lo, 6-7 from hi  # noqa: E731
    return pick(lo << u32(2), odd << u32(2)), pick(lo >> u32(2), odd)


def six_high(word: PrimExpr, cuda: bool = True) -> PrimExpr:
    """The high (2-bit) plane's word of a run of 8 six-bit codes (code ``i``'s top 2 bits at bits
    ``2i``, zero-extended) as :func:`six_words` takes it (``at`` 0): nibble ``p`` in the low bits of
    byte ``p``, one shift and one ``prmt``."""
    return prmt(word, word >> u32(4), 0x5140, cuda)


def six_pair(
    fmt: Format, even: PrimExpr, odd: PrimExpr, pair: int, cuda: bool = True, dtype: str = "float16"
) -> PrimExpr:
    """:func:`decode_pair`'s ``dtype`` pair ``pair`` of a run of 8 six-bit float codes given a byte a
    code (:func:`six_words`' ``even`` and ``odd``), in 3 integer ops: one sign-replicating ``prmt``
    puts code ``2 pair`` (byte ``pair`` of ``even``) and ``2 pair + 1`` (of ``odd``) in the low bytes
    of the halves and their signs in all of the high bytes, a shift moves the 5 exponent and mantissa
    bits to the low end of the dtype's exponent field (and a sign copy to bit 15), a mask keeps those."""
    dest = MANT[dtype] - fmt.mbits  # the field's lowest bit
    sel = pair | (8 | pair) << 4 | (4 + pair) << 8 | (12 + pair) << 12
    return (prmt(even, odd, sel, cuda) << u32(dest - 2)) & _rep(0x8000 | 31 << dest)


CVT = {"mxfp8_e4m3": "e4m3x2", "mxfp8_e5m2": "e5m2x2"}  # PTX's packed fp8 pair of each format


def cvt_supported(fmt: Format, dtype: str) -> bool:
    """Whether ``dtype`` pairs of ``fmt`` come from one ``cvt.rn.f16x2.{e4m3x2,e5m2x2}`` (sm_89 and
    newer): the 8-bit float formats, every code exact in fp16 (:func:`cvt_pair`; bf16 pairs widen
    the fp16 pair, which bf16 holds exactly)."""
    return fmt.name in CVT and dtype in MANT


def cvt_pair(T, fmt: Format, dst, word: PrimExpr, half: int, dtype: str = "float16") -> None:  # noqa: N803
    """Emit into the IR builder ``T`` one ``cvt.rn.f16x2`` of the two codes in 16-bit ``half`` (0 low,
    1 high) of the uint32 ``word`` (low byte into the low half) into ``dst`` (a uint32 buffer
    element): the codes' true values in ``dtype`` (bf16: the fp16 pair widened, two more ``cvt`` and a
    ``prmt``), not :func:`decode_pair`'s ``1 / out_factor`` multiple (so its kernel's out factor is
    1, and no :func:`bf16_fma` follows), and e4m3's NaN codes NaN (:func:`decode_pair` decodes them
    as finite numbers)."""
    bits = tirx.Cast("uint16", word >> u32(16 * half) if half else word)
    T.evaluate(getattr(T.ptx.cvt.rn.f16x2, CVT[fmt.name])(dst, bits))
    if dtype == "bfloat16":
        T.buffer_store(dst.source, _half_to_bf16(dst, cuda=True), dst.indices)


def quad_supported(fmt: Format, dtype: str) -> bool:
    """Whether :func:`decode_quad` serves ``fmt`` in ``dtype``: 4-bit float codes (a word's 8 codes,
    its 4 pairs) into fp16."""
    return fmt.kind == "float" and fmt.bits == 4 and dtype == "float16" and supported(fmt, dtype)


def decode_quad(fmt: Format, word: PrimExpr, cuda: bool = True) -> list[PrimExpr]:
    """The 4 fp16 pairs of a uint32 ``word`` of 8 codes of ``fmt`` (:func:`quad_supported`; pair
    ``p``: the codes of byte ``p``, low nibble first): :func:`decode_pair`'s, 3 integer ops a pair
    (:func:`_sign_pair`; the byte-wise four-at-once decode this once was took more time)."""
    return [_sign_pair(fmt, lambda p, i: word, pair, cuda, "float16") for pair in range(4)]


@dataclass(frozen=True)
class Finish:
    """The exact ``fma.rn.bf16x2 d, a & ~sign, b, c | (a & sign)`` (bf16x2 words; d = a b + c) that
    finishes a :func:`decode_pair` ``a``. ``sign``: bits of ``a`` that select the addend (8-bit
    integer codes: the code's sign bit at bit 7 of each half, which turns ``-128`` into ``-256``)."""

    b: int
    c: int
    sign: int = 0

    def operands(self, a: PrimExpr) -> tuple[PrimExpr, PrimExpr, PrimExpr]:
        """(a, b, c) of the fma for the pair ``a`` (uint32)."""
        if not self.sign:
            return a, u32(self.b), u32(self.c)
        return a & u32(~self.sign & 0xFFFFFFFF), u32(self.b), a & u32(self.sign) | u32(self.c)


def bf16_fma(fmt: Format, dtype: str) -> Finish | None:
    """The :class:`Finish` of a :func:`decode_pair` of ``fmt`` in ``dtype``; None when the pair needs
    none. Floats: times ``2**112`` plus -0 (keeps -0); integers of ≤ 7 bits: times 1 minus the magic
    ``128 + 2**(bits-1)``; 8-bit integers (``128 + lo``, the sign at bit 7): times 1 minus 128, or 256
    where the sign bit is set."""
    if dtype != "bfloat16" or fmt.specials == "ieee":
        return None
    if fmt.kind == "float":
        return Finish(_bf16x2(2.0**112), _bf16x2(-0.0))
    if fmt.bits == 8:
        return Finish(_bf16x2(1.0), _bf16x2(-(2.0**7)), sign=0x00800080)
    return Finish(_bf16x2(1.0), _bf16x2(-(2.0**7 + 2 ** (fmt.bits - 1))))


def _bf16x2(x: float) -> int:
    """``x`` (exact in bf16) in both bf16 halves of a word: the top half of its fp32 bits."""
    top = struct.unpack("<I", struct.pack("<f", x))[0] >> 16
    return top | top << 16


def out_factor(fmt: Format) -> float:
    """What a sum of products with :func:`decode_pair` weights is multiplied by to be exact."""
    return 2.0 ** (-(fmt.bits - 2)) if fmt.kind == "int" else 2.0 ** (15 - fmt.bias)


def supported(fmt: Format, dtype: str = "float16") -> bool:
    """Whether every code of ``fmt`` decodes exactly into ``dtype`` pairs this way."""
    if fmt.kind == "int":
        return fmt.bits <= (10 if dtype == "float16" else 8)
    return fmt.ebits <= 5 and fmt.mbits <= MANT[dtype]


# ---- the block scale folded into the pair ------------------------------------------------------

_LOWEST_QUANTUM = {"float16": -24, "bfloat16": -133}  # log2 of the smallest subnormal
_LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
_EXP_BIAS = {"float16": 15, "bfloat16": 127}
_EXP_SHIFT = {"float16": 10, "bfloat16": 7}


@dataclass(frozen=True)
class Fold:
    """How a kernel multiplies a block's pairs by a power of two ``2**c`` that carries the block scale
    relative to its row's largest (``c = c0 + code - row max code``, exact for ``c`` in ``[c0 - spread,
    c0]``), so the mma accumulates scaled products directly and the row's ``2**(max - 127 - c0)``
    (with :func:`out_factor`) is applied once per output.

    The multiplier for code ``c`` of a row is ``c * mul + (offset + c0 - max) * mul`` (uint32: the
    exponent field in both 16-bit halves): fp16 pairs take it by one ``half2`` multiply; bf16 pairs by
    ``fma.rn.bf16x2(pair, multiplier, -0)``, which for float codes (``merged``) replaces
    :func:`bf16_fma`'s ``2**112`` (the offset then holds the 112)."""

    c0: int
    spread: int
    offset: int
    mul: int
    merged: bool


def fold(fmt: Format, dtype: str, true_values: bool = False) -> Fold | None:
    """The :class:`Fold` of ``fmt``'s pairs in ``dtype``, None where no exponent range is exact;
    ``true_values``: of pairs holding the elements themselves (:func:`cvt_pair`'s), not over
    :func:`out_factor`.

    ``c`` is exact where every code's pair (its element over :func:`out_factor`, specials decoded as
    ordinary codes; e5m2's inf/NaN stay so) times ``2**c`` is a ``dtype`` number: the largest under
    ``dtype``'s largest finite, the smallest step (the element's subnormal step) at least ``dtype``'s
    smallest subnormal; and where the multiplier is a normal number. fp16 takes ``c0`` at the top
    (e4m3: 22 binades of scales a row, e5m2 8, fp4 24); bf16 at 0, where no product can overflow
    float32 sooner than the unscaled one (118 binades or more)."""
    if not supported(fmt, dtype):
        return None
    if fmt.kind == "int":
        top, step = 2.0 ** (fmt.bits - 1), 1.0
    else:
        free = fmt.specials != "ieee"  # all-ones exponent codes decode as ordinary numbers
        exp_top = 2**fmt.ebits - 1 - fmt.bias if free else fmt.emax
        factor = 1.0 if true_values else out_factor(fmt)
        top = 2.0**exp_top * (2 - 2.0**-fmt.mbits) / factor
        step = fmt.min_subnormal / factor
    hi = math.floor(math.log2(_LARGEST[dtype] / top))
    lo = math.ceil(_LOWEST_QUANTUM[dtype] - math.log2(step))
    merged = dtype == "bfloat16" and bf16_fma(fmt, dtype) is not None and fmt.kind == "float"
    merged = merged and not true_values  # (true values: no finish to merge with)
    offset = _EXP_BIAS[dtype] + (112 if merged else 0)
    lo, hi = max(lo, 1 - offset), min(hi, 2 * _EXP_BIAS[dtype] - offset)  # a normal multiplier
    c0 = hi if dtype == "float16" else min(hi, 0)
    if c0 < lo:
        return None
    mul = (1 << _EXP_SHIFT[dtype]) * 0x10001
    return Fold(c0, c0 - lo, offset, mul, merged)


def vmaxu4(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """Byte-wise unsigned max of two uint32 words (CUDA ``__vmaxu4``)."""
    return tirx.call_pure_extern(U32, "__vmaxu4", a, b)


def vminu4(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """Byte-wise unsigned min of two uint32 words (CUDA ``__vminu4``)."""
    return tirx.call_pure_extern(U32, "__vminu4", a, b)


def fold_row(T, fold: Fold, hi, lo, idx: list) -> tuple[PrimExpr, PrimExpr, PrimExpr]:  # noqa: N803
    """Finish a row's scan of its E8M0 scale codes and give its fold (emitted into the IR builder
    ``T``): ``hi[idx]`` / ``lo[idx]``, a lane's byte-wise running max / min of the row's code words
    (:func:`vmaxu4` / :func:`vminu4`), become the row's largest / smallest code, combined over the quad's
    four lanes (which hold the same row). Returns whether the row folds (no NaN code, its codes
    within the fold's spread of its largest), its multiplier addend (:class:`Fold`) and its output
    exponent (``ldexpf``; :func:`out_factor`'s not included)."""
    shfl = lambda v, m: tirx.call_extern(U32, "__shfl_xor_sync", u32(0xFFFFFFFF), v, m)  # noqa: E731
    for buf, op in ((hi, vmaxu4), (lo, vminu4)):
        v = tirx.BufferLoad(buf, idx)
        T.buffer_store(buf, op(v, v >> u32(16)), idx)
        v = tirx.BufferLoad(buf, idx)
        T.buffer_store(buf, op(v, v >> u32(8)) & u32(255), idx)
        for m in (1, 2):
            v = tirx.BufferLoad(buf, idx)
            T.buffer_store(buf, op(v, shfl(v, m)), idx)
    top, bottom = tirx.BufferLoad(hi, idx), tirx.BufferLoad(lo, idx)
    good = tirx.And(top != u32(255), top - bottom <= u32(fold.spread))
    add = (u32(fold.offset + fold.c0) - top) * u32(fold.mul)
    return good, add, tirx.Cast("int32", top) - (127 + fold.c0)
