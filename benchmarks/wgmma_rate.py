"""The tensor-core rate of Hopper's ``wgmma.mma_async`` fp16 → fp32 (``m64n{N}k16``, N the activation
rows of ``wgmma_w``'s M tile), alone and beside a decode's instruction stream. No loads: B (and for
SS, A) are shared tiles the descriptors read.

- ``rate_n{N}_d{depth}_w{wgs}[_dyn]``: a persistent grid (a block an SM) of ``wgs`` warpgroups, each
  issuing groups of 8 wgmmas into one accumulator with A from registers (RS, as ``wgmma_w``), each
  group committed and ``wait_group``-ed to ``depth - 1`` (the kernel's ``double``: depth 2); ``_dyn``:
  each wgmma's descriptor computed in ordinary registers and moved to uniform ones (``R2UR``), as
  ``wgmma_w``'s slot descriptors are. Timed by CUDA events.
- ``busy[_ss]_n{N}_a{alu}[_int|_f16]``: warpgroup 0 issues ``rate_n{N}_d2_w1``'s wgmmas (``_ss``: A from
  shared memory too) and counts its cycles while ``alu`` more warpgroups run a loop of the decode's
  ops until it is done: ``prmt``, shift, mask and an ``f16x2`` multiply a register (``_int``: the
  integer ops alone; ``_f16``: three ``f16x2`` multiplies; ``_prmt``, ``_lop``, ``_shf``: byte moves,
  masks or shifts; ``_cvt``: ``cvt.rn.f16x2.e4m3x2``; ``_dnow``: a word's 4 fp16 pairs of e2m1 codes
  as ``pairs._sign_pair`` decodes them, a sign-replicating ``prmt``, a shift and a mask a pair;
  ``_dnew``: the same pairs with the shifts taken out of the pairs, three a word: the word shifted
  left 4 and 1 merged by one ``lop3`` (each low code's sign to bit 7 of its byte, its exponent and
  mantissa to bits 1-3), the word and itself shifted right 3 likewise for the high codes, then a
  ``prmt`` (the two codes' bytes to the halves' high bytes) and a mask a pair; ``_dlut``: the same
  pairs without a shift, by a byte table (:data:`DECODES` ``lut``); ``_iadd``: 3-input adds). The busy
  warps' loop trips a kilocycle come with the rows (block 0's thread 128).
- ``fused_n{N}_w{wgs}_{dec}``: the shape of ``wgmma_w``'s compute warpgroups: each warpgroup decodes a
  slot's 8 words of e2m1 codes a thread (:data:`DECODES`: none, ``pairs._sign_pair``'s, the byte
  table's) and folds them into 32 fragment registers, issues its 8 wgmmas on them, commits and waits
  for the group before (two fragment sets in turn); cycles a slot per warpgroup.

Build here (nvcc), run on the GPU (torch and the CUDA driver through ctypes; no TVM)::

    python benchmarks/wgmma_rate.py build OUT_DIR
    python benchmarks/wgmma_rate.py run OUT_DIR [--only busy] > wgmma-rate.jsonl
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import subprocess
from pathlib import Path

NS = (64, 128, 256)
WGS = (1, 2, 3)
DEPTHS = (1, 2)
GROUP = 8  # wgmmas a commit group (a ring slot of ``wgmma_w``: 4 scale steps × 2)


def source(n: int, depth: int, wgs: int, dyn: bool = False) -> str:
    """CUDA source of kernel ``rate_n{n}_d{depth}_w{wgs}[_dyn](float *out, int groups)``; ``dyn``: each
    wgmma's descriptor computed in ordinary registers from the group's index (as ``wgmma_w``'s slot
    descriptors are), which ptxas moves to uniform registers (``R2UR``) before each wgmma."""
    regs = n // 2
    d_ops = ", ".join(f"%{i}" for i in range(regs))
    a_ops = ", ".join(f"%{regs + i}" for i in range(4))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    asm = (
        f'asm volatile("{{ wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{d_ops}}}, {{{a_ops}}}, '
        f'%{regs + 4}, 1, 1, 1, 0; }}" : {outs} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(DESC));'
    )
    asm = asm.replace("DESC", f"dyn0 + ((g & 1) * {2 * n} + w * 2)" if dyn else "desc")
    name = f"rate_n{n}_d{depth}_w{wgs}" + ("_dyn" if dyn else "")
    return f"""
