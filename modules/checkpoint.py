"""Load one MoE layer's int4 experts from a checkpoint: safetensors files or a state dict.

Files are read lazily (``checkpoint_source``) and the format detected from tensor names
(``checkpoint_layout``); int4-moe's own saved state is read as it is. May import core,
backends and modules. Shapes: ``E`` experts, ``D`` hidden.
"""

import os
from collections.abc import Mapping
from typing import Final, TypeVar, overload

import attrs
import torch

from core.config import MoEConfig
from core.errors import ConfigError, DeviceError, DTypeError, ShapeError
from core.formats import (
    Int4Projection,
    assemble_experts,
    concat_rows,
    stack_projections,
)
from core.formats.options import (
    FormatOptions,
    import_projection,
    parse_quantization_config,
    to_checkpoint_format,
)
from core.scheme import Int4Mapping, Int4Scheme
from core.validate import check_device, check_type
from core.weights import QuantizedExpertWeights
from modules.checkpoint_layout import (
    NAMINGS as NAMINGS,  # re-exported: was public here
    collect_names,
    correction_bias_name,
    describe_missing_experts,
    detect_format,
    join_name,
    list_names,
    plan_projections,
)
from modules.checkpoint_source import (
    OpenedSource,
    Source as Source,  # re-exported for modules.hf
    checkpoint_names as checkpoint_names,  # re-exported for modules.hf
    open_source,
    read_quantization_config as read_quantization_config,  # re-exported: was public here
)
from modules.int4_moe import Int4MoE

_Layer = TypeVar("_Layer", bound=Int4MoE)


@attrs.frozen(kw_only=True, eq=False)
class LoadedExperts:
    """One MoE layer read from a checkpoint.

    Attributes:
        weights: the experts in the canonical layout.
        gate_weight: float router ``(E, D)`` when ``<prefix>.gate.weight`` exists.
        e_score_correction_bias: ``(E,)`` when the checkpoint has one, on the gate
            (``<prefix>.gate.e_score_correction_bias``, DeepSeek-V3) or on the block
            (``<prefix>.e_score_correction_bias``, MiniMax-M2).
        format: the format that was read.
    """

    weights: QuantizedExpertWeights
    gate_weight: torch.Tensor | None
    e_score_correction_bias: torch.Tensor | None
    format: str


# ---------------------------------------------------------------------- loading
def load_experts(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = "auto",
    quantization_config: Mapping[str, object] | None = None,
    device: torch.device | str = "cpu",
) -> LoadedExperts:
    """Read one MoE layer's experts (and float router) into the canonical layout.

    Args:
        source: a ``.safetensors`` file, a folder of shards (with or without
            ``model.safetensors.index.json``), or an in-memory state dict.
        prefix: the MoE block's name, e.g. ``model.layers.3.mlp``; experts live under
            ``<prefix>.experts.`` (per expert ``{e}.gate_proj`` / ``up_proj`` /
            ``down_proj`` or Mixtral ``w1`` / ``w3`` / ``w2``, or fused 3-D
            ``gate_up_proj`` / ``down_proj``), the router at ``<prefix>.gate.weight``.
        config: the layer's sizes; ``num_experts`` experts are expected.
        format: `auto` detects from ``quantization_config`` and tensor names; or
            `gptq`, `awq`, `compressed-tensors` (case and ``_``/``-`` ignored).
        quantization_config: the checkpoint's ``quantization_config``; read from the
            ``config.json`` beside ``source`` when left out. For compressed-tensors,
            the ``config_groups`` entry whose targets match the expert modules is
            used (see :func:`core.formats.targets.select_config_group`).
        device: where the tensors are loaded (present here; not ``meta``).

    Values are not checked here: NaN/inf scales are refused when a layer is built
    from the result (``Int4MoE.from_quantized``, which ``from_checkpoint`` calls).

    Raises:
        ConfigError: for an unknown or contradicting format, an ambiguous or
            non-int4 ``config_groups`` entry, experts in ``ignore``, missing or
            unexpected tensors (named), or files that are not safetensors or JSON
            (named); ShapeError / DTypeError for tensors of the wrong shape or dtype.
        DeviceError: for a ``device`` torch does not know or this machine lacks.
    """
    check_type("source", source, (str, os.PathLike, Mapping))
    check_type("prefix", prefix, str)
    check_type("config", config, MoEConfig)
    if quantization_config is not None:
        check_type("quantization_config", quantization_config, Mapping)
    fmt = to_checkpoint_format(format)
    src = open_source(source, _check_load_device(device))
    if quantization_config is None:
        quantization_config = read_quantization_config(source)
    prefix = prefix.rstrip(".")  # the experts' and the router's names alike
    base = join_name(prefix, "experts") + "."
    rel = {n[len(base) :] for n in src.names if n.startswith(base)}
    if not rel:
        raise ConfigError(
            f"prefix {prefix!r}: " + describe_missing_experts(base, src.names)
        )
    if rel >= _CANONICAL_REQUIRED:
        if fmt != "auto":
            raise ConfigError(
                f"format {fmt!r} contradicts the checkpoint: it holds int4-moe's own "
                f"tensors ({sorted(_CANONICAL_REQUIRED)}) under {base!r}"
            )
        return _canonical(src, prefix, base, rel, config)
    plan = plan_projections(rel, config.num_experts, base)
    modules = [base + key for keys in plan.values() for key in keys]
    opts = parse_quantization_config(
        quantization_config, fmt, module_names=modules
    ) or detect_format(
        rel, lambda n: src.read([base + n])[base + n], plan["down"][0], config
    )
    wanted = collect_names(opts, plan, rel, base)
    gate_name = join_name(prefix, "gate.weight")
    bias_name = correction_bias_name(prefix, src.names)
    router = [n for n in (gate_name, bias_name) if n is not None and n in src.names]
    tensors = src.read([base + n for n in wanted] + router)
    weights = _assemble(plan, opts, {n: tensors[base + n] for n in wanted}, base)
    _check_sizes(weights, config)
    return LoadedExperts(
        weights=weights,
        gate_weight=tensors.get(gate_name),
        e_score_correction_bias=None if bias_name is None else tensors[bias_name],
        format=opts.format,
    )


