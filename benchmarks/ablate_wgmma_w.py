"""Ablations of a ``wgmma_w`` record's kernel: the same kernel with parts taken out of its CUDA source,
timed side by side, to see which part holds it up. Timing experiments only: every variant but ``v0``
and ``pingpong`` computes wrong numbers.

Variants (text edits of the generated CUDA source of the folded K loop, before nvcc):

- ``v0``: the kernel as it is;
- ``nodecode``: each fragment register is a code word as loaded (no per-pair decode or fold);
- ``notensor``: each wgmma's PTX replaced by an empty ``asm`` with the same operands (the decode stays
  live; no tensor-core work);
- ``nothing``: both (the loads through the ring, the gathers and the barriers);
- ``noact``: no activation loads (the ring's TMA of the codes alone); ``nothing_noact``: both;
- ``ringonly``: ``nothing`` and ``noact``, and no shared-memory reads either;
- ``pingpong``: the two compute warpgroups issue their wgmmas in turns (named barriers 1 and 2),
  so that one decodes while the other's wgmmas run; the same bits;
- ``trace``, ``trace_pingpong``: ``v0`` or ``pingpong`` timing its loop's phases (:func:`trace`;
  prints);
- ``latewait``: each slot's decode into spare registers before the wait for the wgmmas that read the
  fragment set it refills (two groups in flight, not one). ptxas coalesces the spare registers with the
  fragments and moves the writes before the wait: not a valid kernel (wrong bits), timing only.

Build where TVM and nvcc are (``--hints '{"stages": 6}'`` overrides the record's hints), time on the GPU
(CUDA-graph medians of 20 calls, L2 defeated by weight copies, 7 rounds; ``v0`` and ``pingpong`` checked
bit for bit against ``v0``)::

    MXGEMM_CACHE_DIR=... python benchmarks/ablate_wgmma_w.py build OUT mxfp4 28672 8192 64 float16 \\
        [--variants v0,nothing] [--hints JSON]
    python benchmarks/ablate_wgmma_w.py time OUT [OUT...] > ablate.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

LOOP = "for (int v_4 = 0; v_4 <"  # the folded K loop of the compute warpgroups
FENCE = "tvm_builtin_ptx_wgmma_fence_fence_sync_aligned();"
COMMIT = "tvm_builtin_ptx_wgmma_commit_group_commit_group_sync_aligned();"
WAIT1 = "tvm_builtin_ptx_wgmma_wait_group_wait_group_sync_aligned_1();"
WGMMA = re.compile(
    r'(asm volatile\(")(\{ \.reg \.pred ps0; setp\.ne\.b32 ps0, %\d+, 0; wgmma\.mma_async[^"]*)(")'
)
# a fragment register's decode: (indent, fragment buffer, index, the code words' buffer); TVM numbers
# the buffers per kernel, so their names are taken from the match
DECODE = re.compile(r"^(\s*)(_ptr_\d+)\[(\d+)\] = \(\(mxgemm_prmt\(\((_ptr_\d+)\[.*$", re.M)
FOLD = re.compile(r"^\s*tvm_builtin_ptx_fma_half_rn_f16x2\(_ptr_\d+\[\d+\].*$\n", re.M)
FOLD_CALL = "tvm_builtin_ptx_fma_half_rn_f16x2(_ptr_11["
ACT_TMA = "(&(v))))"  # the activations' tensor map (the codes' is ``v_1``)


def _subn(pattern: re.Pattern, repl, code: str) -> str:
    out, n = pattern.subn(repl, code)
    if not n:
        raise ValueError(f"ablation: no match for {pattern.pattern[:40]!r} (another kernel layout?)")
    return out


def notensor(c: str) -> str:
    return _subn(WGMMA, r"\1\3", c)


def nodecode(c: str) -> str:
    c = _subn(DECODE, lambda m: f"{m[1]}{m[2]}[{m[3]}] = {m[4]}[{int(m[3]) % 8}];", c)
    return _subn(FOLD, "", c)


def noact(c: str, hints: dict) -> str:
    """No activation loads: their TMA boxes dropped and the slot's expected bytes cut by theirs (the
    slot's K × the M tile, fp16)."""
    tx = set(re.findall(r"arrive_expect_tx_shared_b64\([^;]*\(uint\)(\d+)\);", c))
    if len(tx) != 1:
        raise ValueError(f"ablation: expected one expect_tx byte count, found {sorted(tx)}")
    (total,) = tx
    act = hints["bk"] * hints["mt"] * 2
    lines = [ln for ln in c.split("\n") if not ("cp_async_bulk_tensor_g2s" in ln and ACT_TMA in ln)]
    return "\n".join(lines).replace(f"(uint){total})", f"(uint){int(total) - act})")


