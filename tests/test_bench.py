"""`mxgemm bench`'s report (CPU: a result of known rows; the timing itself runs on a GPU)."""

import pytest

from mxgemm import bench


def _row(method, fmt, m, us, wbytes, copy_tbs=2.0):
    tbs = wbytes / us / 1e6
    return dict(
        weight_bytes=wbytes, n=1024, k=4096, m=m, method=method, fmt=fmt, us=us,
        tflops=2 * m * 1024 * 4096 / us / 1e6,
        weight_tbs=tbs, pct_copy=100 * tbs / copy_tbs, vs_cublas=1.0,
    )  # fmt: skip


def test_the_report_gives_the_read_roofline_beside_copy_bandwidth():
    """The read roofline is cuBLAS's best weight bytes per second in the run (bf16's here, faster than
    the copy figure); each M=1 row reads as a share of it and of the copy bandwidth."""
    rows = [
        _row("cublas_fp16", "fp16", 1, 4.0, 8 << 20),  # 2.10 TB/s
        _row("cublas_bf16", "bf16", 1, 3.0, 8 << 20),  # 2.80 TB/s: the roofline
        _row("cublas_bf16", "bf16", 16, 4.0, 8 << 20),
        _row("mxgemm", "mxfp4", 1, 1.5, 2228224),  # 1.49 TB/s
        _row("tinygemm_int4", "int4 g32", 1, 2.0, 2359296),
    ]
    result = dict(gpu="GPU", date="d", commit="c", a_dtype="bfloat16", copy_tbs=2.0, rows=rows)
    assert bench.read_roofline(rows) == 8 * 2**20 / 3.0 / 1e6
    md = bench.markdown(result)
    assert "read roofline 2.80 TB/s" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| mxgemm mxfp4 |"))
    assert line.endswith("| 74% | 53% |"), line  # 1.49 / 2.0 copy, 1.49 / 2.80 roofline
    assert next(ln for ln in md.splitlines() if ln.startswith("| cublas_bf16 bf16 |")).endswith("| 100% |")
    assert any(ln.startswith("| tinygemm_int4 int4 g32 |") for ln in md.splitlines())


def test_the_bound_row_takes_the_slower_of_the_weight_stream_and_the_tensor_cores():
    """bound = max(weight bytes / read roofline, FLOPs / cuBLAS's best TFLOP/s at 1024+ rows): the
    M=1 cell streams its bytes, the M=2048 cell is held by the FLOPs; without a 1024+-row cuBLAS row,
    the weight stream alone."""
    rows = [
        _row("cublas_fp16", "fp16", 1, 4.0, 8 << 20),  # 2.10 TB/s: the read roofline
        _row("cublas_fp16", "fp16", 2048, 40.0, 8 << 20),  # 429.5 TFLOP/s: the compute roofline
        _row("mxgemm", "mxfp4", 1, 2.0, 2228224),
        _row("mxgemm", "mxfp4", 2048, 50.0, 2228224),
    ]
    for r in rows:
        r["vs_cublas"] = {1: 4.0, 2048: 40.0}[r["m"]] / r["us"]
    result = dict(gpu="GPU", date="d", commit="c", a_dtype="float16", copy_tbs=2.0, rows=rows)
    line = next(ln for ln in bench.markdown(result).splitlines() if ln.startswith("| bound mxfp4 |"))
    # M=1: 2228224 B / 2.097 TB/s = 1.06 us, 4.0 / 1.06 = 3.76x; M=2048: the FLOPs at the cuBLAS row's
    # rate take its 40.0 us, 1.00x
    assert line.startswith("| bound mxfp4 | 1.1 (3.76x) | 40.0 (1.00x) |"), line
    no_big = dict(result, rows=[r for r in rows if r["m"] == 1])
    md = bench.markdown(no_big)
    assert "compute roofline" not in md.split("\n")[2].split("bound:")[0]
    assert next(ln for ln in md.splitlines() if ln.startswith("| bound mxfp4 |")).startswith(
        "| bound mxfp4 | 1.1 (3.76x) |"
    )


