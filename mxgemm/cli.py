"""The `mxgemm` command line: `info`, `demo` (the main job), `pack`, `bench`, `tune`.

torch and TVM are imported by the commands that need them, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mxgemm
from mxgemm import formats
from mxgemm.options import A_DTYPE_NAMES, ROUNDINGS, SCALE_MODES


def _info(_: argparse.Namespace) -> int:
    import torch

    from mxgemm import system

    rows = [("mxgemm", mxgemm.__version__)]
    try:
        rows += [(f"tvm {k}", v) for k, v in system.tvm_info().items()]
    except ImportError as e:
        rows.append(("tvm", f"not importable: {e}"))
    rows += [
        ("torch", torch.__version__),
        ("torch CUDA", torch.version.cuda or "none (CPU build)"),
        (
            "nvcc",
            system.nvcc_version()
            or "not found (new CUDA kernels need it; cached ones and CPU kernels do not)",
        ),
        ("GPUs", ", ".join(system.gpus()) or "none visible"),
        ("formats", ", ".join(formats.names())),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    given = [
        k for k in ("build_only", "formats", "out", "new_tokens", "device") if getattr(args, k) is not None
    ]
    speed_opts = ["--" + k.replace("_", "-") for k in given if getattr(args, k) is not False]
    if args.speed_only or speed_opts:
        if not args.speed_only:
            return _demo_error(f"{', '.join(speed_opts)} go with --speed-only")
        if args.minilm or args.model is not None:
            return _demo_error("--speed-only times the LLM demo's model, not --minilm/--model")
        return _demo_speed(args)
    if args.minilm or args.model is not None:
        from mxgemm import demo

        demo.run(args.model)
    else:
        from mxgemm import demo_llm

        demo_llm.run()
    return 0


def _demo_error(message: str) -> int:
    print(f"mxgemm demo: error: {message}", file=sys.stderr)
    return 2


def _demo_formats(text: str | None) -> tuple[str, ...] | None:
    """``--formats`` → a tuple of ``fmt`` / ``fmt:scale_mode`` (None: the default); ValueError names a
    bad one."""
    if text is None:
        return None
    out = tuple(f.strip() for f in text.split(",") if f.strip())
    for spec in out:
        name, _, mode = spec.partition(":")
        if name not in formats.names():
            raise ValueError(f"unknown format {name!r} in --formats; one of {', '.join(formats.names())}")
        if mode and mode not in SCALE_MODES:
            raise ValueError(f"unknown scale mode {mode!r} in --formats; one of {', '.join(SCALE_MODES)}")
    if not out:
        raise ValueError("--formats is empty")
    return out


def _demo_speed(args: argparse.Namespace) -> int:
    """``mxgemm demo --speed-only [--build-only]``."""
    try:
        fmts = _demo_formats(args.formats)
        if args.new_tokens is not None and args.new_tokens < 2:
            raise ValueError(
                f"--new-tokens must be at least 2 (the first is not timed), got {args.new_tokens}"
            )
    except ValueError as e:
        return _demo_error(str(e))
    from mxgemm import demo_speed

    fmts = fmts or demo_speed.SPEED_FORMATS
    if args.build_only:
        from mxgemm import bench

        try:
            specs = demo_speed.build_specs(fmts, args.arch)
        except ValueError as e:
            return _demo_error(str(e))
        bench.build_only(specs, jobs=args.jobs)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        return _demo_error("--device cuda: torch sees no CUDA GPU")
    kwargs = {} if args.new_tokens is None else {"new_tokens": args.new_tokens}
    demo_speed.speed_only(args.device, fmts, out_dir=args.out, **kwargs)
    return 0


def _activations(spec: str | None):
    """``--activations FMT[:SCALE_MODE]`` → MxActConfig or None (ValueError names what is wrong)."""
    from mxgemm.config import MxActConfig

    if spec is None:
        return None
    fmt, _, scale_mode = spec.partition(":")
    return MxActConfig(fmt, scale_mode=scale_mode or "floor")


def _pack(args: argparse.Namespace) -> int:
    from mxgemm.config import MxConfig
    from mxgemm.pack import PackError, pack

    try:
        config = MxConfig(
            fmt=args.format,
            block_size=args.block_size,
            scale_mode=args.scale_mode,
            rounding=args.rounding,
            a_dtype=args.a_dtype,
            modules_to_not_convert=[*MxConfig().modules_to_not_convert, *args.skip],
            seed=args.seed,
            activations=_activations(args.activations),
        )
    except ValueError as e:
        print(f"mxgemm pack: error: {e}", file=sys.stderr)
        return 2
    try:
        report = pack(args.model_dir, args.output, config, output_format=args.output_format)
    except (PackError, OSError) as e:
        print(f"mxgemm pack: error: {e}", file=sys.stderr)
        return 2
    print(report.table())
    print(report.summary())
    return 0


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def _bench(args: argparse.Namespace) -> int:
    import torch

    from mxgemm import bench

    if args.stack:
        return _bench_stack(args)
    args.a_dtype = args.a_dtype or "float16"
    if args.device == "cpu":
        return _bench_cpu(args)
    shapes = tuple(_ints(s) for s in args.shapes) if args.shapes else bench.SHAPES
    fmts = tuple(args.formats.split(",")) if args.formats else bench.FORMATS
    ms = _ints(args.m) if args.m else bench.MS
    if args.build_only:
        specs = bench.build_specs(shapes, ms, fmts, args.a_dtype, args.arch)
        if args.twin_dtype:
            specs += bench.build_specs(shapes, ms, fmts, bench.other_dtype(args.a_dtype), args.arch)
        defaults = None  # (the mxgemm_default rows' kernels: their routes may differ from the tuned)
        if args.compare_default:
            defaults = bench.build_specs(shapes, ms, fmts, args.a_dtype, args.arch, tuned=False)
        bench.build_only(specs, jobs=args.jobs, defaults=defaults)
        return 0
    if not torch.cuda.is_available():
        print(
            "mxgemm bench: error: needs a CUDA GPU (use --build-only to build its kernels here)",
            file=sys.stderr,
        )
        return 2
    bench.run(
        shapes,
        ms,
        fmts,
        args.a_dtype,
        args.out,
        emulated=not args.no_emulated,
        compare_default=args.compare_default,
        peers=args.peers,
        twin=args.twin_dtype,
    )
    return 0


def _bench_cpu(args: argparse.Namespace) -> int:
    from mxgemm import bench_cpu

    bench_cpu.run(
        tuple(_ints(s) for s in args.shapes) if args.shapes else bench_cpu.SHAPES,
        _ints(args.m) if args.m else bench_cpu.MS,
        tuple(args.formats.split(",")) if args.formats else bench_cpu.FORMATS,
        out_dir=args.out,
    )
    return 0


def _bench_stack(args: argparse.Namespace) -> int:
    import torch

    from mxgemm import bench, bench_stack

    fmt = args.formats.split(",")[0] if args.formats else "mxfp4"
    ms = _ints(args.m) if args.m else bench_stack.MS
    dtypes = (args.a_dtype,) if args.a_dtype else bench_stack.DTYPES
    if args.build_only:
        specs = bench_stack.build_specs(fmt, args.arch, ms, dtypes, args.model)
        bench.build_only(specs, jobs=args.jobs)
        return 0
    if not torch.cuda.is_available():
        print("mxgemm bench: error: needs a CUDA GPU (--build-only builds its kernels here)", file=sys.stderr)
        return 2
    bench_stack.run(fmt, ms, dtypes, out_dir=args.out, model_name=args.model)
    return 0


def _budget(text: str) -> tuple[int, float | None]:
    """``"8"`` → 8 candidates per task; ``"60s"`` → every candidate, at most 60 s of measuring a task."""
    try:
        return (64, float(text[:-1])) if text.endswith("s") else (int(text), None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"budget must be a count (8) or seconds (60s), got {text!r}"
        ) from None


def _tune(args: argparse.Namespace) -> int:
    import os
    import tempfile

    import torch

    from mxgemm import tune, tunelog

    try:
        if args.merge:
            winners = tune.merge(args.merge, args.log or tunelog.user_log(args.arch), args.replace)
            print(f"merged {len(winners)} records into {args.log or tunelog.user_log(args.arch)}")
            return 0
        if args.measure:
            return _tune_measure(args, args.measure)
        shapes = tune.model_shapes(args.model) if args.model else [_ints(s) for s in args.shapes or []]
        if not shapes:
            raise tune.TuneError("give --model MODEL_DIR or --shapes N,K ...")
        fmts = args.format.split(",") if args.format else list(formats.names())
        if args.arch == "llvm":
            from mxgemm.codegen import build as builder
            from mxgemm.codegen import target as targets

            args.arch = builder.arch_name(targets.cpu())
        remote = args.rpc is not None
        if remote and not args.build_only:  # before a build that would be wasted
            from mxgemm import tune_rpc

            tune_rpc.check_fleet(args.rpc, args.rpc_key)
        if (
            not args.arch.startswith("llvm")
            and not (args.build_only or remote)
            and not torch.cuda.is_available()
        ):
            raise tune.TuneError(
                f"measuring {args.arch} kernels needs a CUDA GPU: measure through RPC servers on GPU boxes "
                "(--rpc HOST:PORT --rpc-key KEY), or build with --build-only DIR here, then run "
                "--measure DIR on the GPU box and --merge DIR"
            )
        todo, notes = tune.tasks(shapes, fmts, _ints(args.m), args.a_dtype, args.arch)
        for note in notes:
            print(f"note: {note}")
        log = Path(args.log) if args.log else tunelog.user_log(args.arch)
        todo = todo if args.replace else tune.pending(todo, log)  # --replace: re-tune what the log has
        print(f"{len(todo)} task(s) to tune ({len(shapes)} shape(s) x {len(fmts)} format(s)); log {log}")
        if not todo:
            return 0
        count = args.budget[0]
        n_cands = sum(len(tune.candidates(t, count)) for t in todo)
        if args.build_only:
            os.environ["MXGEMM_CACHE_DIR"] = args.build_only  # the kernels travel with the manifest
            _tune_build(args, todo, Path(args.build_only), n_cands)
            print(f"built {n_cands} candidate kernels into {args.build_only}; next: --measure there")
            return 0
        with tempfile.TemporaryDirectory(prefix="mxgemm-tune-") as kdir:  # manifest + measurements
            _tune_build(args, todo, Path(kdir), n_cands)
            try:
                _tune_measure(args, kdir)
            except tune.TuneError as e:  # keep the tasks measured whole: a rerun skips them
                done = Path(kdir) / tune.MEASUREMENTS
                kept = tune.merge(kdir, log) if done.exists() and tunelog.read(done) else []
                raise tune.TuneError(f"{e}; merged {len(kept)} records into {log}") from None
            winners = tune.merge(kdir, log, args.replace)
        print(f"merged {len(winners)} records into {log}")
    except (tune.TuneError, ValueError) as e:
        print(f"mxgemm tune: error: {e}", file=sys.stderr)
        return 2
    return 0


def _rpc_server(args: argparse.Namespace) -> int:
    import logging

    from mxgemm import tune, tune_rpc

    logging.basicConfig(level=logging.INFO)
    try:
        tune_rpc.serve(args.tracker, args.key, args.host, args.port, args.port_end)
    except (tune.TuneError, ValueError) as e:
        print(f"mxgemm rpc-server: error: {e}", file=sys.stderr)
        return 2
    return 0


def _tune_build(args: argparse.Namespace, todo, kdir: Path, n_cands: int) -> None:
    from tqdm import tqdm

    from mxgemm import tune

    with tqdm(total=n_cands, desc="build", unit="kernel") as bar:
        tune.build(todo, args.budget[0], kdir, jobs=args.jobs, progress=lambda e: bar.update())


def _tune_measure(args: argparse.Namespace, kdir) -> int:
    from tqdm import tqdm

    from mxgemm import tune

    with tqdm(desc="measure", unit="kernel") as bar:
        if args.rpc is not None:
            from mxgemm import tune_rpc

            records = tune_rpc.measure(
                kdir, args.rpc, args.rpc_key, args.rpc_workers, args.budget[1], lambda r: bar.update()
            )
        else:
            records = tune.measure(kdir, seconds=args.budget[1], progress=lambda r: bar.update())
    print(tune.summary(records))
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(tune.summary(records) + "\n")
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    """The ``demo`` subcommand's options."""
    d = sub.add_parser(
        "demo",
        help="the main job: pack SmolLM2-135M-Instruct per format, run it (perplexity, greedy answer, "
        "tokens/s; on a GPU also eager vs CUDA graph next to fp16) next to fp32; --speed-only: the tokens/s "
        "table alone, random weights, no GGUF; --minilm: the sentence-encoder demo",
    )
    d.add_argument(
        "--minilm", action="store_true", help="the small encoder demo instead (all-MiniLM-L6-v2, embeddings)"
    )
    d.add_argument("--model", type=Path, default=None, help="HF encoder dir for --minilm (default: bundled)")
    d.add_argument(
        "--speed-only",
        action="store_true",
        help="only the decode tokens/s table (batch 1, greedy, 16-token prompt), of SmolLM2-135M-Instruct's "
        "architecture with seeded random weights (no GGUF file, no tokenizer): the reference (fp16 on a GPU, "
        "fp32 on CPU) and each of --formats, eager and, on a GPU, with the decode step in a CUDA graph",
    )
    d.add_argument(
        "--formats",
        metavar="FMT[:SCALE_MODE],...",
        help="--speed-only: comma list of formats (default mxfp4,mxfp8_e4m3)",
    )
    d.add_argument("--new-tokens", type=int, default=None, help="--speed-only: tokens generated (default 24)")
    d.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="--speed-only: default cuda if present"
    )
    d.add_argument(
        "--out", type=Path, default=None, help="--speed-only: also write OUT/demo-speed.{txt,json}"
    )
    _add_build_only(
        d,
        "--speed-only: only build the CUDA kernels its GPU run needs (every Linear shape x format x "
        "M 1 and 16, fp16) into the kernel cache ($MXGEMM_CACHE_DIR): nvcc, no GPU",
    )
    d.set_defaults(func=_demo)


