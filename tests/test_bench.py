"""`mxgemm bench`'s report (CPU: a result of known rows; the timing itself runs on a GPU)."""

from mxgemm import bench


def _row(method, fmt, m, us, wbytes, copy_tbs=2.0):
    tbs = wbytes / us / 1e6
    return dict(
        weight_bytes=wbytes, n=1024, k=4096, m=m, method=method, fmt=fmt, us=us, tflops=0.0,
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
