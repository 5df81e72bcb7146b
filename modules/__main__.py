"""Command line: ``int4-moe demo`` (also ``python -m modules demo``)."""

import argparse
import sys
from collections.abc import Sequence

import torch

from modules.demo import MODELS, DemoOptions, parse_scheme, run_demo

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _best_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return "cpu"


def build_parser() -> argparse.ArgumentParser:
    """The ``int4-moe`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="int4-moe", description="int4 MoE layers for PyTorch"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="quantize a real-shaped MoE layer, run it, report error, memory and speed",
    )
    demo.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="qwen3-30b-a3b",
        help="layer shape; `tiny` is a small one for quick checks",
    )
    demo.add_argument("--tokens", type=int, default=16)
    demo.add_argument(
        "--scheme",
        type=parse_scheme,
        default="sym-g32",
        help="e.g. sym-g32, asym-g128, sym-g-1",
    )
    demo.add_argument("--backend", default="auto")
    demo.add_argument("--device", default="auto", help="auto, cpu, cuda, xpu")
    demo.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    demo.add_argument("--iters", type=int, default=10)
    demo.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    options = DemoOptions(
        model=args.model,
        tokens=args.tokens,
        scheme=args.scheme,
        backend=args.backend,
        device=_best_device() if args.device == "auto" else args.device,
        dtype=_DTYPES[args.dtype],
        iters=args.iters,
        seed=args.seed,
    )
    run_demo(options, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