_CANONICAL_REQUIRED: Final = frozenset(
    {"w13_qdata", "w13_scale", "w2_qdata", "w2_scale"}
)
_CANONICAL_OPTIONAL: Final = frozenset(
    {
        "w13_zero_point",
        "w2_zero_point",
        "w13_bias",
        "w2_bias",
        "e_score_correction_bias",
        "gate_weight",
    }
)


def _canonical(
    src: OpenedSource, prefix: str, base: str, rel: set[str], config: MoEConfig
) -> LoadedExperts:
    """An ``Int4MoE``'s own state under ``base`` (a replaced model's saved state).

    The scheme follows from the tensors: asymmetric where zero points are stored, the
    group size from the number of scale groups (one per row: ``-1``).

    Raises:
        ConfigError: for tensors int4-moe does not store there (``expert_map``: a
            shard of an expert-parallel layer is not a whole layer), or scale groups
            that give no supported group size.
    """
    extra = rel - _CANONICAL_REQUIRED - _CANONICAL_OPTIONAL
    if extra:
        raise ConfigError(
            f"unexpected tensors beside int4-moe's own under {base!r}: "
            f"{list_names(extra, base)}"
        )
    bias_name = correction_bias_name(prefix, src.names)
    gate_name = join_name(prefix, "gate.weight")
    router = [n for n in (gate_name, bias_name) if n is not None and n in src.names]
    tensors = src.read([base + n for n in rel] + router)
    t = {n: tensors[base + n] for n in rel}
    zero = t.get("w13_zero_point")
    scheme = Int4Scheme(
        mapping=Int4Mapping.SYMMETRIC if zero is None else Int4Mapping.ASYMMETRIC,
        group_size=_own_group_size(t, base),
    )
    weights = QuantizedExpertWeights.from_tensors(t, scheme)
    _check_sizes(weights, config)
    if gate_name in tensors and "gate_weight" in t:
        raise ConfigError(
            f"checkpoint must hold one router for {prefix!r}, got {gate_name!r} and "
            f"{base + 'gate_weight'!r}"
        )
    bias = (
        tensors[bias_name]
        if bias_name is not None
        else t.get("e_score_correction_bias")
    )
    return LoadedExperts(
        weights=weights,
        gate_weight=tensors.get(gate_name, t.get("gate_weight")),
        e_score_correction_bias=bias,
        format="int4-moe",
    )


