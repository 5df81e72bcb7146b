"""Reading a checkpoint's ``quantization_config`` and importing one projection by format.

Pure: parses plain dicts (the ``config.json`` entry) and dispatches to the GPTQ, AWQ
and compressed-tensors importers. Imports only torch, attrs and core.
"""

from collections.abc import Mapping
from typing import Literal, TypeAlias

import attrs
import torch

from core.errors import ConfigError
from core.formats.awq import from_awq
from core.formats.compressed_tensors import from_compressed_tensors
from core.formats.gptq import from_gptq
from core.formats.projection import Int4Projection

CheckpointFormat: TypeAlias = Literal["auto", "gptq", "awq", "compressed-tensors"]

SUFFIXES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # format: (required tensor suffixes, optional ones)
    "gptq": (("qweight", "scales"), ("qzeros", "g_idx")),
    "awq": (("qweight", "scales", "qzeros"), ()),
    "compressed-tensors": (
        ("weight_packed", "weight_scale"),
        ("weight_zero_point", "weight_shape", "weight_g_idx"),
    ),
}
"""Tensor names under each projection, per format: (required, optional)."""


@attrs.frozen(kw_only=True)
class FormatOptions:
    """What a checkpoint's ``quantization_config`` says about its int4 tensors.

    Attributes:
        format: `gptq`, `awq` or `compressed-tensors`.
        group_size: declared group size (``-1``: whole rows; ``None``: from shapes).
        symmetric: declared symmetry, ``None`` when not said.
        checkpoint_format: GPTQ only: `gptq` (v1, zero points minus one) or `gptq_v2`.
    """

    format: str
    group_size: int | None = None
    symmetric: bool | None = None
    checkpoint_format: str = "gptq"


def _method(config: Mapping[str, object]) -> str:
    method = str(config.get("quant_method", "")).lower().replace("_", "-")
    if method not in SUFFIXES:
        raise ConfigError(
            "quantization_config quant_method must be `gptq`, `awq` or "
            f"`compressed-tensors`, got {config.get('quant_method')!r}"
        )
    return method


def _int4(name: str, bits: object) -> None:
    if bits != 4:
        raise ConfigError(f"{name} must be 4 for int4 experts, got {bits!r}")


def parse_quantization_config(
    config: Mapping[str, object] | None, fmt: CheckpointFormat
) -> FormatOptions | None:
    """Options from ``quantization_config``; ``None`` when neither it nor ``fmt`` says.

    Raises:
        ConfigError: for a non-int4 or unknown layout, or when ``fmt`` contradicts it.
    """
    if config is None:
        return None if fmt == "auto" else FormatOptions(format=fmt)
    method = _method(config)
    if fmt not in ("auto", method):
        raise ConfigError(
            f"format={fmt!r} contradicts quantization_config quant_method={method!r}"
        )
    if method == "gptq":
        _int4("quantization_config bits", config.get("bits", 4))
        sym = config.get("sym")
        return FormatOptions(
            format=method,
            group_size=_opt_int(config.get("group_size")),
            symmetric=sym if isinstance(sym, bool) else None,
            checkpoint_format=str(config.get("checkpoint_format", "gptq")),
        )
    if method == "awq":
        return _awq_options(config)
    return _ct_options(config)


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _awq_options(config: Mapping[str, object]) -> FormatOptions:
    _int4("quantization_config bits", config.get("bits", config.get("w_bit", 4)))
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise ConfigError(
            f"AWQ version must be `gemm` (the packed layout read here), got {version!r}"
        )
    if config.get("zero_point", True) is not True:
        raise ConfigError(
            "AWQ without zero points (zero_point=false) is not a known layout"
        )
    group = config.get("group_size", config.get("q_group_size"))
    return FormatOptions(format="awq", group_size=_opt_int(group))


def _ct_options(config: Mapping[str, object]) -> FormatOptions:
    groups = config.get("config_groups")
    args = (
        next(
            (
                g["weights"]
                for g in groups.values()
                if isinstance(g, dict) and g.get("weights")
            ),
            None,
        )
        if isinstance(groups, dict)
        else None
    )
    if not isinstance(args, dict):
        raise ConfigError(
            "compressed-tensors quantization_config has no config_groups weights"
        )
    fmt = str(config.get("format", "pack-quantized"))
    if fmt != "pack-quantized":
        raise ConfigError(
            f"compressed-tensors format must be `pack-quantized`, got {fmt!r}"
        )
    _int4("config_groups weights num_bits", args.get("num_bits"))
    if args.get("type", "int") != "int" or args.get("strategy") not in (
        "group",
        "channel",
    ):
        raise ConfigError(
            "compressed-tensors weights must be type `int` with strategy `group` or "
            f"`channel`, got type={args.get('type')!r} strategy={args.get('strategy')!r}"
        )
    group = (
        -1 if args.get("strategy") == "channel" else _opt_int(args.get("group_size"))
    )
    sym = args.get("symmetric")
    return FormatOptions(
        format="compressed-tensors",
        group_size=group,
        symmetric=sym if isinstance(sym, bool) else None,
    )


def import_projection(
    opts: FormatOptions, t: Mapping[str, torch.Tensor]
) -> Int4Projection:
    """Import one projection from its tensors by suffix (``qweight``, ``weight_packed``...)."""
    if opts.format == "gptq":
        fmt = opts.checkpoint_format
        if fmt not in ("gptq", "gptq_v2"):
            raise ConfigError(
                f"GPTQ checkpoint_format must be `gptq` or `gptq_v2`, got {fmt!r}"
            )
        return from_gptq(
            t["qweight"],
            t["scales"],
            t.get("qzeros"),
            t.get("g_idx"),
            group_size=opts.group_size,
            symmetric=opts.symmetric,
            checkpoint_format="gptq" if fmt == "gptq" else "gptq_v2",
        )
    if opts.format == "awq":
        return from_awq(
            t["qweight"], t["scales"], t["qzeros"], group_size=opts.group_size
        )
    return from_compressed_tensors(
        t["weight_packed"],
        t["weight_scale"],
        t.get("weight_zero_point"),
        t.get("weight_shape"),
        t.get("weight_g_idx"),
        group_size=opts.group_size,
    )