extern "C" __global__ void __launch_bounds__({128 * wgs}, 1) {name}(float *out, int groups) {{
  __shared__ alignas(1024) unsigned short b[4 * 16 * {n}];  // (dyn: descriptors up to 2 tiles on)
  for (int i = threadIdx.x; i < 4 * 16 * {n}; i += blockDim.x) b[i] = 0x3c00;
  __syncthreads();
  unsigned addr = (unsigned)__cvta_generic_to_shared(b);
  unsigned long long lbo = {n} / 8 * 128 >> 4, desc = ((addr & 0x3FFFF) >> 4) | (lbo << 16) | (8ull << 32);
  unsigned long long dyn0 = desc + (threadIdx.x & 0x200);  // (0 for every thread: ptxas cannot tell)
  unsigned a[4] = {{0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u}};
  float d[{regs}];
  for (int i = 0; i < {regs}; ++i) d[i] = 0.f;
  for (int g = 0; g < groups; ++g) {{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    #pragma unroll
    for (int w = 0; w < {GROUP}; ++w) {{ {asm} }}
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned {depth - 1};" ::: "memory");
  }}
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  float s = 0.f;
  for (int i = 0; i < {regs}; ++i) s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}}
"""


def _ss(code: str, n: int) -> str:
    """``code`` (of :func:`source`) with A read from shared memory too (``wgmma`` SS: a 64 × 16 tile
    beside B's, by a descriptor) instead of registers."""
    regs = n // 2
    a_ops = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
    code = code.replace(f"{a_ops}, %{regs + 4}, 1, 1, 1, 0;", f"%{regs}, %{regs + 1}, 1, 1, 1, 0, 0;")
    code = code.replace('"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)', '"l"(desc_a), "l"(desc)')
    at = f"addr + {64 * n}"  # (A's tile: 2 KB, two of B's 32 N bytes on)
    desc_a = f"((({at}) & 0x3FFFF) >> 4) | (64ull << 16) | (8ull << 32)"
    return code.replace("  unsigned a[4] =", f"  unsigned long long desc_a = {desc_a};\n  unsigned a[4] =")


ALU_OPS = {  # the busy warpgroups' loop body, per register: the decode's ops, or one kind of them
    "": "y = __byte_perm(x[i] << 4, x[i], 0xc480 + r); y = (y << 5) & 0x8e008e00u; HMUL",
    "_int": "y = __byte_perm(x[i] << 4, x[i], 0xc480 + r); y = (y << 5) & 0x8e008e00u;",
    "_f16": "y = x[i]; HMUL HMUL HMUL",
    "_prmt": "y = __byte_perm(x[i], x[i] >> 1, 0xc480 + r); y = __byte_perm(y, x[i], 0x3210 + r);",
    "_lop": "y = (x[i] & 0x8e008e00u) | r; y = (y ^ 0x12345678u) & x[i];",
    "_shf": "y = (x[i] << 5) + (x[i] >> 3); y = (y << 2) + (y >> 7);",
    "_dnow": "unsigned a = x[i] << 4; y = 0; PAIRS_NOW",
    "_dnew": "unsigned a = x[i] << 4, b = x[i] << 1, c = x[i] >> 3; "
    "unsigned u = (a & 0x80808080u) | (b & 0x7f7f7f7fu), t = (x[i] & 0x80808080u) | (c & 0x7f7f7f7fu); "
    "y = 0; PAIRS_NEW",
    "_iadd": "y = x[i] + (x[i] ^ r) + r; y = y + x[i] + 0x1234u;",
    "_dlut": "y = 0; PAIRS_LUT",
    "_cvt": 'asm volatile("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" '
    ': "=r"(y) : "r"(x[i]));',
}


def source_alu(n: int, alu_wgs: int, ss: bool = False, ops: str = "") -> str:
    """Kernel ``busy_n{n}_a{alu_wgs}(float *out, int groups)``: warpgroup 0 issues the wgmmas of
    ``rate_n{n}_d2_w1`` and records its cycles (``out[0]``, as a float) while ``alu_wgs`` more
    warpgroups run a decode-like integer and ``f16x2`` loop until it is done: the wgmma rate beside
    the decode's instruction stream (their A operands are registers)."""
    body = source(n, 2, 1).split("{", 1)[1]  # (reuse the wgmma loop; re-headed below)
    body = _ss(body, n) if ss else body
    loop = body[body.index("  for (int g = 0;") : body.index("  float s = 0.f;")]
    prologue = body[: body.index("  for (int g = 0;")]
    bounds = f"__launch_bounds__({128 * (1 + alu_wgs)}, 1)"
    hmul = 'asm volatile("mul.rn.f16x2 %0, %0, %1;" : "+r"(y) : "r"(h));'
    # a word's 4 fp16 pairs of e2m1 codes: as `pairs._sign_pair` decodes them (a sign-replicating prmt,
    # a shift, a mask), and by byte moves alone once a word's three shifted copies are merged
    srep = 'asm("prmt.b32 %0, %1, %2, %3;" : "=r"(z) : "r"(a), "r"(x[i]), "r"({sel}));'
    now = [srep.format(sel=p | (8 | p) << 4 | (4 + p) << 8 | (12 + p) << 12) for p in range(4)]
    pairs_now = " ".join(
        f"{{ unsigned z; {c} z = (z << 5) & 0x8e008e00u; {hmul.replace('(y)', '(z)')} y ^= z; }}" for c in now
    )
    mul_z = hmul.replace("(y)", "(z)")
    pairs_new = " ".join(
        f"{{ unsigned z = __byte_perm(u, t, {p << 4 | (4 + p) << 12}) & 0x8e008e00u; {mul_z} y ^= z; }}"
        for p in range(4)
    )
    pairs_lut = "unsigned wh = __byte_perm(x[i], 0, 0x3232); " + " ".join(
        f"{{ unsigned s = {src}, m, g; {_lut('s')}"
        + " ".join(
            f"{{ unsigned z = __byte_perm(m, 0, {c}); {mul_z} y ^= z; }}" for c in ("0x1404", "0x3424")
        )
        + " }"
        for src in ("x[i]", "wh")
    )
    body_ops = (
        ALU_OPS[ops].replace("HMUL", hmul).replace("PAIRS_NOW", pairs_now).replace("PAIRS_NEW", pairs_new)
    ).replace("PAIRS_LUT", pairs_lut)
    return f"""
extern "C" __global__ void {bounds} busy{"_ss" if ss else ""}_n{n}_a{alu_wgs}{ops}(float *out, int groups) {{
  __shared__ volatile int done;
  if (threadIdx.x == 0) done = 0;
{prologue}
  if (threadIdx.x < 128) {{
    long long t0 = clock64();
{loop}
    long long t1 = clock64();
    __syncwarp();
    if (threadIdx.x == 0) {{ out[blockIdx.x] = (float)(t1 - t0); done = 1; }}
    float s = 0.f;
    for (int i = 0; i < {n // 2}; ++i) s += d[i];
    out[gridDim.x + blockIdx.x * blockDim.x + threadIdx.x] = s;
  }} else {{
    unsigned x[16];
    for (int i = 0; i < 16; ++i) x[i] = threadIdx.x * (i + 1);
    unsigned h = 0x3c003c00u;
    long long it = 0;
    while (!done) {{
      ++it;
      #pragma unroll
      for (int r = 0; r < 8; ++r) {{
        #pragma unroll
        for (int i = 0; i < 16; ++i) {{
          unsigned y;
          {body_ops}
          x[i] ^= y;
        }}
      }}
    }}
    unsigned t = 0;
    for (int i = 0; i < 16; ++i) t ^= x[i];
    if (t == 0x12345678u) out[0] = 0.f;  // (keeps the loop)
    out[gridDim.x + blockIdx.x * blockDim.x + threadIdx.x] = (float)it;
  }}
}}
"""


ASM_PRMT = 'asm("prmt.b32 %0, %1, %2, %3;" : "=r"({d}) : "r"({a}), "r"({b}), "r"({s})); '


def _lut(s: str) -> str:
    """C statements that look a half-word ``s``'s 4 e2m1 codes up in a byte table: their magnitudes
    (``em << 1``) by a prmt of the sign-masked selector, their signs by a sign-replicating prmt (0x80
    / 0xFF) made 0x80 by a mask and a 3-input add; ``m`` then holds the 4 codes' fp16 high bytes."""
    return (
        ASM_PRMT.format(d="m", a="0x06040200u", b="0x0E0C0A08u", s=f"{s} & 0x7777u")
        + ASM_PRMT.format(d="g", a="0x80808080u", b="0x80808080u", s=s)
        + "g &= 0x40404040u; m = m + g + g; "
    )


_HALVES = "unsigned s[2] = {w, __byte_perm(w, 0, 0x3232)}; for (int h = 0; h < 2; ++h) { unsigned m, g; "
_CVT_E5M2 = (
    'asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.rn.f16x2.e5m2x2 %0, lo; '
    'cvt.rn.f16x2.e5m2x2 %1, hi; }" : "=r"(p[2 * h]), "=r"(p[2 * h + 1]) : "r"(m)); '
)
DECODES = {  # a word ``w`` of 8 e2m1 codes into the 4 fp16 pairs ``p[0..3]`` (``fused_*`` kernels)
    "none": "p[0] = w; p[1] = w; p[2] = w; p[3] = w;",
    # pairs._sign_pair: a sign-replicating prmt, a shift and a mask a pair (one more shift a word)
    "now": "{ unsigned a = w << 4; "
    + " ".join(
        ASM_PRMT.format(d=f"p[{q}]", a="a", b="w", s=q | (8 | q) << 4 | (4 + q) << 8 | (12 + q) << 12)
        + f"p[{q}] = (p[{q}] << 5) & 0x8e008e00u;"
        for q in range(4)
    )
    + " }",
    # the byte table, then two prmts spread each half's 4 bytes into the pairs' high bytes: no shift
    "lut": "{ "
    + _HALVES
    + _lut("s[h]")
    + "p[2 * h] = __byte_perm(m, 0, 0x1404); p[2 * h + 1] = __byte_perm(m, 0, 0x3424); } }",
    # the same, each half's 4 bytes spread by a cvt of e5m2 pairs (fp16's high bytes) instead
    "lutcvt": "{ " + _HALVES + _lut("s[h]") + _CVT_E5M2 + "} }",
}


def source_fused(n: int, wgs: int, dec: str) -> str:
    """Kernel ``fused_n{n}_w{wgs}_{dec}(float *out, int groups)``: ``wgs`` warpgroups, each as
    ``wgmma_w``'s compute warpgroups run a slot: 8 words of e2m1 codes decoded (``DECODES[dec]``) and
    folded (an ``f16x2`` multiply a pair) into 32 fragment registers, then 8 wgmmas with A from them,
    committed, the group before waited for; two fragment sets in turn. No loads. Each warpgroup's
    cycles to ``out[block * wgs + wg]``."""
    regs = n // 2
    d_ops = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a_ops = ", ".join(f"%{regs + i}" for i in range(4))

    def wg(buf: str, w: int) -> str:
        ins = ", ".join(f'"r"({buf}[{4 * w + i}])' for i in range(4))
        return (
            f'asm volatile("{{ wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{d_ops}}}, {{{a_ops}}}, '
            f'%{regs + 4}, 1, 1, 1, 0; }}" : {outs} : {ins}, "l"(desc));'
        )

    hmul = 'asm("mul.rn.f16x2 %0, %1, %2;" : "=r"({d}) : "r"({p}), "r"(hm));'

    def half(buf: str) -> str:
        dec_words = "\n".join(
            f"    {{ unsigned w = x[{i}] ^ (unsigned)g, p[4]; {DECODES[dec]} "
            + " ".join(hmul.format(d=f"{buf}[{4 * i + q}]", p=f"p[{q}]") for q in range(4))
            + " }"
            for i in range(8)
        )
        wgmmas = "\n".join(f"    {wg(buf, w)}" for w in range(8))
        return (
            f"{dec_words}\n"
            '    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");\n'
            f"{wgmmas}\n"
            '    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");\n'
            '    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");\n'
        )

    return f"""
extern "C" __global__ void __launch_bounds__({128 * wgs}, 1)
fused_n{n}_w{wgs}_{dec}(float *out, int groups) {{
  __shared__ alignas(1024) unsigned short b[4 * 16 * {n}];
  for (int i = threadIdx.x; i < 4 * 16 * {n}; i += blockDim.x) b[i] = 0x3c00;
  __syncthreads();
  unsigned addr = (unsigned)__cvta_generic_to_shared(b);
  unsigned long long lbo = {n} / 8 * 128 >> 4, desc = ((addr & 0x3FFFF) >> 4) | (lbo << 16) | (8ull << 32);
  unsigned x[8];
  for (int i = 0; i < 8; ++i) x[i] = (threadIdx.x + 1) * (i + 1) * 0x9E3779B9u;
  unsigned hm = 0x3c003c00u ^ (threadIdx.x >> 12), a0[32], a1[32];
  float d[{regs}];
  for (int i = 0; i < {regs}; ++i) d[i] = 0.f;
  long long t0 = clock64();
  for (int g = 0; g < groups; g += 2) {{
{half("a0")}{half("a1").replace("(unsigned)g", "(unsigned)(g + 1)")}  }}
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < {regs}; ++i) s += d[i];
  if (threadIdx.x % 128 == 0) out[blockIdx.x * {wgs} + threadIdx.x / 128] = (float)(t1 - t0);
  out[gridDim.x * {wgs} + blockIdx.x * blockDim.x + threadIdx.x] = s;
}}
"""


FUSED = [(64, w, d) for w in (1, 2) for d in DECODES] + [(128, 2, d) for d in DECODES]


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    code = "\n".join(source(*c) for c in itertools.product(NS, DEPTHS, WGS))
    code += "\n".join(source(64, 2, w, dyn=True) for w in (1, 2))
    code += "\n".join(source_alu(n, a, ss) for n in (64, 128, 256) for a in (0, 1, 2) for ss in (False, True))
    code += "\n".join(
        source_alu(64, a, ss, ops) for a in (1, 2) for ss in (False, True) for ops in ("_int", "_f16")
    )
    code += "\n".join(
        source_alu(64, a, False, ops) for a in (1, 2) for ops in ("_prmt", "_lop", "_shf", "_cvt")
    )
    code += "\n".join(source_alu(64, a, False, ops) for a in (0, 1, 2) for ops in ("_dnow", "_dnew", "_dlut"))
    code += "\n".join(source_alu(64, a, False, "_iadd") for a in (1, 2))
    code += "\n".join(source_fused(*c) for c in FUSED)
    (out / "rate.cu").write_text(code)
    cmd = ["nvcc", "-cubin", "-O3", "-arch=sm_90a", "-o", str(out / "rate.cubin"), str(out / "rate.cu")]
    subprocess.run(cmd, check=True)


def run_busy(cuda, mod, sms: int, stream, groups: int, only: str) -> None:
    """The ``busy_*`` kernels: warpgroup 0's wgmma rate from its own cycle count, at the SM clock."""
    import torch

    clock = torch.cuda.clock_rate() * 1e6 if hasattr(torch.cuda, "clock_rate") else 1.98e9
    cases = [(*c, "") for c in itertools.product((64, 128, 256), (0, 1, 2), ("", "_ss"))]
    cases += [(64, *c) for c in itertools.product((1, 2), ("", "_ss"), ("_int", "_f16"))]
    cases += [(64, *c) for c in itertools.product((1, 2), ("",), ("_prmt", "_lop", "_shf", "_cvt"))]
    cases += [(64, *c) for c in itertools.product((1, 2), ("",), ("_dnow", "_dnew", "_dlut", "_iadd"))]
    for n, alu, ss, ops in cases:
        name = f"busy{ss}_n{n}_a{alu}{ops}"
        if only not in name:
            continue
        fn = ctypes.c_void_p()
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0
        buf = torch.zeros(sms + sms * 384, device="cuda")
        ptr, g = ctypes.c_void_p(buf.data_ptr()), ctypes.c_int(groups)
        args = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(g))
        for _ in range(3):
            assert cuda.cuLaunchKernel(fn, sms, 1, 1, 128 * (1 + alu), 1, 1, 0, stream, args, None) == 0
        torch.cuda.synchronize()
        cycles = float(buf[:sms].median())
        flops = 2 * 64 * n * 16 * GROUP * groups  # a block's warpgroup 0
        row = {
            "n": n,
            "a": "shared" if ss else "registers",
            "alu_warpgroups": alu,
            "alu_ops": ops or "decode",
        }
        row["cycles"] = cycles
        if alu:  # the busy warps' loop trips (each: 8 × 16 registers' ops) a cycle, block 0's thread 128
            row["alu_trips_per_kcycle"] = round(float(buf[sms + 128]) / cycles * 1e3, 2)
        row["tflops_at_1.98ghz"] = round(flops / cycles * 1.98e9 * sms / 1e12, 1)
        row["clock_hz"] = clock
        print(json.dumps(row), flush=True)