def _loop(c: str) -> tuple[list[str], int, int]:
    lines = c.split("\n")
    i0 = next(i for i, ln in enumerate(lines) if ln.strip().startswith(LOOP))
    i1 = next(i for i in range(i0, len(lines)) if "wait_group_sync_aligned_0()" in lines[i])
    return lines, i0, i1


def ringonly(c: str, hints: dict) -> str:
    lines, i0, i1 = _loop(noact(notensor(nodecode(c)), hints))
    drop = ("tvm_builtin_ptx_ld_vec_shared", "tvm_builtin_ptx_ld_shared_b32", "_ptr_11[", "_ptr_14[")
    body = [ln for ln in lines[i0:i1] if not ln.strip().startswith(drop)]
    return "\n".join(lines[:i0] + body + lines[i1:])


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def pingpong(c: str) -> str:
    lines, i0, i1 = _loop(c)
    wg = "(((int)threadIdx.x) >> 7)"
    trips = int(re.match(r"\s*for \(int v_4 = 0; v_4 < (\d+);", lines[i0])[1])
    out, half = [], 0
    for i, ln in enumerate(lines):
        s = ln.strip()
        if i == i0:
            out.append(_indent(ln) + f'if ({wg} == 1) asm volatile("bar.arrive 1, 256;" ::: "memory");')
        if i0 < i < i1 and s == FENCE:
            out.append(_indent(ln) + f'asm volatile("bar.sync %0, 256;" :: "r"(1 + {wg}) : "memory");')
        out.append(ln)
        if i0 < i < i1 and s == COMMIT:  # (the second warpgroup's last turn is not passed on)
            last = f"v_4 == {trips - 1}" if half else "0"
            out.append(
                _indent(ln) + f'if (!({wg} == 1 && {last})) asm volatile("bar.arrive %0, 256;" '
                f':: "r"(2 - {wg}) : "memory");'
            )
            half += 1
    if half != 2:
        raise ValueError(f"ablation: pingpong expects two wgmma groups a trip, found {half}")
    return "\n".join(out)


def latewait(c: str) -> str:
    lines, i0, i1 = _loop(c)
    body = lines[i0:i1]
    fences = [i for i, ln in enumerate(body) if ln.strip() == FENCE]
    commits = [i for i, ln in enumerate(body) if ln.strip() == COMMIT]
    if len(fences) != 2 or len(commits) != 2 or any(WAIT1 not in body[i + 1] for i in commits):
        raise ValueError("ablation: latewait expects two wgmma groups a trip, each waited for after")

    def block_end(at: int) -> int:  # the end of the wait and slot release after a commit
        depth, j = 0, at + 2
        while True:
            depth += body[j].count("{") - body[j].count("}")
            j += 1
            if depth == 0:
                return j

    ends = [block_end(i) for i in commits]
    ind = _indent(body[fences[0]])
    arrive = (
        "if ((((int)threadIdx.x) % 32) == 0) { tvm_builtin_ptx_mbarrier_arrive_arrive_shared_b64("
        "tvm_builtin_cuda_cvta_generic_to_shared((&(_ptr_10[((((v_4 * 2) + OFF) & 3) * 2) + 6401]))), "
        "(uint)1); }"
    )
    before = [
        [ind + "if (1 <= v_4) { " + WAIT1 + " " + arrive.replace("OFF", "2") + " }"],
        [ind + WAIT1, ind + "if (1 <= v_4) { " + arrive.replace("OFF", "3") + " }"],
    ]
    new = []
    for i, ln in enumerate(body):
        if any(commits[h] < i < ends[h] for h in (0, 1)):
            continue
        if i in fences:
            h = fences.index(i)
            new += before[h] + [ind + f"_ptr_11[{j}] = _pt[{j}];" for j in range(32 * h, 32 * h + 32)]
        s = ln.strip()
        decode = s.startswith("_ptr_11[") and "mxgemm_prmt" in s
        new.append(ln.replace("_ptr_11[", "_pt[") if decode or s.startswith(FOLD_CALL) else ln)
    out = "\n".join(lines[:i0] + new + lines[i1:])
    return out.replace("alignas(64) uint _ptr_11[64];", "alignas(64) uint _ptr_11[64];\n  uint _pt[64];", 1)


