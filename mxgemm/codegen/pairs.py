"""Two codes per integer op: MX/BFP element codes → fp16 pairs (``half2`` bits in a uint32), the A
operand of ``mma.sync`` straight from registers.

A pair's two codes are moved to the same offset of the two 16-bit halves of a word (one ``prmt``),
so every shift and mask decodes both (the SIMD-within-a-register trick of FasterTransformer and Marlin).
Float codes: sign to bit 15, exponent and mantissa to the low end of the fp16 exponent field and the
top of its mantissa, which is the value times ``2**(bias - 15)`` (subnormals map to fp16 subnormals,
ebits ≤ 5 and mbits ≤ 10 for every format); :func:`out_factor` undoes it once per output. Integer
codes: ``code ^ 2**(bits-1)`` in the mantissa of 1024.0 is ``1024 + 2**(bits-1) + q``; one exact
half2 subtraction gives ``q``, and :func:`out_factor` applies ``2**-(bits-2)``.

``left``: the pair goes to the byte lane from which every field moves left. ptxas issues a left shift
as ``IMAD.SHL`` on the FMA pipe, a right one as ``SHF`` on the ALU pipe, where the ring kernels'
decode is the busiest pipe; which is faster depends on the kernel (a tuning hint of the ``mma`` rule).
"""

from __future__ import annotations

from collections.abc import Callable

from tvm import tirx
from tvm.ir import Expr as PrimExpr

from mxgemm.codegen.decode import U32, u32
from mxgemm.formats import Format
from mxgemm.layout import plane_widths


def _rep(mask16: int) -> PrimExpr:
    """A 16-bit mask in both halves of a uint32."""
    return u32(mask16 | mask16 << 16)


def _shift(x: PrimExpr, s: int) -> PrimExpr:
    return x if s == 0 else (x << u32(s) if s > 0 else x >> u32(-s))


def prmt(a: PrimExpr, b: PrimExpr, sel: int, cuda: bool) -> PrimExpr:
    """PTX ``prmt`` (CUDA ``__byte_perm``): byte ``i`` of the result is byte ``sel >> 4i & 7`` of the
    8 bytes ``b:a``. One instruction on CUDA; shifts and masks elsewhere (the CPU tests)."""
    if cuda:
        return tirx.call_pure_extern(U32, "__byte_perm", a, b, u32(sel))
    out = None
    for i in range(4):
        src = sel >> 4 * i & 7
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


def decode_pair(
    fmt: Format, word: Callable[[int, int], PrimExpr], pair: int, cuda: bool = True, left: bool = False
) -> PrimExpr:
    """uint32 bits of the fp16 pair of codes ``2 pair`` and ``2 pair + 1`` (low and high half) of a
    run of 8 codes of ``fmt``, given as their bit planes (:func:`mxgemm.layout.plane_widths`, low
    bits first): ``word(plane, i)`` is uint32 word ``i`` of the plane's ``w`` bytes (little endian;
    two words for 8-bit planes, else one, zero-extended). ``cuda``: ``prmt`` as one instruction;
    ``left``: fields moved by left shifts where the lanes allow it (the same bits).
    """
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
            dest = off + 10 - fmt.mbits
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
    biased = (bits ^ _rep(half)) | _rep(0x6400)  # 1024 + half + q in each fp16 lane
    magic = tirx.Broadcast(tirx.const(1024.0 + half, "float16"), 2)
    return tirx.reinterpret(U32, tirx.reinterpret("float16x2", biased) - magic)


def out_factor(fmt: Format) -> float:
    """What a sum of products with :func:`decode_pair` weights is multiplied by to be exact."""
    return 2.0 ** (-(fmt.bits - 2)) if fmt.kind == "int" else 2.0 ** (15 - fmt.bias)


def supported(fmt: Format) -> bool:
    """Whether every code of ``fmt`` decodes exactly into fp16 this way."""
    return fmt.kind == "int" and fmt.bits <= 10 or fmt.kind == "float" and fmt.ebits <= 5 and fmt.mbits <= 10
