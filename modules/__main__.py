"""Command line: ``int4-moe demo`` (also ``python -m modules demo``)."""

import argparse
import sys
from collections.abc import Sequence

import torch

from backends.registry import available_backends, is_known_backend
from core.errors import BackendUnavailableError
from core.scheme import Int4Scheme
from modules.demo import MODELS, DemoOptions, parse_scheme, run_demo

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _is_available(device_type: str) -> bool:
    """Whether this machine has a ``device_type`` (`cpu`, `cuda`, `xpu`) device."""
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)
    return bool(module is not None and module.is_available())


def _best_device() -> str:
    return next(t for t in ("cuda", "xpu", "cpu") if _is_available(t))


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _scheme(text: str) -> Int4Scheme:
    """``parse_scheme`` for argparse, which shows an ``ArgumentTypeError``'s reason."""
    try:
        return parse_scheme(text)
    except ValueError as err:  # ConfigError and ShapeError are ValueErrors too
        raise argparse.ArgumentTypeError(str(err)) from err


def _backend(text: str) -> str:
    """`auto` or a registered backend name.

    Whether it runs the layer is checked by ``run_demo``, before any quantizing.
    """
    if not is_known_backend(text):
        raise argparse.ArgumentTypeError(
            f"must be `auto` or one of {', '.join(available_backends())}, got {text!r}"
        )
    return text


def _device(text: str) -> str:
    """`auto`, or a `cpu` / `cuda[:N]` / `xpu[:N]` device this machine has."""
    if text == "auto":
        return _best_device()
    device_type = text.partition(":")[0]
    if device_type not in ("cpu", "cuda", "xpu"):
        raise argparse.ArgumentTypeError(
            f"must be `auto`, `cpu`, `cuda` or `xpu`, got {text!r}"
        )
    if not _is_available(device_type):
        raise argparse.ArgumentTypeError(
            f"must be a device this machine has, got {text!r} (no {device_type} "
            "device is available)"
        )
    try:
        torch.device(text)
    except RuntimeError as err:
        raise argparse.ArgumentTypeError(
            f"must be a device string like `cuda:0`, got {text!r}"
        ) from err
    return text


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
    demo.add_argument("--tokens", type=_positive_int, default=16)
    demo.add_argument(
        "--scheme",
        type=_scheme,
        default="sym-g32",
        help="e.g. sym-g32, asym-g128, sym-g-1",
    )
    demo.add_argument(
        "--backend", type=_backend, default="auto", help="auto or a backend name"
    )
    demo.add_argument(
        "--device", type=_device, default="auto", help="auto, cpu, cuda[:N], xpu[:N]"
    )
    demo.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    demo.add_argument("--iters", type=_positive_int, default=10)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(subparser=demo)  # its errors show its own usage line
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    options = DemoOptions(
        model=args.model,
        tokens=args.tokens,
        scheme=args.scheme,
        backend=args.backend,
        device=args.device,
        dtype=_DTYPES[args.dtype],
        iters=args.iters,
        seed=args.seed,
    )
    try:
        run_demo(options, sys.stdout)
    except BackendUnavailableError as err:  # refused before any expert is quantized
        args.subparser.error(f"argument --backend: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