PHASES = ("full", "decode", "turn", "issue", "wgwait", "other")


def trace(c: str) -> str:
    """``v0`` with ``%clock64`` read around each phase of the folded loop (waiting for a slot to fill,
    loading and decoding it, issuing its wgmmas, waiting for the earlier group, the rest), summed per
    thread; lane 0 of each warp of blocks (0, 0) and (0, 100) prints its sums (cycles) at the end."""
    lines, i0, i1 = _loop(c)
    clk = 'asm volatile("mov.u64 %0, %%clock64;" : "=l"(_tc));'

    def mark(ind: str, phase: str | None) -> str:
        add = f"_t[{PHASES.index(phase)}] += _tc - _tl; " if phase else ""
        return ind + "{ long long _tc; " + clk + " " + add + "_tl = _tc; }"

    body = []
    for ln in lines[i0 + 1 : i1]:
        s_, ind = ln.strip(), _indent(ln)
        if s_.startswith("tvm_builtin_cuda_mbarrier_wait("):
            body += [mark(ind, "other"), ln, mark(ind, "full")]
            continue
        if s_.startswith('asm volatile("bar.sync %0, 256;"'):  # (pingpong's turn)
            body += [mark(ind, "decode"), ln, mark(ind, "turn")]
            continue
        if s_ == FENCE:
            body.append(mark(ind, "decode"))
        body.append(ln)
        if s_ == COMMIT:
            body.append(mark(ind, "issue"))
        if s_ == WAIT1:
            body.append(mark(ind, "wgwait"))
    ind = _indent(lines[i0])
    head = [
        ind + f"long long _t[{len(PHASES)}] = {{0}}; long long _tl; "
        "{ long long _tc; " + clk + " _tl = _tc; }"
    ]
    fmt = " ".join(f"{p} %lld" for p in PHASES)
    tail = [
        ind
        + "if ((((int)threadIdx.x) % 32) == 0 && blockIdx.x == 0 && (blockIdx.y == 0 || blockIdx.y == 100)) "
        f'printf("trace block %d warp %d {fmt}\\n", (int)blockIdx.y, (int)threadIdx.x / 32, '
        + ", ".join(f"_t[{i}]" for i in range(len(PHASES)))
        + ");"
    ]
    return "\n".join(lines[:i0] + head + [lines[i0]] + body + lines[i1 : i1 + 1] + tail + lines[i1 + 1 :])


VARIANTS = {  # name -> (CUDA source, hints) -> CUDA source
    "v0": lambda c, h: c,
    "nodecode": lambda c, h: nodecode(c),
    "notensor": lambda c, h: notensor(c),
    "nothing": lambda c, h: notensor(nodecode(c)),
    "noact": noact,
    "nothing_noact": lambda c, h: noact(notensor(nodecode(c)), h),
    "ringonly": ringonly,
    "pingpong": lambda c, h: pingpong(c),
    "latewait": lambda c, h: latewait(c),
    "trace": lambda c, h: trace(c),
    "trace_pingpong": lambda c, h: trace(pingpong(c)),
}
SAME_BITS = ("v0", "pingpong")


