"""modules/hf_config.py: MoEConfig from transformers configs, and the families refused.

Activations equal to transformers' own, routing fields of each family, refusals by
name, and a family outside ``ROUTED_FAMILIES`` run on its own router.
"""

import copy

import pytest
import torch
from transformers import (
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    LlamaConfig,
    MixtralConfig,
)
from transformers.activations import ACT2FN

from core.activation import apply_activation
from core.config import MoEConfig
from core.errors import ConfigError, ConfigTypeError
from core.scheme import INT4_SYM_G32
from modules.hf import find_moe_blocks, replace_moe_blocks
from modules.hf_block import RoutingMode
from modules.hf_config import ROUTED_FAMILIES, moe_config_from_hf
from tests.modules.hf_models import (
    COMMON,
    HEAD_DIM,
    ROPE,
    ROUTINGS,
    _assert_runs_its_dequantized_experts,
    _build,
    _load_dequantized,
    _logits,
)
from tests.tolerances import KERNEL_VS_ORACLE


@pytest.mark.parametrize(
    "hidden_act", ["silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new"]
)
def test_hidden_act_names_compute_what_transformers_computes(hidden_act: str) -> None:
    """Each accepted ``hidden_act`` maps to an activation equal to transformers' own
    ``ACT2FN[hidden_act]`` (``gelu_new`` and ``gelu_pytorch_tanh`` are the tanh form)."""
    cfg = MixtralConfig(
        **COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        hidden_act=hidden_act,
    )  # fmt: skip
    config = moe_config_from_hf(cfg)
    gate = torch.linspace(-6.0, 6.0, 97, dtype=torch.float64)[None]
    ours = apply_activation(torch.cat([gate, torch.ones_like(gate)], dim=-1), config)
    torch.testing.assert_close(ours, ACT2FN[hidden_act](gate), rtol=1e-12, atol=1e-12)


def test_moe_config_carries_routing_semantics() -> None:
    assert moe_config_from_hf(_build("deepseek_v3").config) == MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=64,
        intermediate_size=32,
        renormalize=True,
        scoring_func="sigmoid",
        num_expert_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    )
    assert not moe_config_from_hf(_build("qwen2_moe").config).renormalize
    gpt = moe_config_from_hf(_build("gpt_oss").config)
    assert (gpt.activation, gpt.swiglu_alpha, gpt.swiglu_limit) == (
        "swigluoai",
        1.702,
        7.0,
    )
    cfg = MixtralConfig(
        **COMMON,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        hidden_act="relu",
    )
    with pytest.raises(ConfigError, match="hidden_act must be one of"):
        moe_config_from_hf(cfg)


def test_models_without_support_are_refused_by_name() -> None:
    dense = LlamaConfig(**COMMON, intermediate_size=64)
    with pytest.raises(
        ConfigError,
        match="hf_config must set n_routed_experts or num_local_experts or "
        "num_experts \\(a sparse MoE model's\\), got none",
    ):
        moe_config_from_hf(dense)
    llama4 = Llama4ForCausalLM(
        Llama4TextConfig(
            **COMMON,
            intermediate_size=32,
            intermediate_size_mlp=64,
            num_local_experts=4,
            num_experts_per_tok=1,
            head_dim=16,
        )
    )
    assert find_moe_blocks(llama4)  # looks like the others, but is laid out otherwise
    with pytest.raises(
        ConfigError, match="model_type 'llama4_text' is not supported: Llama-4 stores"
    ):
        replace_moe_blocks(llama4)


@pytest.mark.parametrize(
    "given", [{"model_type": "mixtral", "num_local_experts": 8}, "mixtral", None]
)
def test_a_config_that_is_not_an_object_is_named(given: object) -> None:
    """A ``config.json`` read as a dict was told it set no expert count before."""
    with pytest.raises(
        ConfigTypeError, match="hf_config must be a transformers config object"
    ):
        moe_config_from_hf(given)


def test_a_dict_that_reads_by_attribute_is_read_as_a_config() -> None:
    """EasyDict-style subclasses read as transformers configs do."""

    class AttrDict(dict[str, object]):
        def __getattr__(self, name: str) -> object:
            try:
                return self[name]
            except KeyError as err:
                raise AttributeError(name) from err

    cfg = MixtralConfig(**COMMON, intermediate_size=32, num_local_experts=4)
    assert moe_config_from_hf(AttrDict(cfg.to_dict())) == moe_config_from_hf(cfg)


def test_another_family_runs_on_its_own_router(generator: torch.Generator) -> None:
    """GLM-4.5 looks like the others, but routes with sigmoid scores and a selection
    bias that its config does not name: routing from the config is refused (it would
    be softmax, logits off by about 7e-2), the model's own router runs it."""
    glm = Glm4MoeForCausalLM(
        Glm4MoeConfig(
            **COMMON,
            **HEAD_DIM,
            intermediate_size=64,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=0,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
        )
    )
    assert glm.config.model_type not in ROUTED_FAMILIES
    with torch.no_grad():  # a bias that changes the selection, as a trained one does
        for name, buffer in glm.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator))
    message = "model_type must be one of .* got 'glm4_moe'; replace_moe_blocks"
    with pytest.raises(ConfigError, match=message):
        moe_config_from_hf(glm.config)
    with pytest.raises(ConfigError, match=message):
        replace_moe_blocks(copy.deepcopy(glm), routing="config")
    replaced = copy.deepcopy(glm)
    names = replace_moe_blocks(replaced, backend="reference", routing="model")
    assert len(names) == 2
    _assert_runs_its_dequantized_experts(glm, replaced, names, generator)


@pytest.mark.parametrize("routing", ROUTINGS)
def test_gpt_oss_swiglu_alpha_and_limit_come_from_its_config(
    routing: RoutingMode, generator: torch.Generator
) -> None:
    """gpt-oss's experts take ``swiglu_alpha`` / ``swiglu_limit`` from the config; a
    limit small enough to clamp and another alpha give the model's own logits."""
    torch.manual_seed(20261202)
    cfg = GptOssConfig(
        **COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        head_dim=16, sliding_window=8, rope_parameters=ROPE,
        swiglu_alpha=1.0, swiglu_limit=0.05,
    )  # fmt: skip
    original = GptOssForCausalLM(cfg)
    torch.nn.Module.eval(original)
    config = moe_config_from_hf(cfg)
    assert (config.swiglu_alpha, config.swiglu_limit) == (1.0, 0.05)
    replaced = copy.deepcopy(original)
    names = replace_moe_blocks(
        replaced,
        scheme=INT4_SYM_G32,
        backend="reference",
        routing=routing,
    )
    dequantized = copy.deepcopy(original)
    _load_dequantized(dequantized, replaced, names, gpt_oss=True)
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    torch.testing.assert_close(
        _logits(replaced, ids),
        _logits(dequantized, ids),
        **KERNEL_VS_ORACLE[torch.float32],
    )