def _add_build_only(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--build-only`` (``help_text``) and the ``--arch`` / ``--jobs`` of its builds."""
    p.add_argument("--build-only", action="store_true", help=help_text)
    p.add_argument("--arch", default="sm_90", help="CUDA arch for --build-only")
    p.add_argument("--jobs", type=int, default=2, help="parallel builds for --build-only")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    """The ``bench`` subcommand's options."""
    b = sub.add_parser(
        "bench", help="time mxgemm kernels vs cuBLAS and the emulated path on a GPU, or vs torch on CPU"
    )
    b.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: the CPU kernels vs torch fp32/bf16 F.linear and torch's int4 kernel (default shapes "
        "4096,4096 and 14336,4096; M 1,4,16,64,256; formats mxfp4,mxfp8_e4m3; bf16 activations)",
    )
    b.add_argument("--shapes", nargs="*", help="N,K pairs (default: the 5 Llama-style bench shapes)")
    b.add_argument("--m", help="comma list of M (default 1,2,4,...,4096)")
    b.add_argument(
        "--formats", help="comma list of formats (default mxfp4,mxfp6_e2m3,mxfp8_e4m3,mxint8,bfp8)"
    )
    b.add_argument(
        "--a-dtype", choices=A_DTYPE_NAMES, help="activation dtype (default float16; --stack: both)"
    )
    b.add_argument("--out", default="benchmarks/results", help="results root (a folder per GPU below it)")
    b.add_argument("--no-emulated", action="store_true", help="skip the dequantize + F.linear baseline")
    b.add_argument(
        "--compare-default",
        action="store_true",
        help="also time the kernels with the rules' default hints (mxgemm_default rows): the tuning gain",
    )
    b.add_argument(
        "--peers",
        action="store_true",
        help="also time the peers in the same run: torch's int4 tinygemm (group 32; bf16 runs) and, where "
        "installed (pip install 'mxgemm[peers]'), GemLite's A16W4_MXFP / A16W8_MXFP layers",
    )
    b.add_argument(
        "--twin-dtype",
        action="store_true",
        help="also time the other activation dtype's kernels beside each of this dtype's (mxgemm_bf16 / "
        "mxgemm_fp16 rows, against cuBLAS of their dtype) and tabulate bf16 time over fp16",
    )
    b.add_argument(
        "--stack",
        action="store_true",
        help="time what a model sees instead: two decoder layers' projections (--model) as MxLinear vs "
        "nn.Linear, eager / CUDA graph / torch.compile, fp16 and bf16 (first of --formats, default mxfp4)",
    )
    b.add_argument(
        "--model",
        choices=("llama-3-8b", "qwen2.5-7b", "llama-2-13b"),
        default="llama-3-8b",
        help="--stack: whose decoder layers (default llama-3-8b; qwen2.5-7b's q, k, v add a bias)",
    )
    _add_build_only(b, "only build the kernels (no GPU needed)")
    b.set_defaults(func=_bench)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mxgemm", description=mxgemm.__doc__)
    p.add_argument("--version", action="version", version=f"mxgemm {mxgemm.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions of mxgemm/TVM/torch/CUDA/nvcc and visible GPUs").set_defaults(
        func=_info
    )
    _add_demo(sub)
    k = sub.add_parser("pack", help="quantize a Hugging Face model directory's linear weights (safetensors)")
    k.add_argument(
        "model_dir",
        type=Path,
        metavar="MODEL_DIR",
        help="HF model dir: config.json + model.safetensors or shards + index",
    )
    k.add_argument("--format", required=True, choices=formats.names(), help="element format")
    k.add_argument("--block-size", type=int, default=None, help="elements per scale (default: the format's)")
    k.add_argument("--scale-mode", default="floor", choices=SCALE_MODES, help="shared exponent rule")
    k.add_argument("--rounding", default="even", choices=ROUNDINGS, help="element rounding")
    k.add_argument(
        "--seed", type=int, default=None, help="random seed of --rounding stochastic (required there)"
    )
    k.add_argument("--a-dtype", default="bfloat16", choices=A_DTYPE_NAMES, help="activation dtype")
    k.add_argument(
        "--activations",
        metavar="FMT[:SCALE_MODE]",
        help="also quantize each layer's input on the fly to this format (blocks of 32 along K)",
    )
    k.add_argument(
        "--skip",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="module names (or dotted suffixes) to leave in full precision, besides lm_head",
    )
    k.add_argument(
        "-o", "--output", type=Path, required=True, metavar="OUT_DIR", help="new or empty output directory"
    )
    k.add_argument(
        "--output-format",
        default="mxgemm",
        choices=("mxgemm", "compressed-tensors", "gpt-oss"),
        help="mxgemm's checkpoint, compressed-tensors' (vLLM; mxfp4, mxfp6_e2m3, mxfp8_e4m3, block 32), or "
        "GPT-OSS' (transformers quant_method mxfp4; mxfp4, block 32)",
    )
    k.set_defaults(func=_pack)
    _add_bench(sub)
    t = sub.add_parser(
        "tune",
        help="offline autotuning: build candidate schedules, measure them, keep the fastest in a tune log",
    )
    src = t.add_mutually_exclusive_group()
    src.add_argument(
        "--model", type=Path, help="HF model dir: its config.json gives q/k/v/o/gate/up/down shapes"
    )
    src.add_argument("--shapes", nargs="+", help="N,K pairs")
    t.add_argument("--format", help="comma list of formats (default: all)")
    t.add_argument("--m", default=",".join(map(str, (1, 16, 64, 256, 1024, 4096))), help="comma list of M")
    t.add_argument(
        "--arch",
        default="sm_90",
        help="sm_80, sm_90, ... or llvm (this CPU; CPU kernels serve every M, so --m folds into one task)",
    )
    t.add_argument("--a-dtype", default="float16", choices=A_DTYPE_NAMES)
    t.add_argument(
        "--budget", type=_budget, default=(8, None), help="candidates per task (8) or seconds (60s)"
    )
    t.add_argument(
        "--log",
        help="tune log to merge into (default: the arch's user log, $MXGEMM_TUNE_LOG or "
        "<user data dir>/mxgemm/tune_logs/ARCH.json, which every later build on this machine reads; "
        "give --log FILE to keep the results apart)",
    )
    t.add_argument(
        "--replace",
        action="store_true",
        help="the run's winners replace the log's records of their tasks, even faster ones (which another "
        "card or day measured; a task's candidates include the log's hints, so the run measured those too)",
    )
    t.add_argument("--jobs", type=int, default=2, help="parallel builds")
    t.add_argument("--table", help="also write the tuned-vs-default markdown table here")
    step = t.add_mutually_exclusive_group()
    step.add_argument(
        "--build-only", metavar="DIR", help="only build the candidates into DIR (no GPU needed)"
    )
    step.add_argument("--measure", metavar="DIR", help="only measure the candidates built into DIR")
    step.add_argument("--merge", metavar="DIR", help="only merge DIR's measurements into the log")
    t.add_argument(
        "--rpc",
        metavar="HOST:PORT",
        help="measure on the RPC servers of this TVM tracker (`mxgemm rpc-server`), built here",
    )
    t.add_argument("--rpc-key", metavar="KEY", help="the device key the servers registered under")
    t.add_argument("--rpc-workers", type=int, default=1, metavar="N", help="tasks measured at once")
    t.set_defaults(func=_tune)
    r = sub.add_parser(
        "rpc-server",
        help="serve `mxgemm tune --rpc` measurements on this box: a TVM RPC server registered with a tracker",
    )
    r.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the TVM RPC tracker")
    r.add_argument("--key", required=True, help="device key, e.g. h100 or llvm-znver5")
    r.add_argument("--host", default="0.0.0.0", help="address to listen on")
    r.add_argument("--port", type=int, default=9090, help="first port to try")
    r.add_argument("--port-end", type=int, default=9199, help="end of the port range to try")
    r.set_defaults(func=_rpc_server)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
