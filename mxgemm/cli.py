"""The `mxgemm` command line: `info` (more subcommands arrive with their features)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import mxgemm
from mxgemm import system


def _info(_: argparse.Namespace) -> int:
    rows = [("mxgemm", mxgemm.__version__)]
    try:
        rows += [(f"tvm {k}", v) for k, v in system.tvm_info().items()]
    except ImportError as e:
        rows.append(("tvm", f"not importable: {e}"))
    rows += [
        ("torch", torch.__version__),
        ("torch CUDA", torch.version.cuda or "none (CPU build)"),
        ("nvcc", system.nvcc_version() or "not found (CUDA kernels need nvcc; CPU kernels still work)"),
        ("GPUs", ", ".join(system.gpus()) or "none visible"),
        ("formats", ", ".join(mxgemm.formats.names())),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from mxgemm import demo

    demo.run(args.model)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mxgemm", description=mxgemm.__doc__)
    p.add_argument("--version", action="version", version=f"mxgemm {mxgemm.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions of mxgemm/TVM/torch/CUDA/nvcc and visible GPUs").set_defaults(
        func=_info
    )
    d = sub.add_parser("demo", help="quantize a real checkpoint's weights in every format, report SQNR")
    d.add_argument("--model", type=Path, default=None, help="HF model dir (default: bundled MiniLM)")
    d.set_defaults(func=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
