"""Reading a checkpoint's ``quantization_config`` and importing one projection by format.

Pure: parses plain dicts (the ``config.json`` entry) and dispatches to the GPTQ, AWQ
and compressed-tensors importers. Imports only torch, attrs and core.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal, TypeAlias

import attrs
import torch

from core.errors import ConfigError
from core.formats.auto_round import to_packing_config
from core.formats.awq import from_awq
from core.formats.compressed_tensors import from_compressed_tensors
from core.formats.gptq import from_gptq
from core.formats.projection import Int4Projection
from core.formats.targets import select_config_group

CheckpointFormat: TypeAlias = Literal["auto", "gptq", "awq", "compressed-tensors"]
ImportFormat: TypeAlias = Literal["gptq", "awq", "compressed-tensors"]
GPTQCheckpointFormat: TypeAlias = Literal["gptq", "gptq_v2"]

_FORMATS: Final[dict[str, CheckpointFormat]] = {
    "auto": "auto",
    "gptq": "gptq",
    "awq": "awq",
    "compressed-tensors": "compressed-tensors",
}
_GPTQ_FORMATS: Final[dict[str, GPTQCheckpointFormat]] = {
    "gptq": "gptq",
    "gptq_v2": "gptq_v2",
}

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


def to_checkpoint_format(value: object, *, name: str = "format") -> CheckpointFormat:
    """A format name, case-insensitive with ``_`` and ``-`` alike, as its canonical name.

    Raises:
        ConfigError: for anything but `auto`, `gptq`, `awq` or `compressed-tensors`.
    """
    key = _format_key(value)
    found = _FORMATS.get(key)
    if found is None:
        raise ConfigError(
            f"{name} must be `auto`, `gptq`, `awq` or `compressed-tensors` (`_` and `-` "
            f"alike), got {value!r}{_gptq_hint(key)}"
        )
    return found


def _format_key(value: object) -> str:
    """Lower case, ``_`` as ``-``; ``""`` for a non-string (never a known name)."""
    return value.strip().lower().replace("_", "-") if isinstance(value, str) else ""


def _gptq_hint(key: str) -> str:
    if key.startswith("gptq") and key != "gptq":
        return " (GPTQ v1/v2 is the checkpoint_format of quantization_config)"
    return ""


def _to_import_format(value: str) -> ImportFormat:
    key = _format_key(value)
    found = _FORMATS.get(key)
    if found is None or found == "auto":
        raise ConfigError(
            "FormatOptions.format must be `gptq`, `awq` or `compressed-tensors` (`_` "
            f"and `-` alike), got {value!r}{_gptq_hint(key)}"
        )
    return found


def _to_gptq_format(value: str | None) -> GPTQCheckpointFormat | None:
    if value is None:
        return None
    found = _GPTQ_FORMATS.get(value)
    if found is None:
        raise ConfigError(
            f"GPTQ checkpoint_format must be `gptq` or `gptq_v2`, got {value!r}"
        )
    return found


@attrs.frozen(kw_only=True)
class FormatOptions:
    """What a checkpoint's ``quantization_config`` says about its int4 tensors.

    Attributes:
        format: `gptq`, `awq` or `compressed-tensors` (normalised: ``GPTQ`` and
            ``compressed_tensors`` are accepted; other names raise ``ConfigError``).
        group_size: declared group size (``-1``: whole rows; ``None``: from shapes).
        symmetric: declared symmetry, ``None`` when not said.
        checkpoint_format: GPTQ only: `gptq` (v1, zero points minus one), `gptq_v2`,
            or ``None`` when not said (no ``quantization_config``): then only
            symmetric zero points are read (see
            :func:`~core.formats.gptq.gptq_zero_points`).
        gptq_v1_word_carry: GPTQ v1 written by GPTQModel (its ``meta.quantizer``),
            whose whole-word arithmetic stores a zero point of 0 as 15.
        act_order: the config declares act-order groups (GPTQ ``desc_act`` without
            ``static_groups``, compressed-tensors ``actorder`` `group`): only the
            ``g_idx`` places the groups, so it is required (see :func:`g_idx_required`).
    """

    format: ImportFormat = attrs.field(converter=_to_import_format)
    group_size: int | None = None
    symmetric: bool | None = None
    checkpoint_format: GPTQCheckpointFormat | None = attrs.field(
        default=None, converter=_to_gptq_format
    )
    gptq_v1_word_carry: bool = False
    act_order: bool = False


_G_IDX: Final = {"gptq": "g_idx", "compressed-tensors": "weight_g_idx"}
_ACT_ORDER: Final = {
    "gptq": "`desc_act: true` without `static_groups: true`",
    "compressed-tensors": "`actorder: group`",
}


def g_idx_required(opts: FormatOptions) -> tuple[str, str] | None:
    """``(suffix, reason)`` of the g_idx each projection must hold, or ``None``.

    Required when the config declares act-order: its groups are then placed by the
    g_idx, and reading the scales as contiguous groups would be silently wrong.
    """
    if not opts.act_order or opts.format not in _G_IDX:
        return None
    name = _G_IDX[opts.format]
    return name, (
        f"quantization_config declares act-order ({_ACT_ORDER[opts.format]}): "
        f"`{name}` places the groups, and without it they would be misread as "
        "contiguous"
    )


def _method(config: Mapping[str, object]) -> str:
    method = str(config.get("quant_method", "")).lower().replace("_", "-")
    if method not in SUFFIXES and method != "auto-round":
        raise ConfigError(
            "quantization_config quant_method must be `gptq`, `awq`, "
            f"`compressed-tensors` or `auto-round`, got {config.get('quant_method')!r}"
        )
    return method


def _int4(name: str, bits: object) -> None:
    if bits != 4:
        raise ConfigError(f"{name} must be 4 for int4 experts, got {bits!r}")


def parse_quantization_config(
    config: Mapping[str, object] | None,
    fmt: CheckpointFormat = "auto",
    *,
    module_names: Sequence[str] = (),
) -> FormatOptions | None:
    """Options from ``quantization_config``; ``None`` when neither it nor ``fmt`` says.

    Args:
        config: the ``quantization_config`` entry of ``config.json``, or ``None``.
        fmt: `auto` or a format name (see :func:`to_checkpoint_format`).
        module_names: full module names of the expert projections; they choose the
            compressed-tensors ``config_groups`` entry (see
            :func:`~core.formats.targets.select_config_group`) and GPTQModel's
            ``dynamic`` overrides.

    Raises:
        ConfigError: for an unknown ``fmt``, a non-int4 or unknown layout, or when
            ``fmt`` contradicts ``config``.
    """
    fmt = to_checkpoint_format(fmt)
    if config is None:
        return None if fmt == "auto" else FormatOptions(format=fmt)
    method = _method(config)
    if method == "auto-round":  # written in GPTQ's or AWQ's layout
        config = to_packing_config(config, module_names)
        method = _method(config)
    if fmt not in ("auto", method):
        raise ConfigError(
            f"format={fmt!r} contradicts quantization_config quant_method={method!r}"
        )
    if method == "gptq":
        config = _with_dynamic_override(config, module_names)
        _int4("quantization_config bits", config.get("bits", 4))
        if config.get("is_marlin_format") is True:
            raise ConfigError(
                "quantization_config is_marlin_format must be false: AutoGPTQ's Marlin "
                "checkpoints (tensors `B` and `s`, repacked for that kernel) are not "
                "read; use the GPTQ checkpoint they were converted from"
            )
        sym = config.get("sym")
        return FormatOptions(
            format=method,
            group_size=_opt_int(
                config.get("group_size"), "quantization_config group_size"
            ),
            symmetric=sym if isinstance(sym, bool) else None,
            # Configs older than the key (AutoGPTQ < 0.7) are v1.
            checkpoint_format=str(config.get("checkpoint_format", "gptq")),
            gptq_v1_word_carry=_written_by_gptqmodel(config),
            act_order=config.get("desc_act") is True
            and config.get("static_groups") is not True,
        )
    if method == "awq":
        return _awq_options(config)
    return _ct_options(config, module_names)


def _dynamic_rule(
    dynamic: Mapping[str, object], module: str
) -> tuple[str, Mapping[str, object] | None] | None:
    """GPTQModel's ``dynamic`` rule for ``module``, or ``None`` when none matches.

    Returns ``(pattern, overrides)``, with ``None`` overrides for an exclusion (``-:``).
    The first pattern in order that ``re.match``es the module name decides; ``+:`` or
    no prefix overrides the base config's keys.
    """
    for pattern, overrides in dynamic.items():
        if pattern.startswith("-:"):
            if re.match(pattern[2:], module):
                return pattern, None
        elif re.match(pattern.removeprefix("+:"), module):
            if not isinstance(overrides, Mapping):
                raise ConfigError(
                    f"quantization_config dynamic[{pattern!r}] must be a mapping of "
                    f"overrides, got {overrides!r}"
                )
            return pattern, overrides
    return None


def _with_dynamic_override(
    config: Mapping[str, object], module_names: Sequence[str]
) -> Mapping[str, object]:
    """The GPTQ config with its ``dynamic`` overrides for the expert modules applied.

    Raises:
        ConfigError: when a rule excludes an expert module from quantization, or the
            expert modules get different overrides.
    """
    dynamic = config.get("dynamic")
    if not dynamic or not module_names:
        return config
    if not isinstance(dynamic, Mapping):
        raise ConfigError(
            f"quantization_config dynamic must be a mapping, got {dynamic!r}"
        )
    rules = {name: _dynamic_rule(dynamic, name) for name in module_names}
    excluded = [(n, r[0]) for n, r in rules.items() if r is not None and r[1] is None]
    if excluded:
        raise ConfigError(
            "quantization_config dynamic must quantize every expert module, got "
            f"{[n for n, _ in excluded[:3]]} excluded by {excluded[0][1]!r}"
        )
    overrides = {
        n: dict(r[1]) if r is not None and r[1] is not None else {}
        for n, r in rules.items()
    }
    # Compared as the configs they give: an override restating the base is no change.
    merged = {n: {**config, **o} for n, o in overrides.items()}
    first = merged[module_names[0]]
    differing = [n for n, m in merged.items() if m != first]
    if differing:
        raise ConfigError(
            "quantization_config dynamic must give every expert module the same "
            f"settings, got {overrides[module_names[0]]} for {module_names[0]!r} and "
            f"{overrides[differing[0]]} for {differing[0]!r} over the base config"
        )
    return first


def _written_by_gptqmodel(config: Mapping[str, object]) -> bool:
    """Whether ``meta.quantizer`` (a string or a list of them) names GPTQModel."""
    meta = config.get("meta")
    quantizer = meta.get("quantizer") if isinstance(meta, Mapping) else None
    names = [quantizer] if isinstance(quantizer, str) else quantizer
    if not isinstance(names, list):
        return False
    return any(isinstance(n, str) and n.lower().startswith("gptqmodel") for n in names)


def _opt_int(value: object, name: str) -> int | None:
    """A declared int, or ``None`` when not declared.

    Raises:
        ConfigError: for anything else (``"128"``, ``128.0``, ``true``): read as
            "not declared", the group size would be guessed from the tensors.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{name} must be an int, got {value!r}")


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
    return FormatOptions(
        format="awq", group_size=_opt_int(group, "quantization_config group_size")
    )


