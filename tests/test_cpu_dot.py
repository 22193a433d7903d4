"""The ``cpu_dot`` rule (x86 CPUs with AVX-512: bf16 dot products, or fp32 multiply-adds): its layout,
what its kernel is made of (any x86 host: LLVM builds for a Zen 5 and an Ice Lake target), and, where
this CPU runs it, its results against the reference in each of its modes (bf16 rows on ``vdpbf16ps``;
bf16 rows as on a CPU without AVX512-BF16; fp16 rows): one-hot rows bit-exact for every code and
scale, ragged M with and without bias within fp32 summation order."""

import pytest
import torch

import mxgemm
from mxgemm import formats, layout, ops, packing
from mxgemm.codegen import cpu_dot
from mxgemm.codegen import target as targets
from tests.linear_cases import FORMATS, every_code_weight
from tests.test_linear import _check, _weights

ZEN5 = {"kind": "llvm", "mcpu": "znver5"}
ICELAKE = {"kind": "llvm", "mcpu": "icelake-server"}  # AVX-512 BW, no BF16
DOT_FORMATS = [f for f in FORMATS if cpu_dot.supports(formats.get(f))]
MODES = ["bf16-dot", "bf16-fma", "fp16-fma"]


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    """(activation dtype, the dot the kernel uses), skipped where this CPU cannot run it; bf16-fma
    routes as a CPU without AVX512-BF16 does."""
    dtype, dot = request.param.split("-")
    if not (targets.cpu_bf16_dots if dot == "dot" else targets.cpu_word_lookups)(targets.cpu()):
        pytest.skip(f"this CPU cannot run cpu_dot's {request.param} kernels")
    if request.param == "bf16-fma":  # this machine as a CPU without AVX512-BF16
        host = targets.cpu()
        monkeypatch.setattr(targets, "cpu", lambda: {**host, "mattr": ["-avx512bf16"]})
    ops.clear_kernels()
    yield {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    ops.clear_kernels()


def test_pair_tiles_put_a_k_pair_of_16_rows_in_one_vector():
    """Bytes ``2i, 2i+1`` of group ``p`` of tile ``t``: the codes of row ``16t + i`` at K ``2p, 2p+1``
    (4-bit: the low nibbles those of K ``4p, 4p+1``, the high ones of ``4p+2, 4p+3``); scales
    ``[n/16, k/32, 16]``, blocks of 64 repeated per 32."""
    g = torch.Generator().manual_seed(0)
    n, k = 32, 128
    for bits in (4, 6, 8):
        codes = torch.randint(0, 2**bits, (n, k), generator=g, dtype=torch.uint8)
        tiles = layout.pair_tiles(layout.cpu_planes(packing.pack(codes, bits), bits)[0], bits)
        t, p, r = 1, 37, 5
        row = codes[16 * t + r]
        if bits == 4:
            p //= 2
            assert tiles.shape == (n // 16, k // 4, 32)
            lo, hi = tiles[t, p, 2 * r : 2 * r + 2] & 15, tiles[t, p, 2 * r : 2 * r + 2] >> 4
            assert (
                lo.tolist() == row[4 * p : 4 * p + 2].tolist()
                and hi.tolist() == row[4 * p + 2 : 4 * p + 4].tolist()
            )
        else:
            assert tiles.shape == (n // 16, k // 2, 32)
            assert tiles[t, p, 2 * r : 2 * r + 2].tolist() == row[2 * p : 2 * p + 2].tolist()
    scales = torch.randint(0, 256, (n, k // 64), generator=g, dtype=torch.uint8)
    st = layout.scale_tiles(scales, 64)
    assert st.shape == (n // 16, k // 32, 16)
    assert st[1, 3, 5] == scales[21, 1] and st[1, 2, 5] == scales[21, 1] and st[0, 0, 0] == scales[0, 0]


@pytest.mark.parametrize(
    ("target", "dtype"),
    [(ZEN5, "bfloat16"), (ZEN5, "float16"), (ICELAKE, "bfloat16")],
    ids=["dot", "fp16", "fma"],
)
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3"])
def test_the_kernel_is_dot_products_fed_by_register_table_lookups(fmt, target, dtype):
    """Built on any host: the LLVM IR looks codes up with ``vpermw`` (up to 32 codes) or ``vpermi2w``
    (64 a table: 6-bit codes one, 8-bit four), then multiplies with ``vdpbf16ps`` for bf16 rows on
    a Zen 5, else with fp32 multiply-adds (fp16 rows; a CPU without AVX512-BF16)."""
    kernel = mxgemm.build(fmt, n=64, k=256, m_bucket=None, a_dtype=dtype, target=target)
    assert kernel.rule == "cpu_dot"
    src = kernel.source
    dots = "@llvm.x86.avx512bf16.dpbf16ps.512" in src
    assert dots == (target is ZEN5 and dtype == "bfloat16")
    assert dots or "@llvm.fma.v16f32" in src
    lookup = "permvar.hi.512" if formats.get(fmt).bits <= 5 else "vpermi2var.hi.512"
    assert f"@llvm.x86.avx512.{lookup}" in src


def test_the_table_holds_every_code_value_exactly_in_bf16():
    for fmt in DOT_FORMATS:
        f = formats.get(fmt)
        values = torch.tensor(cpu_dot.table(f), dtype=torch.int16).view(torch.bfloat16).float()
        codes = torch.arange(len(values)) % (2 ** (f.bits - (f.bits == 8 and f.kind == "float")))
        want = f.decode(codes.to(torch.uint8)).float()
        assert torch.equal(values.nan_to_num(7.0), want.nan_to_num(7.0)), fmt


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("fmt", DOT_FORMATS)
def test_one_hot_rows_give_every_code_and_scale_bit_exactly(fmt, bias, mode):
    """Random codes of every value, scale codes 0 (2**-127) through 254, 7 one-hot rows (a 4-row
    tile and 3 rows one at a time): each output row is W's column, rounded once to bf16 (plus the
    bias, added in fp32 before that rounding)."""
    f = formats.get(fmt)
    n, k = 64, 256
    fp16_max = 127 + 15 - f.emax - 1  # fp16 rows: weights within fp16's range
    q = every_code_weight(fmt, n, k, 5, fp16_max if mode is torch.float16 else 254)
    g = torch.Generator().manual_seed(6)
    assert ops.plan(7, "llvm", fmt, n, k, str(mode).split(".")[1]) == ("linear", None)
    cols = torch.tensor([0, 1, 31, 32, 100, 201, 255])
    x = torch.eye(k, dtype=mode)[cols]
    b = torch.randn(n, generator=g).to(mode) if bias else None
    y = mxgemm.linear(x, q, b)
    kernel = ops._routes[(7, x.device, x.dtype, fmt, n, k, bias, 32, None)]
    assert kernel.rule == "cpu_dot"
    want = mxgemm.dequantize(q)[:, cols].T
    want = want + b.float() if bias else want
    assert torch.equal(y, want.to(mode)), fmt


@pytest.mark.parametrize("fmt", DOT_FORMATS)
def test_ragged_rows_and_blocks_match_the_reference(fmt, mode):
    """5, 17 and 70 rows (a row group of 64 and a tail), with and without bias, blocks of 32 and 64,
    on N = 48 (one 16-column group a task) and 96."""
    for n, k, block, m, bias in ((96, 384, 32, 5, True), (48, 256, 64, 17, False), (96, 128, 32, 70, True)):
        q = _weights(fmt, n, k, block)
        g = torch.Generator().manual_seed(m)
        x = torch.randn(m, k, generator=g).to(mode)
        b = torch.randn(n, generator=g).to(mode) if bias else None
        _check(x, q, b, mxgemm.linear(x, q, b))
        assert ops._routes[(m, x.device, x.dtype, fmt, n, k, bias, block, None)].rule == "cpu_dot"


def test_a_cpu_that_hides_its_bf16_dots_gets_no_bf16_dot_kernels(monkeypatch):
    """This machine's target drops the features its CPU model has but the running CPU does not report
    (a VM may hide some): no ``vdpbf16ps`` kernel for it, and its kernels are cached apart."""
    from mxgemm import system

    model = {"kind": "llvm", "mcpu": "znver5"}

    def host(flags):
        targets.cpu.cache_clear()
        monkeypatch.setattr(system, "cpu_flags", lambda: frozenset(flags))
        from tvm.target import codegen

        monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: "znver5")
        return targets.cpu()

    try:
        hidden = host({"avx512f", "avx512bw", "avx2", "fma", "f16c"})
        assert hidden == {**model, "mattr": ["-avx512bf16"]}
        assert not targets.cpu_bf16_dots(hidden) and targets.cpu_word_lookups(hidden)
        assert host({"avx512f", "avx512bw", "avx512_bf16", "avx2", "fma", "f16c"}) == model
        assert host(()) == model  # flags unreadable: the model decides
        assert targets.cpu_bf16_dots(model)
    finally:
        targets.cpu.cache_clear()


def test_tune_on_this_cpu_tunes_the_one_dynamic_m_kernel(tmp_path, capsys):
    """`mxgemm tune --arch llvm` where `cpu_dot` serves every M: one task a shape and format, its rule's
    hints, the table saying "any M"; the log's record then steers the kernel `mxgemm.linear` runs."""
    from mxgemm import cli, tunelog

    if not targets.cpu_word_lookups(targets.cpu()):
        pytest.skip("this CPU has no AVX-512 BW: cpu_dot does not run here")
    log = tmp_path / "log.json"
    args = ["tune", "--shapes", "64,256", "--format", "mxfp4", "--m", "1,16,300", "--arch", "llvm"]
    assert cli.main([*args, "--a-dtype", "bfloat16", "--budget", "3", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "1 task(s) to tune" in out and "any M (one dynamic-M kernel)" in out
    (rec,) = tunelog.read(log)
    assert rec.rule == "cpu_dot" and rec.m_bucket is None and set(rec.config) == {"mr", "nr", "kc"}
    assert rec.us > 0
