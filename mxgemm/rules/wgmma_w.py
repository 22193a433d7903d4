"""GPU rule ``wgmma_w``: Hopper's wgmma fed from registers for fp16 or bf16 activations at mid M (buckets
32, 64, 128, 256, 384 ... 1024 in steps of 128 rows, 2048 and 4096, which decode + cuBLAS serves
untuned). Not routed untuned: it runs where the tune log names it, the tuner measuring it beside the
``mma`` rule (up to 256 rows) and decode + cuBLAS (on an H200 it won 12 of 24 tasks at 64 rows, 16
of 24 at 128 and none at 256: ``benchmarks/results/NVIDIA_H200/tune-wgmma_w-r2-6cd8000.md``; on an
H100, past 256 rows, the best candidate at each M beat decode + cuBLAS in 44 of 56 cells of 7 shapes,
a record chosen at 1024 rows alone in far fewer: ``msweep-m257-1024-float16-a20512b.jsonl``, hence
the 128-row buckets). This module is the policy; the kernel and what its hints mean are
:mod:`mxgemm.codegen.wgmma_w`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from mxgemm import formats
from mxgemm.codegen import pairs
from mxgemm.codegen import target as targets
from mxgemm.codegen.shapes import WIDE_M_BUCKETS
from mxgemm.codegen.wgmma_w import BK, M_TILES, PROD, SK, SPLITS, TMA, Hints, applies, kernel
from mxgemm.rules.base import Rule, Scheduled, cheapest, cuda_linear, replaced

BUCKETS = (32, 64, 128, 256, *WIDE_M_BUCKETS)


class WgmmaW(Rule):
    """sm_90 (the kernel is compiled for sm_90a), fp16 or bf16 activations, a bucket of
    :data:`BUCKETS`, codes in planes of 2, 4 or 8 bits (6-bit codes: 4 and 2) whose block scales fold
    into the activations' dtype (:func:`mxgemm.codegen.wgmma_w.applies`), blocks of 32."""

    name = "wgmma_w"
    Hints = Hints
    routed = False
    structure = ("wg", "mt", "splits", "sk", "cluster", "bk")

    @staticmethod
    def _serves(spec: Any) -> bool:
        return (
            cuda_linear(spec, BUCKETS)
            and targets.sm_version(spec.target["arch"]) == 90
            and spec.block_size == 32
        )

    def candidates(self, spec: Any) -> list[Hints]:
        """Every hint set whose M tile is at most the bucket, that tiles the shape and fits the
        shared memory, split K only while the halved split's grid is short of :func:`_slots` (its
        parts added by a second kernel, or for 2 splits in a cluster's shared memory; past 256 rows
        also where two splits in a cluster fill the last wave better, :func:`_evens`), TMA and
        stream-K on the mbarrier ring, stream-K unsplit (deterministic order), warp 0 or a producer
        warpgroup refilling the ring where TMA loads it (the producer: 1 or 2 others), the ring's first
        loads before the scale scan or after it (``early``; stream-K: before), with programmatic
        dependent launch or without (``pdl``; stream-K: without); 128- and 256-row tiles with codes by
        TMA also in 4-8 slots of 64 K (``bk``)."""
        if not self._serves(spec):
            return []
        f = formats.get(spec.fmt)
        tiles = ((1, 2, 4), (3, 4, 5, 6, 8), (1, 0), M_TILES, SPLITS)
        space = itertools.product(*tiles, (0, 1), TMA, SK, PROD, (1, 0, 2), (BK, BK // 2))
        slots = lambda p: (  # noqa: E731  (6 slots of 128 K: small M tiles; 64 K: wide tiles by TMA)
            (p[1] < 6 or p[3] <= 32) and p[1] < 8 if p[10] == BK else p[1] > 3 and p[3] >= 128 and p[6] == 2
        )
        ok = lambda p: (  # noqa: E731
            p[3] <= spec.m_bucket
            and slots(p)
            and (p[5] or not p[6])
            and (not p[7] or (p[5] and p[4] == 1))
            and (not p[8] or p[6] == 2)
            and (p[8] < 2 or p[0] <= 2)
        )
        hints = (
            Hints(*p[:10], cluster=c, early=e, pdl=d, bk=p[10])
            for p in space
            if ok(p)
            for c in ((0, 1) if p[4] == 2 else (0,))
            for e in ((0,) if p[7] else (0, 1))
            for d in ((0,) if p[7] else (0, 1, 2))
        )
        cands = [
            h
            for h in hints
            if (h.splits == 1 or _blocks(spec, h) * (h.splits // 2) < _slots(spec, h) or _evens(spec, h))
            and applies(f, spec.n, spec.k, spec.a_dtype, h) is None
        ]
        cvt = pairs.cvt_supported(f, spec.a_dtype)  # (one cvt a pair of 8-bit float codes)
        return cands + [dataclasses.replace(h, cvt=1) for h in cands] if cvt else cands

    def cost(self, spec: Any, h: Hints) -> float:
        """What the H200 tuning measured (``tune-wgmma_w-r1-cdcc9f8.jsonl``: 8 shapes × 64 and 128 rows,
        mxfp4 and mxfp8_e4m3): the rule won 31 of 48 tasks, with small blocks, one warpgroup × 64
        activation rows (2 blocks an SM; 128 rows run as two M tiles) in 21 of them, two warpgroups ×
        128 rows in 7; two fragment sets and 4 slots beat one and 3 or 5. Times a grid short of
        :func:`_slots` (it idles SMs) and 5% a split (the partial sums' round trip). The mbarrier ring
        (``ring`` 1) took 0.88-0.91x the time with two warpgroups × 128 rows and 1.07-1.19x with one
        × 64; on the H100, two × 128 beat one × 64 at 128-1024 rows on 28672×8192 (hence 1.1 for
        128-row tiles, not the H200's 1.15; ``wgmma_w-probes-*.jsonl``). Loads by TMA (``tma`` 1: the
        activations, 2: the codes too) took 0.87x and 0.84x the ring's time with two warpgroups × 128
        rows at 128-4096 rows on the H100 (5 slots: 1.09x tma 2's time), and nothing off one warpgroup
        × 64 (``wgmma_w-tma-*.jsonl``). Two warpgroups × 256 rows (3 slots) took 0.77x the time of ×
        128 at 256 rows on 28672×8192, 0.74-0.79x at 512-4096 rows (``wgmma_w-mt256-*.jsonl``).
        A grid of a block a tile takes its waves whole (224 blocks on 132 SMs: 2 waves for 1.7 waves'
        work, 1.18x); stream-K takes the work alone, plus 3% (its loop and the shared tiles' fixup),
        5% more where its grid is not the blocks an SM holds. Warp 0 alone refilling the ring (``prod``
        1) took 0.91-0.95x the time with two warpgroups × 256 rows at 256 and 1024 rows on 28672×8192
        and 8192², 0.97x with × 128 at 128 rows, nothing off stream-K; a producer warpgroup (``prod``
        2) 0.89-0.94x and 0.90x, and one warpgroup × 64 rows at 64 rows on 4096×14336 0.55x warp 0's
        time (``wgmma_w-prod-*.txt``); with stream-K 0.84-0.93x (``wgmma_w-prod-sk-*.txt``), which
        the model leaves to the twins (the tuning rounds chose it at 128 rows on 4 of 6 shapes). ``lean``
        (the same kernel in fewer instructions) ran the records' hints 1.00-1.09x faster in fp16 and
        1.00-1.06x in bf16 (``tune-lean-*.jsonl``; 0.975-0.99x with two warpgroups × 256 rows on
        28672×8192): 0.95. Past 256 rows, 64-row tiles take 1.7x (on 14336×4096 at 1024 rows two
        warpgroups × 64 rows took 1.77x the time of × 256, waves counted:
        ``msweep-m257-1024-float16-a20512b.jsonl``), and 16- and 32-row tiles, which decode the weights
        2-4x as often again, are put above that (3.0 and 2.2, not measured: the tuner's budget there
        goes to the 128- and 256-row tiles). Stream-K of 256-row tiles took 1.3-1.9x the time
        of the same tiles a block each at 256-768 rows (14336×4096 at 256: 101-106 µs against 55;
        ``tune-wide-m-float16-sk256-17ff1c6.jsonl``): 1.5. M tiles of 16 and 32 rows (H100, mxfp4 fp16, 6
        shapes at 16 and 32 rows, ``small-mt-*.json``): stream-K took 1.0-1.4x the time of a block a tile
        (1.25), warp 0 refilling the ring 1.1x a producer warpgroup's; a 32-row tile 0.88-0.95x a 64-row
        one's time at 32 rows, a 16-row one 1.0-1.8x (two tiles, the weights decoded twice); at 16
        rows the ``mma`` rule took 0.71-0.89x the best 16-row tile's time on every shape, so the rule
        serves from the 32-row bucket. Two splits' parts added in a cluster's shared memory
        (``cluster``) instead of a second kernel took 0.91-0.96x the time on 4096², 4096×14336 and
        8192² at 32-256 rows (H100, mxfp4 fp16, ``tune-cluster-*.jsonl``): 0.94; clusters of 4 and 8
        took 1.7-2x with two warpgroups (one block an SM: the GPCs hold fewer such clusters than the
        grid has), and 1.1-2x the records' time with one (2 blocks an SM;
        ``tune-cluster-*-e8b08eb.jsonl``): not offered. The ring's first loads issued before the scale
        scan (``early``) took 0.93-1.03x the time of the records' kernels (43 of 51 faster; 4096² at 32
        and 64 rows, 1024×4096 and 4096×14336 0.93-0.97x; H100, mxfp4 and mxfp8_e4m3,
        ``wgmma_w-early-ab-*.json``): 0.98. Two blocks of two warpgroups an SM (128 registers a
        thread) took 0.99-1.02x the records' time with their grids (9 tasks, at most a block an SM) and
        1.02-1.19x with split K doubled to fill them (``wgmma_w-occ2-ab-*.json``): not offered. Two
        ring slots, so that 8-bit codes fit two warpgroups × 256 rows with a producer warpgroup (three
        slots of 83 KB do not), took 1.2-2.1x the time of the 128-row tiles of 4 slots at 256 rows
        (H200, mxfp8_e4m3 fp16, 6 shapes: ``wgmma_w-two-slots-*.jsonl``; the refill of the slot a K
        iteration frees does not land within the next one's wgmmas): not offered. Codes in
        fragment order (``frag``) ran the records' hints 1.01-1.12x faster (24 records, mxfp4 and
        mxfp8_e4m3 fp16, 32-1024 rows, the same bits: ``wgmma_w-frag-ab-*.json``) but are not offered: a
        layer holds its codes once, in the planes' K order, which the ``mma`` kernels of its few-row
        calls read (theirs in fragment order, ``mma.Hints.frag`` with ``occ`` holding the blocks to a
        wave's, ran the ``mma`` records' hints 0.85-1.07x as fast at 1-32 rows, mean 0.99:
        ``mma-frag-occ-ab-*.json``). Slots of 64 K (``bk``), so 8-bit codes fit two warpgroups × 256
        rows in 5: 0.71-0.96x the time of the records (128-row tiles, decode + cuBLAS) at 256-1024 rows
        on 14 of 18 tasks in fp16, 0.73-0.90x on 10 of 18 in bf16; 4-bit codes' 256-row tiles in 6 of
        them 0.94-1.14x the time of 3 of 128 K (H200, mxfp8_e4m3 and mxfp4, 6 shapes:
        ``wgmma_w-bk64-*.jsonl``), 128-row tiles in 8 of them 1.01-1.12x the time of 4 of 128 K (23
        tasks at 128 and 256 rows): the stage term counts the ring's bytes, a 64 K slot's turns 1.05."""
        short = _tail(_blocks(spec, h) * h.splits, _slots(spec, h))
        short = short if not h.sk else 1.03 * (1.0 if h.sk == _per_sm(h) else 1.05)
        short *= 1.5 if h.sk and h.mt == 256 else 1.0
        wide = spec.m_bucket > 256  # (16- to 64-row tiles decode the weights many times over there)
        tile = {16: (0.7, 3.0), 32: (0.8, 2.2), 64: (1.0, 1.7), 128: (1.1,) * 2, 256: (0.85,) * 2}[h.mt][wide]
        tile *= max(1.0, 0.75 * min(spec.m_bucket, 64) / h.mt)  # small tiles: the weights decoded again
        measured = (1.0 + 0.1 * (h.wg - 1)) * tile * (1.0 if h.double else 1.15)
        ring = (0.9 if h.wg > 1 else 1.1) if h.ring else 1.0
        ring *= (0.9, 0.85)[h.tma - 1] if h.tma and h.wg > 1 else 1.02 if h.tma else 1.0
        prod = (1.0, 0.92 if h.mt == 256 else 0.97, 0.9)[h.prod] if not h.sk else 1.0
        ring *= prod * (1.0 + 0.1 * abs(h.stages * h.bk / BK - 4)) * (0.95 if h.lean else 1.0)
        ring *= 1.0 if h.bk == BK else 1.05  # (twice the ring's turns)
        if h.mt < 64:
            short *= 1.25 if h.sk else 1.0
            ring *= 1.0 if h.prod == 2 else 1.1
        split = (1.0 + 0.05 * (h.splits - 1)) * (0.94 if h.cluster else 1.0)
        return short * measured * ring * split * (0.98 if h.early else 1.0)

    def twins(self, spec: Any, hints: Hints) -> list[Hints]:
        """``hints`` launched with programmatic dependent launch (``pdl`` 1 and 2: the newest option,
        first, so a cut budget keeps it; the cost model leaves it to the twins) and with the ring's
        first loads issued before the scale scan (``early``); ``hints`` split in two with its parts added in a
        cluster's shared memory; ``hints`` leaner (``lean`` 1; the twins below lean too) and
        with its outputs scaled by a multiply (``lean`` 2), with its loads by TMA (the ring on,
        ``tma`` 2), refilled by every thread, warp 0 and a producer warpgroup (``prod``), in as many
        slots of 64 K as fit (up to 8: ``bk``), and that
        unsplit on a stream-K grid of 1 and 2 blocks an SM, with its M tile and twice it (stream-K
        pays per tile a block runs: on 8192² at 128 rows two warpgroups × 128 rows took 0.77x the
        time of × 64), where those are candidates."""
        leaner = hints if hints.lean else replaced(hints, lean=1) or hints  # (the twins below lean too)
        twins = [
            replaced(hints, cvt=1),
            replaced(hints, pdl=1),
            replaced(hints, pdl=2),
            replaced(hints, early=1),
        ]
        twins += [replaced(leaner, cluster=1, splits=2)] if hints.splits > 1 else []
        twins += [
            leaner,
            replaced(leaner, lean=2),
            *(replaced(leaner, ring=1, tma=2, prod=p) for p in PROD),
        ]
        cands = self.candidates(spec)
        halves = (replaced(leaner, bk=BK // 2, stages=s) for s in (8, 6, 5, 4))
        twins += [next((t for t in halves if t in cands), None)]
        sk = dict(ring=1, tma=hints.tma or 2, splits=1)
        tiles = itertools.product((hints.mt, 2 * hints.mt), SK[1:])
        prod = lambda k: hints.prod if k == 1 else min(hints.prod, 1)  # noqa: E731  (a producer: sk 1)
        twins += [replaced(leaner, **sk, mt=mt, sk=k, prod=prod(k)) for mt, k in tiles]
        return [t for t in dict.fromkeys(twins) if t is not None and t != hints and t in cands]

    def default_hints(self, spec: Any) -> Hints | None:
        """The cheapest candidate by :meth:`cost` (the rule is not routed: this seeds the tuner)."""
        return cheapest(self, spec)

    def apply(self, spec: Any, make: Any, hints: Hints | None = None) -> Scheduled | None:
        """The kernel (:func:`mxgemm.codegen.wgmma_w.kernel`, written, not scheduled: ``make`` unused)."""
        del make
        h = hints if hints is not None else self.default_hints(spec)
        if h is None or h not in self.candidates(spec):
            return None
        import tvm

        func = kernel(
            formats.get(spec.fmt), n=spec.n, k=spec.k, out_dtype=spec.out_dtype, bias=spec.bias,
            a_dtype=spec.a_dtype, hints=h,
        )  # fmt: skip
        return Scheduled(self.name, tvm.IRModule({"main": func}), h)


def _blocks(spec: Any, h: Hints) -> int:
    """Blocks of the unsplit grid at the bucket's M."""
    return spec.n // (64 * h.wg) * -(-spec.m_bucket // h.mt)


def _evens(spec: Any, h: Hints) -> bool:
    """Past 256 rows, two splits in a cluster whose grid's last wave is fuller than the unsplit grid's
    (14336×4096 at 1024 rows, 256-row tiles: 7 waves for 6.8 waves' work instead of 4 for 3.4)."""
    if not (h.cluster and spec.m_bucket > 256):
        return False
    blocks, slots = _blocks(spec, h), _slots(spec, h)
    return _tail(2 * blocks, slots) < _tail(blocks, slots)


def _tail(blocks: int, slots: int) -> float:
    """Whole waves a grid of ``blocks`` on ``slots`` runs, over the waves' work (1: a full last wave)."""
    waves = blocks / slots
    return math.ceil(waves) / waves


def _per_sm(h: Hints) -> int:
    """Blocks an SM runs at once: 2 with one warpgroup, else 1."""
    return 2 if h.wg == 1 else 1


def _slots(spec: Any, h: Hints) -> int:
    """Blocks the GPU runs at once."""
    return targets.sm_count(spec.target["arch"]) * _per_sm(h)


RULE = WgmmaW()
