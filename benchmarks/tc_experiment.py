"""Experiment: a tensor-core (wmma) rule for the decode-fused matmul at medium M (fp16 activations).

The packed code tile of W is loaded with 16-byte loads, decoded once into shared memory, and fed to
wmma 16x16x16 with the A tile; fp32 accumulation. ``build DIR`` (any box with nvcc) compiles a grid of
tile configs into DIR; ``run DIR`` (the GPU box) checks each against dequantize + matmul and times it
like `mxgemm bench`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SHAPES = ((8192, 8192), (28672, 8192))
QUICK = (("mxfp4", 8192, 8192),)
FORMATS = ("mxfp4", "mxint8")
CONFIGS = (
    (32, 128, 32, 4),
    (32, 128, 32, 8),
    (64, 128, 64, 4),
    (64, 128, 32, 4),
    (64, 128, 64, 8),
)  # mt, nt, kt, K splits


def schedule(func, mt: int, nt: int, kt: int, k_total: int, splits: int = 1):
    from tvm import s_tir
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    sch = s_tir.Schedule(func)
    dec, mm = sch.get_sblock("decode"), sch.get_sblock("matmul")
    planes = [r.source for r in sch.get(dec).reads][:-1]
    sch.pad_einsum(mm, [mt, 1, 1])
    sch.compute_inline(sch.get_sblock("matmul_pad"))
    if splits > 1:  # split-K: partial sums per K slice (blockIdx.z), then a reduction kernel
        i, j, k = sch.get_loops(mm)
        ks, kr = sch.split(k, [splits, None])
        sch.reorder(ks, i, j, kr)
        rf = sch.rfactor(ks, 0)
        red = mm
        mm = rf
    i_j_k = sch.get_loops(mm)
    ks_loop = i_j_k[0] if splits > 1 else None
    i, j, k = i_j_k[-3:]
    i, ii = sch.split(i, [None, 16])
    j, ji = sch.split(j, [None, 16])
    k, ki = sch.split(k, [None, 16])
    sch.reorder(i, j, k, ii, ji, ki)
    block_outer = sch.blockize(ii)
    wy = min(2, mt // 16)
    wx = 4 // wy
    i0, i2, i3 = sch.split(i, [None, wy, mt // 16 // wy])
    j0, j2, j3 = sch.split(j, [None, wx, nt // 16 // wx])
    k0, k1 = sch.split(k, [None, kt // 16])
    sch.reorder(i0, j0, i2, j2, k0, k1, i3, j3)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    if ks_loop is not None:
        sch.bind(ks_loop, "blockIdx.z")
    ty = sch.fuse(i2, j2)
    sch.bind(ty, "threadIdx.y")
    a_sh = sch.cache_read(block_outer, 0, "shared.dyn")
    sch.compute_at(a_sh, k0)
    sch.compute_inline(sch.get_sblock("A_pad"))
    f = sch.fuse(*sch.get_loops(a_sh)[-2:])
    _, f1, f2, f3 = sch.split(f, [None, 4, 32, 8])
    sch.bind(f1, "threadIdx.y")
    sch.bind(f2, "threadIdx.x")
    sch.vectorize(f3)
    sch.storage_align(a_sh, 0, axis=-2, factor=16, offset=8)
    sch.set_scope(dec, 0, "shared.dyn")
    sch.compute_at(dec, k0)
    dn, dk = sch.get_loops(dec)[-2:]
    vec = 16 * 8 // (int(planes[0].shape[1]) * 8 // k_total)
    f = sch.fuse(dn, dk)
    _, f1, f2, f3 = sch.split(f, [None, 4, 32, vec])
    sch.bind(f1, "threadIdx.y")
    sch.bind(f2, "threadIdx.x")
    for idx in range(len(planes)):
        c = sch.cache_read(dec, idx, "local")
        sch.compute_at(c, f2)
        loops = sch.get_loops(c)
        pos = next(n for n, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(f2)))
        inner = loops[pos + 1 :]
        sch.vectorize(sch.fuse(*inner) if len(inner) > 1 else inner[0])
    sch.unroll(f3)
    sch.storage_align(dec, 0, axis=-2, factor=16, offset=8)
    a_mat = sch.cache_read(block_outer, 0, "wmma.matrix_a")
    b_mat = sch.cache_read(block_outer, 1, "wmma.matrix_b")
    sch.compute_at(a_mat, k1)
    sch.compute_at(b_mat, k1)
    acc_sh = sch.cache_write(block_outer, 0, "shared.dyn")
    sch.storage_align(acc_sh, 0, -2, 16, 4)
    store = sch.cache_write(block_outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, ty)
    sch.reverse_compute_at(acc_sh, ty)
    si, sj = sch.get_loops(store)[-2:]
    si0, si1 = sch.split(si, [None, 16])
    sj0, sj1 = sch.split(sj, [None, 16])
    sch.reorder(si0, sj0, si1, sj1)
    init = sch.decompose_reduction(block_outer, k0)
    init_inner = sch.get_child_blocks(init)[0]
    g = get_wmma_intrin_group(
        load_scope="shared.dyn",
        store_scope="shared.dyn",
        in_dtype="float16",
        out_dtype="float32",
        trans_b=True,
    )
    for mat, key in ((a_mat, "load_a"), (b_mat, "load_b")):
        x, y = sch.get_loops(mat)[-2:]
        x0, x1 = sch.split(x, [None, 16])
        y0, y1 = sch.split(y, [None, 16])
        sch.reorder(x0, y0, x1, y1)
        sch.unroll(x0)
        sch.unroll(y0)
        sch.tensorize(x1, g[key])
    sch.tensorize(sch.get_loops(init_inner)[-2], g["init"])
    sch.tensorize(sch.get_loops(store)[-2], g["store"])
    sch.tensorize(sch.get_loops(mm)[-3], g["compute"])
    if splits == 1:
        auto_inline_consumer_chain(sch, acc_sh)
    f = sch.fuse(*sch.get_loops(acc_sh)[-2:])
    _, f1, f2 = sch.split(f, [None, 32, 4])
    sch.bind(f1, "threadIdx.x")
    sch.vectorize(f2)
    if splits > 1:  # sum the K slices (+ epilogue): one thread per output
        rk, ri, rj = sch.get_loops(red)
        sch.reorder(ri, rj, rk)
        f = sch.fuse(ri, rj)
        bx, tx = sch.split(f, [None, 256])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.reverse_compute_at(sch.get_sblock("epilogue"), tx)
    return sch


def build(out: Path) -> None:
    from mxgemm.codegen import nvcc
    from mxgemm.codegen import target as targets
    from mxgemm.codegen.prim_func import prim_func

    out.mkdir(parents=True, exist_ok=True)
    made = []
    for fmt in FORMATS:
        for n, k in SHAPES:
            for mt, nt, kt, splits in CONFIGS:
                name = f"{fmt}_{n}_{k}_{mt}_{nt}_{kt}_{splits}"
                try:
                    sch = schedule(prim_func(fmt, n=n, k=k, m=None, a_dtype="float16"), mt, nt, kt, k, splits)
                    ex = nvcc.compile_module(sch.mod, targets.cuda("sm_90"))
                    ex.export_library(str(out / f"{name}.so"))
                    made.append(dict(fmt=fmt, n=n, k=k, mt=mt, nt=nt, kt=kt, splits=splits, lib=f"{name}.so"))
                    print("built", name, flush=True)
                except Exception as e:  # noqa: BLE001
                    print("FAILED", name, str(e).strip().splitlines()[-1][:200], flush=True)
    (out / "configs.json").write_text(json.dumps(made))


def run(src: Path) -> None:
    import torch
    import tvm

    import mxgemm
    from mxgemm import bench, ops
    from mxgemm.codegen import nvcc

    nvcc.load_cuda_runtime()
    rows = []
    for c in json.loads((src / "configs.json").read_text()):
        f = tvm.runtime.load_module(str(src / c["lib"]))["main"]
        n, k = c["n"], c["k"]
        q = mxgemm.quantize(torch.randn(n, k, device="cuda") * 0.02, c["fmt"])
        planes = ops._planes(q.blocks, mxgemm.formats.get(c["fmt"]).bits)
        wq = mxgemm.dequantize(q)
        copies = [[*(p.clone() for p in planes), q.scales.clone()] for _ in range(bench._copies(q.nbytes))]
        for m in (16, 64, 256):
            x = torch.randn(m, k, device="cuda").half()
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.half)
            f(x, *planes, q.scales, y)
            ref = x.float() @ wq.T
            err = ((y.float() - ref).norm() / ref.norm()).item()
            try:
                us = bench._time_graph(bench._cycle([lambda w=w, x=x, y=y: f(x, *w, y) for w in copies]))
            except Exception as e:  # noqa: BLE001 (workspace allocation may not graph-capture)
                print("graph capture failed:", str(e).splitlines()[-1][:120])
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for w in copies * 3:
                    f(x, *w, y)
                b.record()
                b.synchronize()
                us = a.elapsed_time(b) * 1e3 / (3 * len(copies))
            rows.append({**c, "m": m, "us": us, "rel_err": err})
            print(
                f"{c['fmt']} {n}x{k} tile {c['mt']}x{c['nt']}x{c['kt']}/{c['splits']} M={m}: {us:.1f} us  err {err:.2e}",
                flush=True,
            )
    print(json.dumps(rows))


if __name__ == "__main__":
    (build if sys.argv[1] == "build" else run)(Path(sys.argv[2]))
