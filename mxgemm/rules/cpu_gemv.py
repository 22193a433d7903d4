"""CPU rule for a few rows of activations (M buckets 1 and 4): a GEMV that reads each weight byte
once, decodes in vector registers and accumulates in fp32 vectors, parallel over output rows (small
layers on the calling thread: ``Hints.parallel``).

The decode is :func:`mxgemm.codegen.decode.weight_expr`'s ``"sar"`` form (one shift to put the code
at the top of a 32-bit lane, one arithmetic shift and one AND to place sign and exponent/mantissa
bits, the exact float32 multiply(s)), inlined into the multiply-add; for float formats of up to 4
exponent bits, on CPUs that convert fp16 vectors (x86 F16C, AArch64), its ``"f16"`` form (the same
in 16-bit lanes, then one fp16 → fp32 conversion: no float32 subnormals, which x86 cores process
slowly). K is walked in groups of ``lanes × per`` codes (``per`` codes a byte of the CPU layout,
:func:`mxgemm.layout.cpu_planes`): the ``lanes`` bytes of a group are one contiguous vector load,
each of their ``per`` codes one unrolled step whose shift is a constant.
Inside a step, the ``rows`` outputs of a task and the rows of the bucket are unrolled loops:
each output's decoded vector feeds one multiply-add per row (LLVM keeps one copy of the decode), each
activation vector is loaded once for all outputs, and the ``rows × M`` accumulators are independent
chains. The reduction over K is therefore in a permuted order; the activations are converted to fp32
and permuted once per call to match (``a_f32``, ``[m, k / (lanes·per), per, lanes]``), so their
loads are contiguous vectors too. Each ``lanes``-wide accumulator (``rfactor``) is summed across lanes
at the end. Calls with fewer rows than the bucket pad them with zeros.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tvm import s_tir

from mxgemm import formats
from mxgemm.codegen.decode import f16_decodes
from mxgemm.codegen.shapes import CPU_M_BUCKETS
from mxgemm.codegen.target import cpu_converts_f16, cpu_vectors
from mxgemm.layout import codes_per_byte
from mxgemm.rules.base import Rule, Scheduled, cheapest

LANES = (16, 8, 32)  # fp32 lanes of the accumulator (AVX2 registers hold 8; LLVM splits wider vectors)
ROWS = (8, 16, 4, 2, 1)
ROWS_BY_SIZE = (8, 4, 2, 1)  # the row counts the cost model prefers, largest first
SERIAL_MAX_WEIGHTS = 1 << 19  # layers this small run on the calling thread by default


@dataclass(frozen=True)
class Hints:
    """lanes: codes of one plane byte-vector (fp32 accumulator width); rows: output rows per task;
    parallel: 1 to spread the tasks over TVM's thread pool, 0 to run them on the calling thread."""

    lanes: int = 16
    rows: int = 8
    parallel: int = 1

    def __post_init__(self) -> None:
        if self.lanes not in LANES or self.rows not in ROWS or self.parallel not in (0, 1):
            raise ValueError(f"cpu_gemv hints out of range: {self}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def preferred_rows(target: dict[str, Any], m: int) -> int:
    """Output rows per task for 16 lanes at ``m`` rows of activations: the most whose accumulators
    fit a quarter (M=1) or half (more rows) of the target's vector registers (:meth:`CpuGemv.cost`):
    8 at M=1 and 4 at M=4 with AVX-512, 2 and 1 with AVX2."""
    lanes, regs = cpu_vectors(target)
    budget = regs // (4 if m == 1 else 2)
    per_row = m * -(-16 // lanes)
    return next(r for r in ROWS_BY_SIZE if r * per_row <= budget or r == 1)


def fits(h: Hints, n: int, k: int, fmt: formats.Format) -> bool:
    """Whether ``h`` tiles an ``[n, k]`` weight: N a multiple of ``rows``, K of a group."""
    return n % h.rows == 0 and k % (h.lanes * codes_per_byte(fmt.bits)) == 0


class CpuGemv(Rule):
    """LLVM targets, M buckets 1 and 4, a shape some hints tile."""

    name = "cpu_gemv"
    Hints = Hints

    @staticmethod
    def _serves(spec: Any) -> bool:
        return spec.target["kind"] == "llvm" and spec.op == "linear" and spec.m_bucket in CPU_M_BUCKETS

    def candidates(self, spec: Any) -> list[Hints]:
        if not self._serves(spec):
            return []
        f = formats.get(spec.fmt)
        every = (Hints(v, r, p) for p in (1, 0) for v in LANES for r in ROWS)
        return [h for h in every if fits(h, spec.n, spec.k, f)]

    def cost(self, spec: Any, h: Hints) -> float:
        """16 lanes; output rows per task sized to the CPU's vector register file
        (:func:`mxgemm.codegen.target.cpu_vectors`): the ``rows × M`` accumulators of a task take
        ``rows · M · ⌈16 / vector lanes⌉`` registers, at most a quarter of them at M=1 and half at M=4,
        the rest holding activations and the decode's temporaries.

        Measured (interleaved hint sets; every call on the least recently read of 8 weight copies, as a
        model's layers come from DRAM; bf16 activations; median µs). 2-core Zen 5, AVX-512 (32 registers
        of 16 lanes), 2026-11-24, 4096²: mxfp4 M=1 636–847 at 8 rows, 836–991 at 4, 1005–1146 at 2,
        958–1151 at 1 (two orders); M=4 1141 at 4 rows, 1454 at 2, 1636 at 1, 2930 at 8 (its 32
        accumulators spill); mxfp8_e4m3 M=1 1088–1282 at every row count (bound by DRAM), M=4 1190 /
        1418 / 1786 at 4 / 2 / 1; 8 or 32 lanes were slower (0.61–1.6 ms against 0.35 at M=1 in L3).
        2-core Zen 3, AVX2 (16 registers of 8 lanes), 2026-11-25, ``mxgemm tune --arch llvm`` over every
        hint set, mxfp4 / mxfp6_e2m3 / mxfp8_e4m3 on 1536×576, 576×1536 and 4096²: the winners had 1 or 2
        rows (16 or 8 lanes), 1.3–2.6x faster than 16 lanes × 8 rows, whose 16 accumulators spill there
        (mxfp4 4096² M=1 1957 against 3225 µs, M=4 3961 against 8899).
        Layers of up to :data:`SERIAL_MAX_WEIGHTS` weights run on the calling thread: waking TVM's pool
        costs about what their work does (Zen 5, mxfp4, M=1, under ``torch.no_grad``, each call right
        after a LayerNorm, two runs, µs: 576×576 23.6–27.9 serial against 26.6–28.2 parallel; 1536×576
        55.7–78.3 / 49.1–49.2; 576×1536 41.9–74.3 / 36.6–38.5; 4096×1024 202–276 / 123–128)."""
        rows = preferred_rows(spec.target, spec.m_bucket)
        serial = spec.n * spec.k <= SERIAL_MAX_WEIGHTS
        return (
            (1.0 if h.lanes == 16 else 1.1)
            * (1.0 if h.rows == rows else 1.05)
            * (1.0 if h.parallel != serial else 1.2)
        )

    def default_hints(self, spec: Any) -> Hints | None:
        return cheapest(self, spec)

    def apply(self, spec: Any, make: Any, hints: Hints | None = None) -> Scheduled | None:
        """Schedules the spec's prim_func with the ``"sar"`` decode, reading 3/5/6/7-bit codes one a
        byte (:func:`mxgemm.layout.cpu_planes`; ``make`` is not used: it builds the ``"bits"`` form
        from the planes); None when the hints do not tile the shape."""
        del make
        h = hints if hints is not None else self.default_hints(spec)
        fmt = formats.get(spec.fmt)
        if h is None or not self._serves(spec) or not fits(h, spec.n, spec.k, fmt):
            return None
        from mxgemm.codegen.prim_func import prim_func

        func = prim_func(
            spec.fmt, n=spec.n, k=spec.k, m=spec.m_bucket, a_dtype=spec.a_dtype, out_dtype=spec.out_dtype,
            bias=spec.bias, block_size=spec.block_size, decode_dtype="float32",
            decode_form="f16" if f16_decodes(fmt) and cpu_converts_f16(spec.target) else "sar",
            a_stage=True, cpu_layout=True,
        )  # fmt: skip
        return Scheduled(self.name, _schedule(func, h, codes_per_byte(fmt.bits)), h)


RULE = CpuGemv()


def _schedule(func: Any, h: Hints, per: int) -> Any:
    """The schedule of the module docstring; returns the IRModule."""
    lanes = h.lanes
    sch = s_tir.Schedule(func)
    dec, mm, epi, a32 = (sch.get_sblock(name) for name in ("decode", "matmul", "epilogue", "a_f32"))
    sch.compute_inline(dec)
    i, j, k = sch.get_loops(mm)
    g, kv, kn = sch.split(k, [None, lanes, per])
    jo, ji = sch.split(j, [None, h.rows])
    sch.reorder(jo, g, kn, ji, i, kv)
    rf = sch.rfactor(kv, 0)
    jo, g, kn, ji, i, kv = sch.get_loops(rf)
    if h.parallel:
        sch.parallel(jo)
    sch.reverse_compute_at(mm, jo)
    sch.reverse_compute_at(epi, jo)
    sch.unroll(ji)
    sch.set_scope(rf, 0, "local")
    sch.set_scope(mm, 0, "local")
    sch.transform_layout(rf, ("write", 0), lambda v, r, c: (r, c, v))  # each row's lanes contiguous
    sch.vectorize(kv)
    sch.unroll(i)
    sch.unroll(kn)
    group = lanes * per
    sch.transform_layout(a32, ("write", 0), lambda r, c: (r, c // group, c % per, c % group // per))
    sch.decompose_reduction(rf, g)
    return sch.mod
