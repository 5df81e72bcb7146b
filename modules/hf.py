"""Hugging Face transformers: ``replace_moe_blocks``, int4 MoE block replacement.

Duck-typed on transformers >= 5 (no transformers import): a sparse MoE block has a
router child (``gate`` or ``router``) and ``experts`` with fused 3-D ``gate_up_proj``.
Re-exports the hf_config, hf_block and hf_experts names. May import core and modules.
"""

import inspect
from collections.abc import Mapping

import torch
from torch import nn

from core.config import MoEConfig
from core.errors import ConfigError, ShapeError
from core.scheme import Int4Scheme
from core.validate import check_scheme, check_type
from modules.checkpoint import Source
from modules.hf_block import (
    ROUTER_NAMES,
    Int4SparseMoeBlock as Int4SparseMoeBlock,
    RoutingMode as RoutingMode,
)
from modules.hf_checks import verify_block, verify_experts
from modules.hf_config import (
    ROUTED_FAMILIES as ROUTED_FAMILIES,
    layer_config,
    moe_config_from_hf as moe_config_from_hf,
    text_config,
)
from modules.hf_experts import (
    build_int4_experts,
    check_checkpoint_has,
    float_expert_biases as float_expert_biases,
    float_experts as float_experts,
)
from modules.int4_moe import Int4MoE

_SHARED = ("shared_expert", "shared_experts")


def find_moe_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """Sparse MoE blocks by qualified name: a router child and fused 3-D experts."""
    found: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        router = next(
            (getattr(module, r) for r in ROUTER_NAMES if hasattr(module, r)), None
        )
        if (
            isinstance(experts, nn.Module)
            and isinstance(router, nn.Module)
            and isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor)
            and experts.gate_up_proj.ndim == 3
        ):
            found[name] = module
    return found


def _check_block(name: str, block: nn.Module) -> None:
    """Refuse a block whose routing ``Int4SparseMoeBlock`` would not reproduce.

    It calls the router on the hidden states alone, so routing state kept on the
    block itself (MiniMax-M2's ``e_score_correction_bias``, passed to its router's
    forward) would be dropped.

    Raises:
        ConfigError: naming the block and what it holds or its router needs.
    """
    if isinstance(getattr(block, "e_score_correction_bias", None), torch.Tensor):
        raise ConfigError(
            f"MoE block {name!r} must keep its routing state in its router, got "
            "e_score_correction_bias on the block itself (MiniMax-M2's layout, not "
            "supported)"
        )
    router = next(getattr(block, r) for r in ROUTER_NAMES if hasattr(block, r))
    params = list(inspect.signature(router.forward).parameters.values())
    required = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    takes_any = any(p.kind is p.VAR_POSITIONAL for p in params)  # a wrapper's *args
    if len(required) > 1 or (not required and not takes_any):
        raise ConfigError(
            f"the router of MoE block {name!r} must take the hidden states alone, got "
            f"{type(router).__name__}.forward requiring {required}"
        )