def _ct_options(
    config: Mapping[str, object], module_names: Sequence[str]
) -> FormatOptions:
    label, group = select_config_group(config, module_names=module_names)
    where = f"compressed-tensors config_groups {label!r}"
    args = group.get("weights")
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where} must have weights for the experts, got {args!r}")
    fmt = str(group.get("format") or config.get("format", "pack-quantized"))
    if fmt != "pack-quantized":
        raise ConfigError(f"{where} format must be `pack-quantized`, got {fmt!r}")
    _int4(f"{where} weights num_bits", args.get("num_bits"))
    if args.get("type", "int") != "int" or args.get("strategy") not in (
        "group",
        "channel",
    ):
        raise ConfigError(
            f"{where} weights must be type `int` with strategy `group` or `channel`, "
            f"got type={args.get('type')!r} strategy={args.get('strategy')!r}"
        )
    group_size = (
        -1
        if args.get("strategy") == "channel"
        else _opt_int(args.get("group_size"), f"{where} weights group_size")
    )
    sym = args.get("symmetric")
    actorder = args.get("actorder")  # `true` and the alias `dynamic` mean `group`
    return FormatOptions(
        format="compressed-tensors",
        group_size=group_size,
        symmetric=sym if isinstance(sym, bool) else None,
        act_order=actorder is True or str(actorder).lower() in ("group", "dynamic"),
    )