def test_the_stack_step_runs_the_projections_as_a_decoder_layer_does():
    """``mxgemm bench --stack``'s step (every mode's): q, k, v, gate, up read the hidden state, o reads
    q's output, down silu(gate)·up, the next layer ``h + o + down``; k and v are returned. Checked
    against the same arithmetic written out on the weights (two layers of a small shape)."""
    import torch
    from torch import nn

    from mxgemm import bench_stack

    torch.manual_seed(0)
    sizes = [(8, 8), (8, 2), (8, 2), (8, 8), (8, 16), (8, 16), (16, 8)] * 2
    layers = [nn.Linear(i, o, bias=False, dtype=torch.float64) for i, o in sizes]
    x = torch.randn(3, 8, dtype=torch.float64)
    h, kv = x, []
    for first in (0, 7):
        q, k, v, o, gate, up, down = (lin.weight for lin in layers[first : first + 7])
        kv += [h @ k.T, h @ v.T]
        h = h + (h @ q.T) @ o.T + (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ down.T
    got = bench_stack._decoder_step(layers, x)
    assert len(got) == 5
    for a, b in zip(got, [h, *kv], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bench_stack._Step(layers)(x)[0], h, rtol=1e-12, atol=1e-12)


def test_the_stack_of_each_model_has_its_projections_and_biases():
    """``mxgemm bench --stack --model``: two decoder layers of the model's published widths (Qwen2.5-7B:
    hidden 3584, MLP 18944, 4 KV heads of 128, q/k/v with a bias; Llama-2-13B: 5120, 13824, 40 KV
    heads of 128), and the kernels it builds carry the layers' biases; an unknown model is an error
    naming the choices."""
    from mxgemm import bench_stack

    qwen = [(3584, 3584, True), (3584, 512, True), (3584, 512, True), (3584, 3584, False)]
    qwen += [(3584, 18944, False), (3584, 18944, False), (18944, 3584, False)]
    assert bench_stack.shapes("qwen2.5-7b") == qwen * 2
    llama2 = [(5120, 5120)] * 4 + [(5120, 13824)] * 2 + [(13824, 5120)]
    assert bench_stack.shapes("llama-2-13b") == [(i, o, False) for i, o in llama2] * 2
    assert bench_stack.shapes() == bench_stack.shapes("llama-3-8b")
    assert len(bench_stack.shapes()) == 14 and (4096, 1024, False) in bench_stack.shapes()
    specs = bench_stack.build_specs("mxfp4", "sm_90", (1,), ("bfloat16",), "qwen2.5-7b")
    got = {(s["k"], s["n"], s.get("bias", False)) for s in specs}
    assert got == {*qwen, (4096, 1024, False)}  # (and the host cost's layer)
    host = [s for s in specs if (s["n"], s["k"]) == bench_stack.HOST_SHAPE]
    assert sorted(s["a_dtype"] for s in host) == ["bfloat16", "float16"]
    with pytest.raises(ValueError, match="llama-3-8b, qwen2.5-7b, llama-2-13b"):
        bench_stack.shapes("qwen-72b")
    from mxgemm import cli

    args = cli.build_parser().parse_args(["bench", "--stack", "--model", "qwen2.5-7b"])
    assert args.model == "qwen2.5-7b"
    with pytest.raises(SystemExit):  # (argparse names the choices: the models of bench_stack.MODELS)
        cli.build_parser().parse_args(["bench", "--stack", "--model", "qwen-72b"])
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")  # noqa: SLF001
    choices = next(a.choices for a in sub.choices["bench"]._actions if a.dest == "model")  # noqa: SLF001
    assert tuple(choices) == tuple(bench_stack.MODELS)


@pytest.mark.gpu
def test_tinygemm_adds_the_linear_bias():
    """The tinygemm peer (a Qwen stack's q, k, v have biases) adds the linear's bias: its output with
    the bias minus its output without it is the bias, bit for bit (bf16 on CUDA)."""
    import torch

    from mxgemm import peers

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 64, bias=True, dtype=torch.bfloat16, device="cuda")
    with_bias = peers.Tinygemm(lin)
    plain = peers.Tinygemm(torch.nn.Linear(256, 64, bias=False, dtype=torch.bfloat16, device="cuda"))
    plain.w, plain.sz = with_bias.w, with_bias.sz
    x = torch.randn(3, 256, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(with_bias(x), plain(x) + lin.bias, rtol=0, atol=0)


def test_twin_rows_go_against_cublas_of_their_dtype_and_the_report_tabulates_bf16_over_fp16():
    """A float16 run with ``twin`` rows (the bf16 kernels on the same weights): each mxgemm row's
    speedup is over cuBLAS of its own dtype, and the last table gives, per format and M, the range
    over shapes of bf16 time / fp16 time, its median and the cells over 1.05x."""
    rows = []
    for n, f16, b16 in ((1024, 4.0, 4.4), (2048, 8.0, 8.0)):  # bf16/fp16: 1.10 and 1.00
        for meth, fmt, us in (
            ("cublas_fp16", "fp16", 10.0), ("cublas_bf16", "bf16", 11.0),
            ("mxgemm", "mxfp4", f16), ("mxgemm_bf16", "mxfp4", b16),
        ):  # fmt: skip
            rows.append(dict(_row(meth, fmt, 16, us, 2228224), n=n))
    bench.speedups(rows, "float16")
    vs = {(r["method"], r["n"]): round(r["vs_cublas"], 3) for r in rows}
    assert vs["mxgemm", 1024] == 2.5 and vs["mxgemm_bf16", 1024] == 2.5  # 10 / 4.0, 11 / 4.4
    assert vs["cublas_bf16", 1024] == round(10 / 11, 3)  # (cuBLAS bf16 against the run's fp16)
    result = dict(gpu="GPU", date="d", commit="c", a_dtype="float16", copy_tbs=2.0, rows=rows)
    assert bench.dtype_ratios(result) == {("mxfp4", 16): [pytest.approx(1.1), 1.0]}
    md = bench.markdown(result).splitlines()
    assert "mxgemm_bf16 rows: the bfloat16 kernels, vs cuBLAS bfloat16" in md[2]
    assert "| mxfp4 | 1.00–1.10 | 1.05 | 1 of 2 |" in md
    # the same rows from a bfloat16 run (fp16 the twin): the same ratios, bf16 over fp16
    flipped = [
        dict(r, method={"mxgemm": "mxgemm_fp16", "mxgemm_bf16": "mxgemm"}.get(r["method"], r["method"]))
        for r in rows
    ]
    assert bench.dtype_ratios(dict(result, a_dtype="bfloat16", rows=flipped))["mxfp4", 16] == [
        pytest.approx(1.1),
        1.0,
    ]


def test_compare_default_builds_the_routes_the_defaults_take():
    """``mxgemm bench --build-only --compare-default``: where the tune log's record routes a call to
    decode + cuBLAS (512×3584 mxfp4 at 64 rows, a shipped record) the rules' defaults run the fused
    ``mma`` kernel of the bucket; both are among the kernels built, each with its own hints."""
    shape, dt = ((512, 3584),), "float16"
    tuned = bench.build_specs(shape, (64,), ("mxfp4",), dt, "sm_90")
    untuned = bench.build_specs(shape, (64,), ("mxfp4",), dt, "sm_90", tuned=False)
    routes = lambda specs: {(s.get("op", "linear"), s.get("m_bucket")) for s in specs}  # noqa: E731
    assert routes(tuned) == {("decode", None)}  # (also the mxgemm_decode rows' kernel)
    assert routes(untuned) == {("linear", 64), ("decode", None)}
