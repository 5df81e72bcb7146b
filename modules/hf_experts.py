"""The int4 experts of a transformers sparse MoE block: ``build_int4_experts``.

Quantized from the block's float experts (read in canonical form) or loaded from an
int4 checkpoint under the block's names. May import core and modules (not modules.hf).
Shape legend: ``E`` experts, ``D`` hidden, ``F`` intermediate, ``H`` = 2F.
"""

from collections.abc import Mapping

import torch
from torch import nn

from core.config import MoEConfig
from core.errors import ConfigError, DeviceError
from core.scheme import INT4_SYM_G32, Int4Scheme
from modules.checkpoint import LoadedExperts, Source, checkpoint_names, load_experts
from modules.hf_block import ROUTER_NAMES
from modules.hf_checks import param
from modules.int4_moe import Int4MoE

_BLOCK_ALIASES = {"mlp": "block_sparse_moe", "block_sparse_moe": "mlp"}
"""Other checkpoint name of a block: transformers >= 5 names Mixtral's
``block_sparse_moe`` ``mlp`` when loading; its int4 checkpoints keep the old name."""


def float_experts(
    block: nn.Module, *, model_type: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's float experts in canonical form: ``w13 (E, 2F, D)``, ``w2 (E, D, F)``.

    gpt-oss stores ``gate_up_proj (E, D, 2F)`` with gate and up interleaved along the
    last dim and ``down_proj (E, F, D)``; the others store ``(E, 2F, D)`` (gate rows
    then up rows) and ``(E, D, F)``.

    """
    experts = block.get_submodule("experts")
    gate_up, down = param(experts, "gate_up_proj"), param(experts, "down_proj")
    if model_type != "gpt_oss":
        return gate_up, down
    w13_EHD = _deinterleave(gate_up).transpose(1, 2)
    return w13_EHD.contiguous(), down.transpose(1, 2).contiguous()


def _deinterleave(gate_up: torch.Tensor) -> torch.Tensor:
    """gpt-oss gate/up interleaved along the last dim to gate half then up half."""
    return torch.cat((gate_up[..., 0::2], gate_up[..., 1::2]), dim=-1)


def float_expert_biases(
    block: nn.Module, *, model_type: str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """gpt-oss expert biases in canonical form, ``(E, 2F)`` and ``(E, D)``, else ``None``."""
    if model_type != "gpt_oss":
        return None, None
    experts = block.get_submodule("experts")
    gate_up = param(experts, "gate_up_proj_bias")
    return _deinterleave(gate_up).contiguous(), param(experts, "down_proj_bias")


def build_int4_experts(
    name: str,
    block: nn.Module,
    config: MoEConfig,
    *,
    model_type: str,
    scheme: Int4Scheme | None,
    backend: str,
    checkpoint: Source | None,
    quantization_config: Mapping[str, object] | None,
) -> Int4MoE:
    """The int4 experts of block ``name``, with its router's correction bias if any.

    Quantized with ``scheme`` (``None``: ``INT4_SYM_G32``) from the block's float
    experts or, with ``checkpoint``, loaded from it where the block's float experts
    are (and checked to be of ``scheme`` unless it is ``None``).

    Raises:
        ConfigError: for float experts outside the canonical layout, gpt-oss from a
            checkpoint, a checkpoint without the block's experts or with experts of
            another scheme than ``scheme``.
        DeviceError: for a checkpoint into a block whose float experts are on meta.
    """
    router = next(getattr(block, r) for r in ROUTER_NAMES if hasattr(block, r))
    bias = getattr(router, "e_score_correction_bias", None)
    bias = bias if isinstance(bias, torch.Tensor) else None  # Int4MoE copies it
    if checkpoint is None:
        w13, w2 = float_experts(block, model_type=model_type)
        e, f, d = config.num_experts, config.intermediate_size, config.hidden_size
        if tuple(w13.shape) != (e, 2 * f, d) or tuple(w2.shape) != (e, d, f):
            raise ConfigError(
                f"MoE block {name!r} must hold experts of the canonical layout "
                f"(gate/up {(e, 2 * f, d)}, down {(e, d, f)} from its config), got "
                f"{tuple(w13.shape)} and {tuple(w2.shape)}: a layout "
                "replace_moe_blocks does not read"
            )
        w13_bias, w2_bias = float_expert_biases(block, model_type=model_type)
        return Int4MoE.from_float(
            w13_weight=w13,
            w2_weight=w2,
            w13_bias=w13_bias,
            w2_bias=w2_bias,
            config=config,
            scheme=INT4_SYM_G32 if scheme is None else scheme,
            backend=backend,
            e_score_correction_bias=bias,
            dtype=w13.dtype,
        )
    if model_type == "gpt_oss":
        raise ConfigError(
            "loading gpt-oss int4 experts from a checkpoint is not supported"
        )
    device = param(block.get_submodule("experts"), "gate_up_proj").device
    if device.type == "meta":
        raise DeviceError(
            f"MoE block {name!r} must hold its float experts on a real device to take "
            "int4 experts from a checkpoint (they are loaded where those are), got "
            "them on the meta device: materialize the model first (to_empty and "
            "load_state_dict, or from_pretrained)"
        )
    loaded = _load_block(
        checkpoint,
        name,
        config,
        quantization_config=quantization_config,
        device=device,
    )
    if scheme is not None and not _same_groups(scheme, loaded.weights.scheme, config):
        raise ConfigError(
            f"the checkpoint's experts of MoE block {name!r} must be of scheme="
            f"{scheme.name} as asked, got {loaded.weights.scheme.name} (leave scheme "
            "unset to take the checkpoint's)"
        )
    return Int4MoE.from_quantized(
        loaded.weights, config=config, backend=backend, e_score_correction_bias=bias
    )


def _same_groups(asked: Int4Scheme, held: Int4Scheme, config: MoEConfig) -> bool:
    """Whether ``held`` is ``asked`` on this layer's two reductions.

    ``g-1`` and a group of the whole row are the same groups.
    """
    return asked.mapping is held.mapping and all(
        asked.group_size_for(k) == held.group_size_for(k)
        for k in (config.hidden_size, config.intermediate_size)
    )


def _checkpoint_prefixes(name: str) -> list[str]:
    """``name``, then its other checkpoint spelling (``mlp`` / ``block_sparse_moe``)."""
    head, _, last = name.rpartition(".")
    alias = _BLOCK_ALIASES.get(last)
    if alias is None:
        return [name]
    return [name, f"{head}.{alias}" if head else alias]


def _load_block(
    checkpoint: Source,
    name: str,
    config: MoEConfig,
    *,
    quantization_config: Mapping[str, object] | None,
    device: torch.device,
) -> LoadedExperts:
    """The block's experts under the first of its checkpoint prefixes that loads."""
    prefixes = _checkpoint_prefixes(name)
    errors: list[ConfigError] = []
    for prefix in prefixes:
        try:
            return load_experts(
                checkpoint,
                prefix=prefix,
                config=config,
                quantization_config=quantization_config,
                device=device,
            )
        except ConfigError as err:
            errors.append(err)
    raise ConfigError(
        f"checkpoint must hold the experts of block {name!r}, got for each prefix: "
        + "; ".join(f"{p!r}: {e}" for p, e in zip(prefixes, errors, strict=True))
    ) from errors[0]


def check_checkpoint_has(checkpoint: Source, blocks: Mapping[str, nn.Module]) -> None:
    """Every block has expert tensors under one of its prefixes (names only).

    Raises:
        ConfigError: for the first block without any, naming the prefixes tried.
    """
    names = checkpoint_names(checkpoint)
    heads = {n.split(".experts.")[0] for n in names if ".experts." in n}
    for name in blocks:
        prefixes = _checkpoint_prefixes(name)
        if not any(p in heads for p in prefixes):
            raise ConfigError(
                f"checkpoint must hold the experts of block {name!r} (under "
                f"{' or '.join(repr(p + '.experts.') for p in prefixes)}), got none; "
                "no block was replaced"
            )