def _own_group_size(t: Mapping[str, torch.Tensor], base: str) -> int:
    """The group size of int4-moe's own tensors, from both scales' group counts.

    Each projection's K is its codes' (two a byte). ``-1`` only when both hold one
    group a row: with ``G = hidden_size`` and a larger ``intermediate_size``, w13 has
    one group a row and w2 several.
    """
    found: dict[str, tuple[int, int]] = {}  # scale name: (K, groups)
    for proj in ("w13", "w2"):
        name = f"{proj}_scale"
        k = 2 * int(t[f"{proj}_qdata"].shape[-1])
        groups = int(t[name].shape[-1]) if t[name].ndim else 0
        if groups < 1 or k % groups:
            raise ConfigError(
                f"{base}{name} must hold a number of groups dividing its K={k}, "
                f"got {groups}"
            )
        found[name] = (k, groups)
    (k13, g13), (k2, g2) = found["w13_scale"], found["w2_scale"]
    if g13 == g2 == 1:
        return -1
    if k13 // g13 != k2 // g2:
        raise ConfigError(
            f"{base}w13_scale and {base}w2_scale must share one group size, got "
            f"{k13}/{g13} and {k2}/{g2} columns a group"
        )
    return k13 // g13


def _assemble(
    plan: dict[str, list[str]],
    opts: FormatOptions,
    tensors: Mapping[str, torch.Tensor],
    base: str,
) -> QuantizedExpertWeights:
    def role(name: str) -> Int4Projection:
        projections = []
        for key in plan[name]:
            local = {
                n[len(key) + 1 :]: t
                for n, t in tensors.items()
                if n.startswith(key + ".")
            }
            try:
                projections.append(import_projection(opts, local))
            except (ShapeError, DTypeError, ConfigError) as error:
                raise type(error)(f"{base}{key}: {error}") from error
        return (
            projections[0]
            if len(projections) == 1 and "." not in plan[name][0]
            else stack_projections(name, projections)
        )

    w13 = (
        role("gate_up")
        if "gate_up" in plan
        else concat_rows("w13", role("gate"), role("up"))
    )
    return assemble_experts(w13, role("down"))


def _check_load_device(device: torch.device | str | int) -> torch.device:
    """``device`` parsed: one tensors can be loaded onto (present, not ``meta``)."""
    parsed = check_device("device", device, allow_meta=True)
    if parsed.type == "meta":
        msg = (
            "device must hold the checkpoint's values (cpu, cuda, xpu, ...), got meta: "
            "load onto a real device, or build Int4MoE(..., device='meta') and load "
            "its state later"
        )
        raise DeviceError(msg)
    return parsed


def _check_sizes(weights: QuantizedExpertWeights, config: MoEConfig) -> None:
    got = (weights.num_experts, weights.hidden_size, weights.intermediate_size)
    want = (config.num_experts, config.hidden_size, config.intermediate_size)
    if got != want:
        raise ConfigError(
            "checkpoint experts have (num_experts, hidden_size, intermediate_size) = "
            f"{got}, but config says {want}"
        )


@overload
def from_checkpoint(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = ...,
    quantization_config: Mapping[str, object] | None = ...,
    backend: str = ...,
    device: torch.device | str = ...,
) -> Int4MoE: ...


@overload
def from_checkpoint(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = ...,
    quantization_config: Mapping[str, object] | None = ...,
    backend: str = ...,
    device: torch.device | str = ...,
    module_cls: type[_Layer],
) -> _Layer: ...


def from_checkpoint(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = "auto",
    quantization_config: Mapping[str, object] | None = None,
    backend: str = "auto",
    device: torch.device | str = "cpu",
    module_cls: type[Int4MoE] = Int4MoE,
) -> Int4MoE:
    """Build an :class:`Int4MoE` (or ``module_cls``) from a checkpoint layer.

    Arguments as :func:`load_experts`; ``backend`` as ``Int4MoE``. The router
    (``<prefix>.gate.weight``) and DeepSeek-V3's correction bias are loaded when present.
    ``module_cls.from_checkpoint`` (which this calls) keeps a subclass's type.
    """
    return module_cls.from_checkpoint(
        source,
        prefix=prefix,
        config=config,
        format=format,
        quantization_config=quantization_config,
        backend=backend,
        device=device,
    )