def replace_moe_blocks(
    model: nn.Module,
    *,
    scheme: Int4Scheme | None = None,
    backend: str = "auto",
    routing: RoutingMode = "model",
    checkpoint: Source | None = None,
    quantization_config: Mapping[str, object] | None = None,
) -> list[str]:
    """Replace every sparse MoE block of a transformers model by an int4 one, in place.

    The routed experts are quantized (round to nearest, ``scheme``) from the model's
    float weights or, with ``checkpoint``, read from an int4 checkpoint (GPTQ, AWQ or
    compressed-tensors, per :func:`~modules.checkpoint.load_experts`, with the block's
    name as prefix, or Mixtral's ``block_sparse_moe`` for ``mlp``, or int4-moe's own
    saved state). Router and shared experts stay in float. Each replacement is
    checked against its original block (``modules.hf_checks``), and every block is built
    and checked before any is swapped in, so an error leaves the model as it was
    (peak memory: the float model and all its int4 experts at once).

    Args:
        model: a loaded model, e.g. ``MixtralForCausalLM``; its ``config`` describes
            the MoE layers.
        scheme: int4 scheme when quantizing float weights (default
            ``INT4_SYM_G32``); with ``checkpoint``, the scheme its experts must
            have (default: whichever they have).
        backend: Int4MoE backend name or `auto`.
        routing: see :class:`Int4SparseMoeBlock`.
        checkpoint: optional int4 checkpoint (file, folder or state dict).
        quantization_config: the checkpoint's, when not in its ``config.json``.

    Returns:
        The qualified names of the replaced blocks.

    Raises:
        ConfigError: for a model type without support (Llama-4), ``routing="config"``
            outside ``ROUTED_FAMILIES``, a config without MoE layers or a model
            without blocks of the layout, a checkpoint without the block's experts
            (naming each prefix tried and why it failed), or a block whose forward
            does more than ``Int4SparseMoeBlock`` reproduces, or a checkpoint whose
            experts are not of ``scheme`` when one is given.
        ShapeError: for a ``scheme`` whose group size does not fit the model's
            layers (no block is replaced).
    """
    hf_config = getattr(model, "config", None)
    if hf_config is None:
        raise ConfigError("model must have a transformers `config` attribute, got none")
    config = (
        moe_config_from_hf(hf_config)
        if routing == "config"
        else layer_config(text_config(hf_config))
    )
    model_type = str(getattr(hf_config, "model_type", ""))
    if scheme is not None and checkpoint is None:
        _check_scheme_fits(scheme, config)
    blocks = find_moe_blocks(model)
    if not blocks and any(isinstance(m, Int4SparseMoeBlock) for m in model.modules()):
        raise ConfigError(
            f"model must have float sparse MoE blocks to replace, got none left in "
            f"{type(model).__name__}: its blocks already are Int4SparseMoeBlock "
            "(replace_moe_blocks was called on it before)"
        )
    if not blocks:
        mxfp4 = any(hasattr(m, "gate_up_proj_blocks") for m in model.modules())
        raise ConfigError(
            f"model must have sparse MoE blocks (a `gate` or `router` child and "
            f"`experts` with a 3-D `gate_up_proj`), got none in {type(model).__name__} "
            f"although its config declares {config.num_experts} experts"
            + (
                " (its experts hold MXFP4 blocks: load the model with "
                "transformers' Mxfp4Config(dequantize=True) for float experts)"
                if mxfp4
                else ""
            )
        )
    # Checked before any block is built: each block's structure and the checkpoint's
    # names; then every replacement is built and checked before any is swapped in.
    for name, block in blocks.items():
        _check_block(name, block)
    if checkpoint is not None:
        check_checkpoint_has(checkpoint, blocks)

    def build(name: str, block: nn.Module) -> Int4SparseMoeBlock:
        experts = build_int4_experts(
            name,
            block,
            config,
            model_type=model_type,
            scheme=scheme,
            backend=backend,
            checkpoint=checkpoint,
            quantization_config=quantization_config,
        )
        new = _replacement(block, experts, routing=routing, model_type=model_type)
        verify_block(name, block, new)
        verify_experts(name, block, new, model_type=model_type)
        experts.invalidate_prepared()  # the check's: not held beside the others
        return new

    built = {name: build(name, block) for name, block in blocks.items()}
    for name, new in built.items():
        model.set_submodule(name, new)
    return list(blocks)


def _check_scheme_fits(scheme: Int4Scheme, config: MoEConfig) -> None:
    """``scheme`` (to quantize float experts to) fits the model's layer sizes."""
    check_type("scheme", scheme, Int4Scheme)
    try:
        check_scheme(scheme, config)
    except ShapeError as err:
        raise ShapeError(
            f"scheme must fit the model's MoE layers, got {scheme.name}: {err}"
        ) from err


def _replacement(
    block: nn.Module, experts: Int4MoE, *, routing: RoutingMode, model_type: str
) -> Int4SparseMoeBlock:
    """``block`` as an ``Int4SparseMoeBlock`` around ``experts``.

    Its router and shared experts are taken over as they are.
    """
    router_name = next(r for r in ROUTER_NAMES if hasattr(block, r))
    shared = {
        n: getattr(block, n)
        for n in (*_SHARED, "shared_expert_gate")
        if isinstance(getattr(block, n, None), nn.Module)
    }
    return Int4SparseMoeBlock(
        router=getattr(block, router_name),
        router_name=router_name,
        experts=experts,
        shared=shared,
        routing=routing,
        returns_router_scores=model_type == "gpt_oss",
        jitter_noise=_jitter_noise(block),
    )


def _jitter_noise(block: nn.Module) -> float:
    """The block's ``jitter_noise`` (Mixtral's ``router_jitter_noise``), or 0."""
    value = getattr(block, "jitter_noise", 0.0)
    return float(value) if isinstance(value, (int, float)) else 0.0
