"""Hugging Face transformers: MoEConfig from HF configs, and int4 MoE block replacement.

Duck-typed on transformers >= 5 module layouts (no transformers import): a sparse MoE
block has a router child (``gate`` or ``router``) returning ``(logits, weights, ids)``
and an ``experts`` child holding fused 3-D ``gate_up_proj`` / ``down_proj``.
May import core and modules. Shape legend: ``T`` tokens, ``D`` hidden, ``E`` experts,
``F`` intermediate, ``K`` top_k.
"""

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import torch
from torch import nn

from core.config import Activation, MoEConfig
from core.errors import ConfigError, DeviceError
from core.scheme import INT4_SYM_G32, Int4Scheme
from modules.checkpoint import LoadedExperts, Source, checkpoint_names, load_experts
from modules.hf_checks import param, verify_block, verify_experts
from modules.int4_moe import Int4MoE

RoutingMode: TypeAlias = Literal["model", "config"]
"""Where an ``Int4SparseMoeBlock`` takes its top-k from (see its ``routing``)."""

_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}
_ROUTERS = ("gate", "router")
_SHARED = ("shared_expert", "shared_experts")
_UNSUPPORTED: dict[str, str] = dict.fromkeys(
    ("llama4", "llama4_text"),
    "Llama-4 stores its experts as (E, D, 2F) and scales the input of its top-1 "
    "expert by a sigmoid router score, which replace_moe_blocks does not implement",
)
ROUTED_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss")
"""The ``model_type`` values whose routing ``moe_config_from_hf`` reproduces (tested
against the models themselves in both routing modes). Another family's router may
score with a sigmoid, add a selection bias or group experts in a way its config does
not name: ``replace_moe_blocks(routing="model")`` runs it on the model's own router."""
_BLOCK_ALIASES = {"mlp": "block_sparse_moe", "block_sparse_moe": "mlp"}
"""Other checkpoint name of a block: transformers >= 5 names Mixtral's
``block_sparse_moe`` ``mlp`` when loading; its int4 checkpoints keep the old name."""


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _require(config: Any, *names: str) -> Any:
    value = _get(config, *names)
    if value is None:
        raise ConfigError(
            f"hf_config must set {' or '.join(names)} (a sparse MoE model's), got none"
        )
    return value


def moe_config_from_hf(hf_config: Any) -> MoEConfig:
    """The :class:`MoEConfig` of one sparse MoE layer of a transformers model config.

    Covers the ``ROUTED_FAMILIES``: Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 (sigmoid
    scores, grouped top-k, correction bias, ``routed_scaling_factor``) and gpt-oss
    (``swigluoai``; its softmax over the top-k logits equals a renormalized softmax).

    Raises:
        ConfigError: for a model type outside ``ROUTED_FAMILIES`` (its routing would
            be a guess), an activation int4-moe does not implement, or a config
            without an expert count (a dense model).
    """
    cfg = _text_config(hf_config)
    config = _layer_config(cfg)  # a dense model or Llama-4 is refused first
    model_type = str(getattr(cfg, "model_type", ""))
    if model_type not in ROUTED_FAMILIES:
        raise ConfigError(
            f"model_type must be one of {ROUTED_FAMILIES} to take its routing from "
            f"the config, got {model_type!r}; replace_moe_blocks(routing='model') "
            "runs other families on the model's own router"
        )
    return config


def _text_config(hf_config: Any) -> Any:
    """The text model's config of a (possibly multimodal) transformers config."""
    if hasattr(hf_config, "get_text_config"):
        return hf_config.get_text_config()
    return hf_config


def _layer_config(cfg: Any) -> MoEConfig:
    """``moe_config_from_hf`` for any family, the family not checked.

    Outside ``ROUTED_FAMILIES`` its routing fields are guesses (softmax unless
    DeepSeek-V3), so only ``routing="model"``, which ignores them, may use it there.
    """
    model_type = str(getattr(cfg, "model_type", ""))
    if model_type in _UNSUPPORTED:
        raise ConfigError(
            f"model_type {model_type!r} is not supported: {_UNSUPPORTED[model_type]}"
        )
    num_experts = int(
        _require(cfg, "n_routed_experts", "num_local_experts", "num_experts")
    )
    groups = _get(cfg, "n_group")
    grouped = groups is not None and int(groups) > 1
    act_name = str(_get(cfg, "hidden_act", default="silu"))
    if model_type == "gpt_oss":
        activation: Activation = "swigluoai"
    elif act_name in _ACTIVATIONS:
        activation = _ACTIVATIONS[act_name]
    else:
        raise ConfigError(
            f"hidden_act must be one of {sorted(_ACTIVATIONS)}, got {act_name!r}"
        )
    return MoEConfig(
        num_experts=num_experts,
        top_k=int(_require(cfg, "num_experts_per_tok")),
        hidden_size=int(_require(cfg, "hidden_size")),
        intermediate_size=int(
            _require(cfg, "moe_intermediate_size", "intermediate_size")
        ),
        renormalize=bool(_get(cfg, "norm_topk_prob", default=True)),
        scoring_func="sigmoid" if model_type.startswith("deepseek_v3") else "softmax",
        activation=activation,
        num_expert_group=int(groups) if grouped else None,
        topk_group=int(cfg.topk_group) if grouped else None,
        routed_scaling_factor=float(_get(cfg, "routed_scaling_factor", default=1.0)),
        swiglu_alpha=float(_get(cfg, "swiglu_alpha", default=1.702)),
        swiglu_limit=float(_get(cfg, "swiglu_limit", default=7.0)),
        expert_bias=model_type == "gpt_oss",  # gpt-oss experts always carry biases
    )


