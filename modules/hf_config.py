"""MoEConfig from Hugging Face transformers configs: ``moe_config_from_hf``.

Duck-typed on the config's attributes (no transformers import): activations, the
``ROUTED_FAMILIES`` whose routing a config names, and the families refused by name.
May import core only.
"""

from typing import Any

from core.config import Activation, MoEConfig
from core.errors import ConfigError, ConfigTypeError

_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}
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
        ConfigTypeError: for a plain ``dict`` (a ``config.json`` read as JSON), a
            string or ``None``: the config is read by attribute, as transformers
            builds it.
    """
    # A plain dict (or string) holds its values as keys; attribute-reading dict
    # subclasses (EasyDict, addict) read as configs do, and pass.
    if (
        hf_config is None
        or type(hf_config) is dict
        or isinstance(hf_config, str | bytes)
    ):
        raise ConfigTypeError(
            "hf_config must be a transformers config object (read by attribute: "
            "AutoConfig.from_pretrained(...) or model.config), got "
            f"{type(hf_config).__name__}"
        )
    cfg = text_config(hf_config)
    config = layer_config(cfg)  # a dense model or Llama-4 is refused first
    model_type = str(getattr(cfg, "model_type", ""))
    if model_type not in ROUTED_FAMILIES:
        raise ConfigError(
            f"model_type must be one of {ROUTED_FAMILIES} to take its routing from "
            f"the config, got {model_type!r}; replace_moe_blocks(routing='model') "
            "runs other families on the model's own router"
        )
    return config


def text_config(hf_config: Any) -> Any:
    """The text model's config of a (possibly multimodal) transformers config."""
    if hasattr(hf_config, "get_text_config"):
        return hf_config.get_text_config()
    return hf_config


def layer_config(cfg: Any) -> MoEConfig:
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