def import_projection(
    opts: FormatOptions, t: Mapping[str, torch.Tensor]
) -> Int4Projection:
    """Import one projection from its tensors by suffix (``qweight``, ``weight_packed``...).

    Raises:
        ConfigError: when a tensor the format needs is missing (named), the zero
            points of a ``symmetric=False`` checkpoint or the g_idx of an act-order
            one among them.
        ShapeError, DTypeError: from the format's importer, for malformed tensors.
    """
    required, _ = SUFFIXES[opts.format]
    missing = [name for name in required if name not in t]
    if missing:
        raise ConfigError(
            f"{opts.format} projection tensors must include {missing}, got {sorted(t)}"
        )
    g_idx = g_idx_required(opts)
    if g_idx is not None and g_idx[0] not in t:
        raise ConfigError(
            f"{opts.format} projection tensors must include {g_idx[0]!r}: "
            f"{g_idx[1]}; got {sorted(t)}"
        )
    importer = _IMPORTERS[opts.format]
    return importer(opts, t)


def _import_gptq(opts: FormatOptions, t: Mapping[str, torch.Tensor]) -> Int4Projection:
    return from_gptq(
        t["qweight"],
        t["scales"],
        t.get("qzeros"),
        t.get("g_idx"),
        group_size=opts.group_size,
        symmetric=opts.symmetric,
        checkpoint_format=opts.checkpoint_format,
        v1_word_carry=opts.gptq_v1_word_carry,
    )


def _import_awq(opts: FormatOptions, t: Mapping[str, torch.Tensor]) -> Int4Projection:
    return from_awq(t["qweight"], t["scales"], t["qzeros"], group_size=opts.group_size)


def _import_ct(opts: FormatOptions, t: Mapping[str, torch.Tensor]) -> Int4Projection:
    zero_point = t.get("weight_zero_point")
    if zero_point is None and opts.symmetric is False:
        raise ConfigError(
            "symmetric=False (an asymmetric compressed-tensors checkpoint) needs "
            f"weight_zero_point, got None among {sorted(t)}"
        )
    return from_compressed_tensors(
        t["weight_packed"],
        t["weight_scale"],
        zero_point,
        t.get("weight_shape"),
        t.get("weight_g_idx"),
        group_size=opts.group_size,
    )


_IMPORTERS: Final[
    dict[
        ImportFormat,
        Callable[[FormatOptions, Mapping[str, torch.Tensor]], Int4Projection],
    ]
] = {"gptq": _import_gptq, "awq": _import_awq, "compressed-tensors": _import_ct}