class Int4SparseMoeBlock(nn.Module):
    """A transformers sparse MoE block with its routed experts in int4.

    The float router (under its original name, so its output recorders still fire)
    and the float shared experts stay as they were; ``experts`` is an
    :class:`~modules.int4_moe.Int4MoE`. ``forward`` returns what the original block
    returned: the hidden states, or ``(hidden, router_scores)`` for gpt-oss.

    Args:
        router: the block's router module, returning ``(logits, weights, ids)``.
        router_name: its attribute name (``gate`` or ``router``).
        experts: the int4 experts.
        shared: optional ``{name: module}`` of ``shared_expert(s)`` and
            ``shared_expert_gate`` (Qwen2-MoE's sigmoid gate on the shared expert).
        routing: `model` uses the router's own top-k weights and ids (exactly the
            model's semantics); `config` routes the logits with ``experts.config``
            (and ``experts``' copy of a correction bias, made at replacement: update
            it with the router's).
        returns_router_scores: return ``(hidden, router_scores)`` like gpt-oss.
        jitter_noise: Mixtral's ``router_jitter_noise``: in training mode the hidden
            states are scaled by uniform noise in ``[1 - j, 1 + j]`` before the router
            and experts, as the original block does (0: never).
    """

    def __init__(
        self,
        *,
        router: nn.Module,
        router_name: str,
        experts: Int4MoE,
        shared: Mapping[str, nn.Module],
        routing: RoutingMode = "model",
        returns_router_scores: bool = False,
        jitter_noise: float = 0.0,
    ) -> None:
        super().__init__()
        if routing not in ("model", "config"):
            raise ConfigError(f"routing must be `model` or `config`, got {routing!r}")
        self.router_name = router_name
        self.add_module(router_name, router)
        self.experts = experts
        for name, module in shared.items():
            self.add_module(name, module)
        self.shared_names = tuple(n for n in shared if n != "shared_expert_gate")
        self.routing = routing
        self.returns_router_scores = returns_router_scores
        self.jitter_noise = float(jitter_noise)
        # The router's own top-k over the experts makes the ids: in range by
        # construction, so the layer skips its per-call check (Int4MoE.check_topk_ids).
        experts.check_topk_ids = routing != "model"

    if TYPE_CHECKING:

        def __call__(
            self, hidden_states: torch.Tensor
        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            """Typed twin of ``forward`` so strict mypy sees its result type."""
            ...

    def forward(
        self, hidden_states: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``(..., D)`` to ``(..., D)`` (gpt-oss: also the router scores ``(T, K)``)."""
        if self.training and self.jitter_noise > 0:
            j = self.jitter_noise
            noise = torch.empty_like(hidden_states).uniform_(1.0 - j, 1.0 + j)
            hidden_states = hidden_states * noise
        x_TD = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits_TE, weights_TK, ids_TK = self.get_submodule(self.router_name)(x_TD)
        if self.routing == "model":
            out_TD = self.experts(x_TD, topk_weights=weights_TK, topk_ids=ids_TK)
        else:
            out_TD = self.experts(x_TD, logits_TE)
        for name in self.shared_names:
            shared_TD = self.get_submodule(name)(x_TD)
            gate = self._modules.get("shared_expert_gate")
            if gate is not None:
                shared_TD = torch.sigmoid(gate(x_TD)) * shared_TD
            out_TD = out_TD + shared_TD
        out = out_TD.reshape(hidden_states.shape)
        return (out, weights_TK) if self.returns_router_scores else out

    def extra_repr(self) -> str:
        """Routing mode and the router's name."""
        return f"routing={self.routing}, router={self.router_name}"


def find_moe_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """Sparse MoE blocks by qualified name: a router child and fused 3-D experts."""
    found: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        router = next(
            (getattr(module, r) for r in _ROUTERS if hasattr(module, r)), None
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
    router = next(getattr(block, r) for r in _ROUTERS if hasattr(block, r))
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


def _int4_experts(
    name: str,
    block: nn.Module,
    config: MoEConfig,
    *,
    model_type: str,
    scheme: Int4Scheme,
    backend: str,
    checkpoint: Source | None,
    quantization_config: Mapping[str, object] | None,
) -> Int4MoE:
    router = next(getattr(block, r) for r in _ROUTERS if hasattr(block, r))
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
            scheme=scheme,
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
    return Int4MoE.from_quantized(
        loaded.weights, config=config, backend=backend, e_score_correction_bias=bias
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


def replace_moe_blocks(
    model: nn.Module,
    *,
    scheme: Int4Scheme = INT4_SYM_G32,
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
        scheme: int4 scheme when quantizing float weights.
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
            does more than ``Int4SparseMoeBlock`` reproduces.
    """
    hf_config = getattr(model, "config", None)
    if hf_config is None:
        raise ConfigError("model must have a transformers `config` attribute, got none")
    config = (
        moe_config_from_hf(hf_config)
        if routing == "config"
        else _layer_config(_text_config(hf_config))
    )
    model_type = str(getattr(hf_config, "model_type", ""))
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
        _check_checkpoint_has(checkpoint, blocks)

    def build(name: str, block: nn.Module) -> Int4SparseMoeBlock:
        experts = _int4_experts(
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


def _replacement(
    block: nn.Module, experts: Int4MoE, *, routing: RoutingMode, model_type: str
) -> Int4SparseMoeBlock:
    """``block`` as an ``Int4SparseMoeBlock`` around ``experts``.

    Its router and shared experts are taken over as they are.
    """
    router_name = next(r for r in _ROUTERS if hasattr(block, r))
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


def _check_checkpoint_has(checkpoint: Source, blocks: Mapping[str, nn.Module]) -> None:
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
