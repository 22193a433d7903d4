"""GPU rule ``mma``: tensor cores fed from registers for fp16 or bf16 activations at small and mid M
(buckets 1, 4, 16, 32, 64, 128, 256). This module is the policy (when it applies, the hint space, the
defaults, the cost model); the kernel and what its hints mean are :mod:`mxgemm.codegen.mma`.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from mxgemm import formats
from mxgemm.codegen import pairs
from mxgemm.codegen import target as targets
from mxgemm.codegen.mma import RING_SMEM, SM_SMEM, SMEM, STEP, Hints, kernel, smem_bytes
from mxgemm.layout import plane_widths
from mxgemm.rules.base import Rule, Scheduled, cheapest, cuda_linear, preferred, replaced

# M buckets this rule serves (128 and 256: only with activations in the ring, ``xs``; 256 with warps
# splitting M, ``mw``)
M_TILES = (1, 4, 16, 32, 64, 128, 256)


def fits(h: Hints, n: int, k: int) -> bool:
    """Whether ``h`` tiles an ``[n, k]`` weight (of any format: a step is 32 k of every plane)."""
    return n % (16 * h.nt * h.kn) == 0 and k % STEP == 0 and (k // STEP) % (h.kw * h.ks * h.unroll) == 0


def smem_fits(h: Hints, m_tile: int, bits: int = 8, ring_smem: int = RING_SMEM) -> bool:
    """Whether a block of ``h`` fits :data:`SMEM` static and ``ring_smem`` dynamic bytes."""
    static, dynamic = smem_bytes(h, m_tile, bits)
    return static <= SMEM and dynamic <= ring_smem


def valid(
    h: Hints, n: int, m_tile: int, fmt: formats.Format, block_size: int, ring_smem: int = RING_SMEM
) -> bool:
    """Whether ``h`` tiles N, fits the shared memory (:func:`smem_fits`: ``ring_smem`` dynamic bytes,
    :data:`RING_SMEM` or the arch's limit if lower) for ``fmt``'s codes,
    keeps the accumulators ≤ 64 registers and, with a ring, has one scale per step (and past 16
    rows, where the activations are loaded each iteration unless they ride the ring (``xs``), 4 steps
    and one warp a group: 8 would spill). ``xs`` only past 16 rows (up to 16 the activations always
    ride the ring), and past 64 rows only ``xs``; ``mw`` warps split the M tile's n8 tiles evenly."""
    xt_n = -(-m_tile // 8)
    if (h.xs and m_tile <= 16) or (m_tile > 64 and not h.xs) or xt_n % h.mw:
        return False
    return (
        n % (16 * h.nt * h.kn) == 0
        and smem_fits(h, m_tile, fmt.bits, ring_smem)
        and h.nt * xt_n // h.mw <= 16
        and not (h.stages and block_size != STEP)
        and not (m_tile > 16 and not h.xs and (h.unroll > 4 or h.kn > 1))
    )


def space(
    n: int, m_tile: int, fmt: formats.Format, block_size: int = STEP, ring_smem: int = RING_SMEM
) -> list[Hints]:
    """Every :func:`valid` hint set for N = ``n`` at ``m_tile`` rows (deterministic order)."""
    regs = itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (0,), (1,), (0,), (0, 1), (0,))
    regs = (p + (0, 1) for p in regs)
    rings = itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8), (4, 8), (2, 3, 4), (1, 2, 4, 8), (0, 1, 2), *((0, 1),) * 3, (1, 2, 4)
    )
    rings = (p for p in rings if p[7] or p[9] == 1)  # mw: with xs
    hints = (
        Hints(*p) for p in itertools.chain(regs, rings) if p[1] * p[4] * p[9] <= 16 and (p[7] or p[4] < 8)
    )
    return [h for h in hints if valid(h, n, m_tile, fmt, block_size, ring_smem)]