def build(out: Path, fmt: str, n: int, k: int, m: int, dtype: str, variants: list[str], over: dict) -> None:
    """Each variant of the record's kernel for ``(fmt, n, k, m bucket, dtype)`` into ``out/NAME.so``
    (its source beside it), and ``out/case.json``."""
    import tvm

    import mxgemm
    from mxgemm import formats, ops
    from mxgemm.codegen import build as builder
    from mxgemm.codegen import nvcc, wgmma_w
    from mxgemm.codegen.wgmma import TARGET

    kern = mxgemm.build(**ops.build_args(m, fmt=fmt, n=n, k=k, a_dtype=dtype, bias=False, target="sm_90"))
    if kern.info.get("rule") != "wgmma_w":
        rule = kern.info.get("rule")
        raise SystemExit(f"the record of {fmt} {n}x{k} at {m} rows runs {rule}, not wgmma_w")
    hints = {**kern.info["hints"], **over}
    func = wgmma_w.kernel(
        formats.get(fmt), n=n, k=k, out_dtype=dtype, bias=False, a_dtype=dtype, hints=wgmma_w.Hints(**hints)
    )
    out.mkdir(parents=True, exist_ok=True)
    compile_fatbin = nvcc.compile_fatbin
    try:
        for name in variants:

            def patched(code: str, arch: str, name: str = name) -> bytes:
                code = VARIANTS[name](code, hints)
                (out / f"{name}.cu").write_text(code)
                return compile_fatbin(code, arch)

            nvcc.compile_fatbin = patched
            builder.compile_export(tvm.IRModule({"main": func}), TARGET, out / f"{name}.so")
            print(name, "built", flush=True)
    finally:
        nvcc.compile_fatbin = compile_fatbin
    case = {"fmt": fmt, "n": n, "k": k, "m": m, "dtype": dtype, "hints": hints}
    (out / "case.json").write_text(json.dumps(case))


def time_dir(d: Path, rounds: int = 7, calls: int = 20) -> dict:
    """Median µs a call of each ``d/*.so`` (CUDA graphs of ``calls`` calls, rounds interleaved)."""
    import torch

    from mxgemm.codegen import build as builder
    from mxgemm.codegen.wgmma import TARGET

    case = json.loads((d / "case.json").read_text())
    n, k, m, dt = case["n"], case["k"], case["m"], getattr(torch, case["dtype"])
    width = 4 if case["fmt"] == "mxfp4" else 8
    torch.manual_seed(0)
    a = (torch.randn(m, k, device="cuda") * 0.1).to(dt)
    copies = int(120e6 // (n * k * width // 8)) + 1  # weight copies past the L2, cycled
    b = [torch.randint(0, 256, (n, k * width // 8), dtype=torch.uint8, device="cuda") for _ in range(copies)]
    s = torch.full((n, k // 32), 127, dtype=torch.uint8, device="cuda")  # 2^0: every row folds
    outs, graphs = {}, {}
    for so in sorted(d.glob("*.so")):
        f = builder.load_main(so, TARGET)
        y = torch.zeros(m, n, dtype=dt, device="cuda")
        f(a, b[0], s, y)
        torch.cuda.synchronize()
        outs[so.stem] = y.clone()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                f(a, b[i % copies], s, y)
        graphs[so.stem] = g
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, g in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / calls)
    row = {"case": f"{case['fmt']} {n}x{k} m{m} {case['dtype']}", "hints": case["hints"]}
    for name, t in times.items():
        same = bool(torch.equal(outs[name], outs["v0"])) if name in SAME_BITS and "v0" in outs else None
        row[name] = {"us": round(statistics.median(t), 2), "same_bits": same}
    return row


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out", type=Path)
    b.add_argument("fmt")
    b.add_argument("n", type=int)
    b.add_argument("k", type=int)
    b.add_argument("m", type=int)
    b.add_argument("dtype")
    b.add_argument("--variants", default=",".join(VARIANTS))
    b.add_argument("--hints", default="{}", help="JSON: hints that override the record's")
    t = sub.add_parser("time")
    t.add_argument("dirs", type=Path, nargs="+")
    args = ap.parse_args()
    if args.cmd == "build":
        names = args.variants.split(",")
        unknown = sorted(set(names) - set(VARIANTS))
        if unknown:
            raise SystemExit(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
        build(args.out, args.fmt, args.n, args.k, args.m, args.dtype, names, json.loads(args.hints))
    else:
        for d in args.dirs:
            print(json.dumps(time_dir(d)), flush=True)