def run_fused(cuda, mod, sms: int, stream, groups: int, only: str) -> None:
    """The ``fused_*`` kernels: cycles a slot (8 words decoded a thread, 8 wgmmas) per warpgroup."""
    import torch

    for n, wgs, dec in FUSED:
        name = f"fused_n{n}_w{wgs}_{dec}"
        if only not in name:
            continue
        fn = ctypes.c_void_p()
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0
        buf = torch.zeros(sms * wgs + sms * 128 * wgs, device="cuda")
        ptr, g = ctypes.c_void_p(buf.data_ptr()), ctypes.c_int(groups)
        args = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(g))
        for _ in range(3):
            assert cuda.cuLaunchKernel(fn, sms, 1, 1, 128 * wgs, 1, 1, 0, stream, args, None) == 0
        torch.cuda.synchronize()
        cycles = float(buf[: sms * wgs].median())
        flops = 2 * 64 * n * 16 * GROUP * groups * wgs
        row = {"n": n, "warpgroups": wgs, "decode": dec, "cycles_per_slot": round(cycles / groups, 1)}
        row["tflops_at_1.98ghz"] = round(flops / cycles * 1.98e9 * sms / 1e12, 1)
        print(json.dumps(row), flush=True)


def run(out: Path, groups: int = 2000, only: str = "") -> None:
    import torch

    cuda = ctypes.CDLL("libcuda.so.1")
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context, current
    mod = ctypes.c_void_p()
    image = (out / "rate.cubin").read_bytes()
    assert cuda.cuModuleLoadData(ctypes.byref(mod), image) == 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.empty(sms * 384, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    run_busy(cuda, mod, sms, stream, groups, only)
    run_fused(cuda, mod, sms, stream, groups, only)
    cases = [(*c, "") for c in itertools.product(NS, DEPTHS, WGS)] + [(64, 2, w, "_dyn") for w in (1, 2)]
    for n, depth, wgs, dyn in cases:
        fn = ctypes.c_void_p()
        name = f"rate_n{n}_d{depth}_w{wgs}{dyn}"
        if only not in name:
            continue
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0
        ptr, g = ctypes.c_void_p(buf.data_ptr()), ctypes.c_int(groups)
        args = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(g))

        def launch(fn=fn, args=args, wgs=wgs):
            rc = cuda.cuLaunchKernel(fn, sms, 1, 1, 128 * wgs, 1, 1, 0, stream, args, None)
            assert rc == 0, rc

        launch()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            launch()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) * 1e-3)
        flops = 2 * 64 * n * 16 * GROUP * groups * wgs * sms
        row = {"n": n, "depth": depth, "warpgroups": wgs, "descriptor": "registers" if dyn else "constant"}
        row |= {"us": round(best * 1e6, 1), "tflops": round(flops / best / 1e12, 1)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=("build", "run"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="", help="run the kernels whose name holds this (e.g. _dyn, n64_d2)")
    args = ap.parse_args()
    build(args.out) if args.cmd == "build" else run(args.out, only=args.only)
