"""Tiny random-weight transformers MoE models the Hugging Face test files share.

Built from config (no downloads), with the helpers that compare a replaced model with
the original (not a test file).
"""

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from core.quantize import dequantize_expert_weights
from modules import Int4MoE
from modules.hf_block import Int4SparseMoeBlock, RoutingMode
from tests.tolerances import KERNEL_VS_ORACLE

COMMON: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


HEAD_DIM: dict[str, Any] = {"head_dim": 16}  # Qwen3MoeConfig's signature omits it


ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def _mixtral() -> PreTrainedModel:
    return MixtralForCausalLM(
        MixtralConfig(
            **COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2
        )
    )


def _qwen2() -> PreTrainedModel:
    cfg = Qwen2MoeConfig(
        **COMMON,
        intermediate_size=64,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
    )
    return Qwen2MoeForCausalLM(cfg)


def _qwen3() -> PreTrainedModel:
    cfg = Qwen3MoeConfig(
        **COMMON,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        **HEAD_DIM,
    )
    return Qwen3MoeForCausalLM(cfg)


def _deepseek() -> PreTrainedModel:
    cfg = DeepseekV3Config(
        **COMMON,
        intermediate_size=64,
        moe_intermediate_size=32,
        n_routed_experts=8,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        rope_parameters=ROPE,
    )
    return DeepseekV3ForCausalLM(cfg)


def _gpt_oss() -> PreTrainedModel:
    cfg = GptOssConfig(
        **COMMON,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=16,
        sliding_window=8,
        rope_parameters=ROPE,
    )
    return GptOssForCausalLM(cfg)


MODELS: dict[str, Callable[[], PreTrainedModel]] = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2,
    "qwen3_moe": _qwen3,
    "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
}


ROUTINGS: list[RoutingMode] = ["model", "config"]


def _build(name: str) -> PreTrainedModel:
    torch.manual_seed(20261202)  # transformers initializes from the global generator
    model = MODELS[name]()
    nn.Module.eval(model)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):  # make DeepSeek's selection bias matter
                bias.copy_(torch.randn_like(bias) * 0.1)
            for name in ("gate_up_proj_bias", "down_proj_bias"):  # gpt-oss biases
                if isinstance(getattr(module, name, None), torch.Tensor):
                    getattr(module, name).copy_(torch.randn_like(getattr(module, name)))
    return model


def _load_dequantized(
    original: nn.Module, replaced: nn.Module, names: list[str], *, gpt_oss: bool
) -> None:
    """Put each Int4MoE's dequantized experts into the original model's float experts."""
    with torch.no_grad():
        for name in names:
            int4 = replaced.get_submodule(f"{name}.experts")
            assert isinstance(int4, Int4MoE)
            w13, w2 = dequantize_expert_weights(int4.weights)
            experts = original.get_submodule(f"{name}.experts")
            if gpt_oss:  # (E, D, 2F) with gate/up interleaved, down (E, F, D)
                f = w13.shape[1] // 2
                gate_up = torch.stack((w13[:, :f], w13[:, f:]), dim=2).reshape_as(w13)
                w13, w2 = gate_up.transpose(1, 2), w2.transpose(1, 2)
            _tensor(experts, "gate_up_proj").copy_(w13)
            _tensor(experts, "down_proj").copy_(w2)


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    value = getattr(module, name)
    assert isinstance(value, torch.Tensor)
    return value


def _assert_runs_its_dequantized_experts(
    original: nn.Module,
    replaced: nn.Module,
    names: list[str],
    generator: torch.Generator,
) -> None:
    """``replaced`` gives the logits of ``original`` holding its dequantized experts."""
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    dequantized = copy.deepcopy(original)
    _load_dequantized(dequantized, replaced, names, gpt_oss=False)
    torch.testing.assert_close(
        _logits(replaced, ids),
        _logits(dequantized, ids),
        **KERNEL_VS_ORACLE[torch.float32],
    )


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(ids).logits
    return out


def _assert_left_alone(model: nn.Module) -> None:
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules())