def one_wave(h: Hints, n: int, m_tile: int, bits: int, sms: int, sm_smem: int = SM_SMEM) -> int:
    """The blocks an SM (``Hints.minb``) that run the grid of ``h`` on ``n`` weight rows as one wave on
    ``sms`` SMs; 0 where that is one block an SM, or more threads, shared memory (``sm_smem`` an SM,
    1 KB of it reserved a block) or registers (under 64 a thread: spills) than an SM has."""
    per_sm = -(-(n // (16 * h.nt * h.kn) * h.ks) // sms)
    threads = 32 * h.kw * h.kn * h.mw
    block_smem = sum(smem_bytes(h, m_tile, bits)) + 1024
    fits = per_sm * threads <= 2048 and 65536 // (per_sm * threads) >= 64 and per_sm * block_smem <= sm_smem
    return per_sm if per_sm > 1 and fits else 0


def capped(h: Hints, m_tile: int, bits: int, sm_smem: int = SM_SMEM) -> int:
    """The blocks an SM (``Hints.minb``) that cap a thread's registers at 128 (twice the warps an SM
    of a kernel that needs 200): 0 where that is one block an SM, or their shared memory (``sm_smem``
    an SM, 1 KB of it reserved a block) would not let them in anyway. Offered at 4-32 rows: at 64 the
    capped kernels spill and took 0.22-0.37x the time (H200, ``tune-minb-cap-m4-64-f172481.jsonl``)."""
    blocks = 65536 // (128 * 32 * h.kw * h.kn * h.mw)
    return blocks if blocks > 1 and blocks * (sum(smem_bytes(h, m_tile, bits)) + 1024) <= sm_smem else 0


class Mma(Rule):
    """fp16 or bf16 activations, a bucket of :data:`M_TILES`, a format whose codes are exact in that
    dtype (:func:`mxgemm.codegen.pairs.supported`), one scale per step (block ≥ 32) and a shape some hints
    tile; programmatic dependent launch only on sm_90 and newer."""

    name = "mma"
    Hints = Hints
    structure = ("nt", "kw", "kn", "mw", "ks")
    retired = ("quad",)  # (fp4 into fp16 four pairs a word: the plain decode's kernel, retired 2026-11-29)

    @staticmethod
    def _serves(spec: Any) -> bool:
        ok = cuda_linear(spec, M_TILES) and spec.block_size >= STEP
        return ok and pairs.supported(formats.get(spec.fmt), spec.a_dtype)

    def candidates(self, spec: Any) -> list[Hints]:
        pdl = targets.sm_version(spec.target["arch"]) >= 90  # griddepcontrol
        ring = min(RING_SMEM, spec.target["max_shared_memory_per_block"])
        f = formats.get(spec.fmt)
        folds = pairs.fold(f, spec.a_dtype) is not None
        cands = space(spec.n, spec.m_bucket, f, spec.block_size, ring)
        cands = [h for h in cands if fits(h, spec.n, spec.k) and (pdl or not h.pdl) and (folds or not h.fold)]
        if pairs.cvt_supported(f, spec.a_dtype):  # (shl moot; not folded)
            cands += [dataclasses.replace(h, cvt=1) for h in cands if not (h.shl or h.fold)]
        sms, sm_smem = targets.sm_count(spec.target["arch"]), min(SM_SMEM, ring + 1024)
        waves = ((h, one_wave(h, spec.n, spec.m_bucket, f.bits, sms, sm_smem)) for h in cands if h.stages)
        waves = [(h, b) for h, b in waves if b]
        rings = [h for h in cands if h.stages and 1 < spec.m_bucket <= 32]  # (64 rows: spills, 0.22-0.37x)
        caps = ((h, capped(h, spec.m_bucket, f.bits, sm_smem)) for h in rings)
        cands += [dataclasses.replace(h, minb=b) for h, b in dict.fromkeys([*waves, *caps]) if b]
        # the scale table's bytes can take a candidate past the ring's shared memory
        tables = (dataclasses.replace(h, stab=1) for h in cands if h.stages)
        cands += [h for h in tables if smem_fits(h, spec.m_bucket, f.bits, ring)]
        if 4 in plane_widths(f.bits):  # a 4-bit plane's codes by ldmatrix
            cands += [dataclasses.replace(h, ldm=1) for h in cands if h.stages and not h.frag]
        # K split over a cluster, where the grid is under two blocks an SM (its blocks: the SMs' share)
        short = [h for h in cands if h.stages and not h.minb and spec.n // (16 * h.nt * h.kn) < 2 * sms]
        splits = (dataclasses.replace(h, ks=s) for h in short for s in (2, 4))
        return cands + [
            h for h in splits if fits(h, spec.n, spec.k) and smem_fits(h, spec.m_bucket, f.bits, ring)
        ]

    def cost(self, spec: Any, h: Hints) -> float:
        """≈ 24 KB of weight loads in flight per SM (Little's law at HBM3 latency), the cross-warp
        reduction, registers (accumulators grow with nt × the warp's share of the M tile, the
        register pipeline with unroll), and what the H100 and H200 explorations measured
        (``benchmarks/README.md``): rings beat the register pipeline, 8 steps a slot beat 4, two
        stages are enough once a slot holds 8 steps, and folded scales pay from 64 rows."""
        bits, m_tile = formats.get(spec.fmt).bits, spec.m_bucket
        sms = targets.sm_count(spec.target["arch"])
        blocks = spec.n // (16 * h.nt * h.kn) * h.ks
        warps = min(blocks * h.kw * h.kn, sms * 32)
        inflight = warps * 32 * 2 * bits * h.unroll * h.nt * max(1, h.stages - 1)
        starved = max(1.0, sms * 24 * 1024 / inflight)
        waves = -(-blocks // (sms * max(1, 16 // (h.kw * h.kn * h.mw))))
        regs = 1.0 + (0.03 if h.xs else 0.1) * max(0, h.nt * -(-m_tile // 8) // h.mw - 8)
        ring = 1.0 + 0.05 * (h.stages - 2) + 0.08 * (h.unroll == 4)
        measured = ring if h.stages else 1.15 + 0.05 * h.unroll
        # past 16 rows: activation bytes loaded per weight byte (a group of kn warps shares them with xs)
        acts = 0.0 if m_tile <= 16 else m_tile * 64 / (h.kn if h.xs else 1) / (h.nt * 64 * bits)
        # folded scales, measured on an H200 (tune-fold-*.md): 0.76-1.05x at 16 rows, 1.0-1.2x faster
        # at 64, 1.2-2.0x at 128
        fold = 1.0 if not h.fold else (1.05 if m_tile <= 16 else 0.9 if m_tile <= 64 else 0.75)
        base = starved * regs * measured * (1 + 0.02 * h.kw * h.ks) * (1 + 0.05 * (waves > 1))
        # fp4 into fp16 by the plain decode (the wgmma_w lean round's four pairs a word), one cvt a pair
        fewer = h.cvt or (not h.shl and pairs.quad_supported(formats.get(spec.fmt), spec.a_dtype))
        split = 1.1 if h.ks > 1 else 1.0  # (H200: 14 of 53 records faster split, most splits 0.66-0.99x)
        return base * (1 + 0.25 * acts) * fold * (0.95 if fewer else 1.0) * (1.01 if h.minb else 1.0) * split

    def twins(self, spec: Any, hints: Hints) -> list[Hints]:
        """``hints`` letting the next kernel in after its wait (``pdl`` 2, where it has 1), with the
        block scales folded (``fold``), a pair decoded by one ``cvt`` (``cvt``), its block scales
        made floats once a slot (``stab``), its 4-bit codes read by ``ldmatrix`` (``ldm``) and
        compiled to run its grid as one wave (``minb``, :func:`one_wave`), where those are
        candidates."""
        if not hints.stages:  # (a ring's options)
            return []
        options = [dict(pdl=2)] if hints.pdl == 1 else []
        options += [dict(fold=1), dict(cvt=1, shl=0), dict(stab=1), dict(ldm=1)]
        twins = [replaced(hints, **o) for o in options]
        cands = self.candidates(spec)
        twins += [h for h in cands if h.minb and dataclasses.replace(h, minb=0) == hints]
        return [t for t in dict.fromkeys(twins) if t is not None and t != hints and t in cands]

    def default_hints(self, spec: Any) -> Hints | None:
        """The first candidate of the arch's table row (``schedules/<arch>.json``: by M tile and 16-row
        weight tiles per SM) that fits, else the cheapest candidate by :meth:`cost`; None when nothing
        tiles the shape."""
        if not self._serves(spec):
            return None
        arch = spec.target["arch"]
        facts = {"m": spec.m_bucket, "tiles16_per_sm": (spec.n // 16) / targets.sm_count(arch)}
        cands = self.candidates(spec)
        row = preferred(self.name, arch, facts)
        prefs = [Hints(**p) for p in row["prefer"]] if row else []
        return next((h for h in prefs if h in cands), None) or cheapest(self, spec)

    def apply(self, spec: Any, make: Any, hints: Hints | None = None) -> Scheduled | None:
        """The kernel (:func:`mxgemm.codegen.mma.kernel`; ``make`` is not used: the kernel is written,
        not scheduled)."""
        del make
        h = hints if hints is not None else self.default_hints(spec)
        if h is None or not self._serves(spec) or h not in self.candidates(spec):
            return None
        import tvm

        f = formats.get(spec.fmt)
        args = dict(n=spec.n, k=spec.k, m_tile=spec.m_bucket, out_dtype=spec.out_dtype, bias=spec.bias)
        func = kernel(f, **args, block_size=spec.block_size, hints=h, a_dtype=spec.a_dtype)
        return Scheduled(self.name, tvm.IRModule({"main": func}), h)


RULE = Mma()
