"""Hugging Face MoE blocks replaced by Int4MoE, checked against the original model.

Tiny random-weight transformers models built from config (no downloads). Two checks
per model: against the original run on the dequantized int4 weights (float32
rounding only), and against the original float model (int4 error, SQNR floor).
"""

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from torch import nn
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    JetMoeConfig,
    JetMoeForCausalLM,
    Lfm2MoeConfig,
    Lfm2MoeForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    LlamaConfig,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.activations import ACT2FN

from core.activation import apply_activation
from core.config import MoEConfig
from core.errors import BackendUnavailableError, ConfigError, DeviceError
from core.formats import export_expert_weights
from core.quantize import dequantize_expert_weights
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32
from modules import Int4MoE
from modules.hf import (
    ROUTED_FAMILIES,
    Int4SparseMoeBlock,
    RoutingMode,
    find_moe_blocks,
    moe_config_from_hf,
    replace_moe_blocks,
)
from tests.tolerances import EXACT, HF_LOGITS_SQNR_FLOOR_DB, KERNEL_VS_ORACLE, sqnr_db

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


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("name", list(MODELS))
def test_replaced_model_matches_original(
    name: str, routing: RoutingMode, generator: torch.Generator
) -> None:
    original = _build(name)
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    replaced = copy.deepcopy(original)
    names = replace_moe_blocks(
        replaced, scheme=INT4_SYM_G32, backend="reference", routing=routing
    )
    assert names == (
        ["model.layers.1.mlp"]
        if name == "deepseek_v3"
        else ["model.layers.0.mlp", "model.layers.1.mlp"]
    )
    assert all(isinstance(replaced.get_submodule(n), Int4SparseMoeBlock) for n in names)
    for n in names:  # the replacement check's prepared forms are not kept
        experts = replaced.get_submodule(f"{n}.experts")
        assert isinstance(experts, Int4MoE)
        assert experts.backend_name is None
        # The model's router made the ids: the layer need not range-check them.
        assert experts.check_topk_ids is (routing != "model")
    out = _logits(replaced, ids)
    assert sqnr_db(_logits(original, ids), out) >= HF_LOGITS_SQNR_FLOOR_DB[name]
    dequantized = copy.deepcopy(original)
    _load_dequantized(dequantized, replaced, names, gpt_oss=name == "gpt_oss")
    torch.testing.assert_close(
        out, _logits(dequantized, ids), **KERNEL_VS_ORACLE[torch.float32]
    )


@pytest.mark.parametrize("name", list(MODELS))
def test_block_returns_what_the_original_returned(
    name: str, generator: torch.Generator
) -> None:
    original = _build(name)
    replaced = copy.deepcopy(original)
    block_name = replace_moe_blocks(replaced, backend="reference")[-1]
    x = torch.randn(2, 5, 64, generator=generator)
    with torch.no_grad():
        before = original.get_submodule(block_name)(x)
        after = replaced.get_submodule(block_name)(x)
    assert type(after) is type(before)
    if isinstance(before, tuple):  # gpt-oss: (hidden, router_scores)
        assert after[0].shape == before[0].shape
        torch.testing.assert_close(after[1], before[1], **EXACT)
    else:
        assert after.shape == before.shape


def test_router_logits_are_still_recorded(generator: torch.Generator) -> None:
    original = _build("qwen2_moe")
    replaced = copy.deepcopy(original)
    replace_moe_blocks(replaced, backend="reference")
    ids = torch.randint(0, 64, (1, 6), generator=generator)
    with torch.no_grad():
        ref = original(ids, output_router_logits=True).router_logits
        got = replaced(ids, output_router_logits=True).router_logits
    assert len(got) == len(ref) == 2
    torch.testing.assert_close(got[0], ref[0], **EXACT)


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


def test_gpt_oss_biases_are_carried() -> None:
    model = _build("gpt_oss")
    experts = model.get_submodule("model.layers.0.mlp.experts")
    gate_up_bias = _tensor(experts, "gate_up_proj_bias").detach().clone()
    down_bias = _tensor(experts, "down_proj_bias").detach().clone()
    assert bool(down_bias.ne(0).any())
    replace_moe_blocks(model, backend="reference")
    int4 = model.get_submodule("model.layers.0.mlp.experts")
    assert isinstance(int4, Int4MoE)
    assert int4.config.expert_bias
    f = gate_up_bias.shape[-1] // 2
    w13_bias, w2_bias = int4.weights.w13_bias, int4.weights.w2_bias
    assert w13_bias is not None
    torch.testing.assert_close(w13_bias[:, :f], gate_up_bias[:, 0::2], **EXACT)
    torch.testing.assert_close(w13_bias[:, f:], gate_up_bias[:, 1::2], **EXACT)
    torch.testing.assert_close(w2_bias, down_bias, **EXACT)


def _as_mixtral_checkpoint_name(name: str) -> str:
    """Mixtral's int4 checkpoints keep ``block_sparse_moe`` and ``w1 / w3 / w2``."""
    name = name.replace(".mlp.", ".block_sparse_moe.")
    for hf, mixtral in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        name = name.replace(f".{hf}.", f".{mixtral}.")
    return name


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_blocks_from_an_int4_checkpoint(name: str, generator: torch.Generator) -> None:
    original = _build(name)
    quantized = copy.deepcopy(original)
    names = replace_moe_blocks(quantized, scheme=INT4_ASYM_G32, backend="reference")
    state: dict[str, torch.Tensor] = {}
    for block in names:
        int4 = quantized.get_submodule(f"{block}.experts")
        assert isinstance(int4, Int4MoE)
        state |= export_expert_weights(int4.weights, prefix=f"{block}.experts")
    if name == "mixtral":
        state = {_as_mixtral_checkpoint_name(k): v for k, v in state.items()}
        assert "model.layers.0.block_sparse_moe.experts.3.w2.weight_packed" in state
    loaded = copy.deepcopy(original)
    replace_moe_blocks(loaded, backend="reference", checkpoint=state)
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    torch.testing.assert_close(_logits(loaded, ids), _logits(quantized, ids), **EXACT)


def test_checkpoint_without_the_block_names_each_prefix_tried() -> None:
    with pytest.raises(
        ConfigError,
        match=r"block 'model.layers.0.mlp', got for each prefix: 'model.layers.0.mlp': "
        r"cannot tell the format: .* got suffixes \['x'\]; "
        r"'model.layers.0.block_sparse_moe': prefix 'model.layers.0.block_sparse_moe': "
        r"no tensors under 'model.layers.0.block_sparse_moe.experts.' in the checkpoint",
    ):  # names under each block's prefix, but not tensors loading can read
        replace_moe_blocks(
            _build("mixtral"),
            checkpoint={
                f"model.layers.{i}.mlp.experts.x": torch.zeros(1) for i in (0, 1)
            },
        )


def test_a_checkpoint_missing_a_later_block_replaces_none() -> None:
    """Every block's names are looked for before any block is replaced: a checkpoint
    holding only the first layer's experts leaves the model as it was."""
    original = _build("qwen3_moe")
    quantized = copy.deepcopy(original)
    names = replace_moe_blocks(quantized, backend="reference")
    int4 = quantized.get_submodule(f"{names[0]}.experts")
    assert isinstance(int4, Int4MoE)
    first = export_expert_weights(int4.weights, prefix=f"{names[0]}.experts")
    model = copy.deepcopy(original)
    with pytest.raises(
        ConfigError,
        match=r"checkpoint must hold the experts of block 'model.layers.1.mlp' \(under "
        r"'model.layers.1.mlp.experts.' or 'model.layers.1.block_sparse_moe.experts.'\), "
        r"got none; no block was replaced",
    ):
        replace_moe_blocks(model, backend="reference", checkpoint=first)
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules()), (
        "a block was replaced"
    )


def test_deepseek_correction_bias_is_not_shared_with_the_router() -> None:
    model = _build("deepseek_v3")
    replace_moe_blocks(model, backend="reference")
    router = _tensor(
        model.get_submodule("model.layers.1.mlp.gate"), "e_score_correction_bias"
    )
    int4 = model.get_submodule("model.layers.1.mlp.experts")
    assert isinstance(int4, Int4MoE)
    bias = int4.get_buffer("e_score_correction_bias")
    torch.testing.assert_close(bias, router.float(), **EXACT)
    # shared storage makes safetensors (and save_pretrained) refuse the state dict
    pointers = [t.untyped_storage().data_ptr() for t in model.state_dict().values()]
    assert len(set(pointers)) == len(pointers)


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


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("name", list(MODELS))
def test_training_gradients_match_the_float_model(
    name: str, routing: RoutingMode, generator: torch.Generator
) -> None:
    """Fine-tuning through replaced blocks: every trainable parameter (embeddings,
    attention, routers, shared experts) gets the gradient that the original model
    on the dequantized int4 weights gives it (``modules/backward.py`` on cpu-int4)."""
    original = _build(name)
    replaced = copy.deepcopy(original)
    names = replace_moe_blocks(
        replaced, scheme=INT4_SYM_G32, backend="cpu-int4", routing=routing
    )
    dequantized = copy.deepcopy(original)
    _load_dequantized(dequantized, replaced, names, gpt_oss=name == "gpt_oss")
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    grads: list[dict[str, torch.Tensor]] = []
    for model in (replaced, dequantized):
        loss = model(ids).logits.float().pow(2).mean()
        torch.autograd.backward(loss)
        grads.append(
            {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        )
    int4_grads, float_grads = grads
    assert any(n.split(".")[-2] in ("gate", "router") for n in int4_grads)
    assert set(int4_grads) <= set(float_grads)  # the float model's experts add theirs
    for n, g in int4_grads.items():
        torch.testing.assert_close(g, float_grads[n], **KERNEL_VS_ORACLE[torch.float32])


@pytest.mark.parametrize("name", list(MODELS))
def test_replaced_model_compiles_into_one_graph(
    name: str, generator: torch.Generator
) -> None:
    """torch.compile(fullgraph=True) of a whole model with replaced blocks: the int4
    layers are custom ops in its one graph (``modules/custom_op.py``), logits equal."""
    model = _build(name)
    replace_moe_blocks(model, scheme=INT4_SYM_G32)
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        out: torch.Tensor = compiled(ids).logits
    torch.testing.assert_close(out, _logits(model, ids), **EXACT)


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


def test_blocks_routing_outside_their_router_are_refused() -> None:
    """MiniMax-M2 keeps its correction bias on the block and passes it to the router:
    refused before anything is replaced (the router alone would fail at forward)."""
    model = MiniMaxM2ForCausalLM(
        MiniMaxM2Config(
            **COMMON,
            **HEAD_DIM,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            bos_token_id=None,
            eos_token_id=None,
        )
    )
    names = list(find_moe_blocks(model))
    assert names == ["model.layers.0.mlp", "model.layers.1.mlp"]
    with pytest.raises(
        ConfigError,
        match=r"^MoE block 'model\.layers\.0\.mlp' must keep its routing state in its "
        r"router, got e_score_correction_bias on the block itself",
    ):
        replace_moe_blocks(model, backend="reference")
    assert all(find_moe_blocks(model)[n].__class__.__name__ != "Int4SparseMoeBlock"
               for n in names)  # fmt: skip
    for name in names:  # a router needing more than the hidden states, alone
        del model.get_submodule(name).e_score_correction_bias
    with pytest.raises(
        ConfigError,
        match=r"^the router of MoE block 'model\.layers\.0\.mlp' must take the hidden "
        r"states alone, got MiniMaxM2TopKRouter\.forward requiring "
        r"\['hidden_states', 'e_score_correction_bias'\]$",
    ):
        replace_moe_blocks(model, backend="reference")


def test_routers_behind_star_args_wrappers_are_accepted(
    generator: torch.Generator,
) -> None:
    """A router whose forward is ``(*args, **kwargs)`` (a compiled or hooked module)
    cannot be told apart from one that takes the hidden states: it is let through."""
    model = _build("qwen3_moe")
    names = list(find_moe_blocks(model))

    class Wrapped(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner(*args, **kwargs)

    for name in names:
        block = model.get_submodule(name)
        block.gate = Wrapped(block.get_submodule("gate"))
    original = copy.deepcopy(model)
    assert replace_moe_blocks(model, backend="reference") == names
    _assert_runs_its_dequantized_experts(original, model, names, generator)


# ------------------------------------------------- blocks that do more than the layout


def _assert_left_alone(model: nn.Module) -> None:
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules())


def test_a_checkpoint_into_a_model_on_meta_is_a_device_error() -> None:
    """Int4 experts are loaded where the block's float experts are: not on meta."""
    source = _build("qwen3_moe")
    names = replace_moe_blocks(source, backend="reference")
    state: dict[str, torch.Tensor] = {}
    for name in names:
        int4 = source.get_submodule(f"{name}.experts")
        assert isinstance(int4, Int4MoE)
        state |= export_expert_weights(int4.weights, prefix=f"{name}.experts")
    with torch.device("meta"):
        model = MODELS["qwen3_moe"]()
    with pytest.raises(
        DeviceError,
        match=r"block 'model\.layers\.0\.mlp' must hold its float experts on a real "
        r"device .* got them on the meta device",
    ):
        replace_moe_blocks(model, checkpoint=state)
    _assert_left_alone(model)


def test_mixtral_router_jitter_runs_in_training_as_in_the_original() -> None:
    """Mixtral's block scales its hidden states by uniform noise in training mode
    (``router_jitter_noise``): the replacement draws the same noise the same way."""
    model = _build("mixtral")
    names = list(find_moe_blocks(model))
    for name in names:
        setattr(model.get_submodule(name), "jitter_noise", 0.1)  # noqa: B010  # typed Module
    original = copy.deepcopy(model)
    replace_moe_blocks(model, backend="reference")
    _load_dequantized(original, model, names, gpt_oss=False)
    new, old = model.get_submodule(names[0]), original.get_submodule(names[0])
    assert isinstance(new, Int4SparseMoeBlock)
    assert new.jitter_noise == 0.1
    x = torch.randn(1, 5, model.config.hidden_size)

    def run(block: nn.Module, seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            out = block(x.clone())  # the original scales its input in place
        assert isinstance(out, torch.Tensor)
        return out

    old.train()
    new.train()
    want = run(old, 3)
    torch.testing.assert_close(run(new, 3), want, **KERNEL_VS_ORACLE[torch.float32])
    assert not torch.equal(run(new, 4), want)  # other noise: the jitter ran
    old.eval()
    new.eval()
    torch.testing.assert_close(
        run(new, 4), run(old, 5), **KERNEL_VS_ORACLE[torch.float32]
    )


def test_a_router_kept_in_float32_is_checked_on_the_experts_dtype() -> None:
    """DeepSeek-V3 in bf16 with its router kept in float32 (as several families keep
    theirs): the check feeds the block bf16 hidden states, as the model does."""
    model = _build("deepseek_v3")
    nn.Module.to(model, torch.bfloat16)  # transformers types its own .to oddly
    for name in find_moe_blocks(model):
        model.get_submodule(name).get_submodule("gate").float()
    names = replace_moe_blocks(model, backend="reference")
    assert len(names) == 1
    ids = torch.randint(0, 64, (1, 5))
    assert torch.isfinite(_logits(model, ids)).all()


def test_a_router_needing_block_state_is_refused_at_replacement() -> None:
    """LFM2-MoE passes the block's ``expert_bias`` to its router, whose default lets
    the signature check through: running the replacement raises, so it is refused."""
    model = Lfm2MoeForCausalLM(
        Lfm2MoeConfig(
            **COMMON,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            num_dense_layers=0,
            use_expert_bias=True,
            layer_types=["full_attention", "full_attention"],
        )
    )
    with pytest.raises(
        ConfigError,
        match=r"must run on the hidden states alone with int4 experts, got the int4 "
        r"block's forward raising TypeError",
    ):
        replace_moe_blocks(model, backend="reference")
    _assert_left_alone(model)


def test_a_model_without_blocks_of_the_layout_says_so() -> None:
    """JetMoE declares experts but keeps them in another layout: not silently left."""
    model = JetMoeForCausalLM(
        JetMoeConfig(
            vocab_size=64,
            hidden_size=64,
            num_hidden_layers=2,
            num_key_value_heads=2,
            kv_channels=16,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
        )
    )
    with pytest.raises(
        ConfigError,
        match=r"model must have sparse MoE blocks .* got none in JetMoeForCausalLM "
        r"although its config declares 4 experts",
    ):
        replace_moe_blocks(model, backend="reference")


def test_mxfp4_experts_are_refused_with_the_way_to_float_ones() -> None:
    """gpt-oss loaded in MXFP4 keeps ``gate_up_proj_blocks`` instead of float
    ``gate_up_proj``: the error says how to load float experts."""
    model = _build("gpt_oss")
    for name in find_moe_blocks(model):
        experts = model.get_submodule(f"{name}.experts")
        blocks = experts.get_parameter("gate_up_proj").detach().to(torch.uint8)
        del experts.gate_up_proj
        experts.register_buffer("gate_up_proj_blocks", blocks)
    with pytest.raises(
        ConfigError,
        match=r"got none in GptOssForCausalLM although its config declares \d+ experts "
        r"\(its experts hold MXFP4 blocks: .*Mxfp4Config\(dequantize=True\)",
    ):
        replace_moe_blocks(model, backend="reference")


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_a_replaced_model_saved_by_transformers_loads_back(
    name: str, generator: torch.Generator, tmp_path: Path
) -> None:
    """``save_pretrained`` of a replaced model writes int4-moe's own tensors (Mixtral's
    under ``block_sparse_moe``: transformers renames the block on saving); they are
    read back as they are, bit for bit."""
    original = _build(name)
    quantized = copy.deepcopy(original)
    replace_moe_blocks(quantized, scheme=INT4_ASYM_G32, backend="reference")
    quantized.save_pretrained(tmp_path)
    loaded = copy.deepcopy(original)
    names = replace_moe_blocks(loaded, backend="reference", checkpoint=tmp_path)
    for block in names:
        want = quantized.get_submodule(f"{block}.experts")
        got = loaded.get_submodule(f"{block}.experts")
        assert isinstance(want, Int4MoE)
        assert isinstance(got, Int4MoE)
        assert got.scheme == INT4_ASYM_G32
        for key, tensor in want.state_dict().items():
            torch.testing.assert_close(got.state_dict()[key], tensor, **EXACT)
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    torch.testing.assert_close(_logits(loaded, ids), _logits(quantized, ids), **EXACT)


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


def test_an_unknown_routing_mode_is_refused() -> None:
    """Not silently read as ``config``: refused, and no block is replaced."""
    model = _build("qwen3_moe")
    with pytest.raises(
        ConfigError, match=r"routing must be `model` or `config`, got 'gate'"
    ):
        replace_moe_blocks(model, backend="reference", routing="gate")  # type: ignore[arg-type]
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules())


def _scaled_last_block(model: torch.nn.Module, wrap: "Any") -> None:
    last = model.get_submodule(list(find_moe_blocks(model))[-1])
    plain = type(last).forward

    def forward(self: torch.nn.Module, h: torch.Tensor) -> "Any":
        return wrap(plain(self, h))

    last.forward = forward.__get__(last)


def test_a_block_scaling_its_output_by_one_percent_is_refused() -> None:
    """The replacement check's tolerance is float rounding, not a lost factor."""
    model = _build("qwen3_moe")
    _scaled_last_block(model, lambda out: 1.01 * out)
    with pytest.raises(
        ConfigError, match=r"block 'model\.layers\.1\.mlp' .* differing by 0\.0099"
    ):
        replace_moe_blocks(model, backend="reference")


def test_a_block_returning_another_structure_or_shape_is_refused() -> None:
    """Outputs are compared by structure and shape, not broadcast against each other."""
    model = _build("qwen3_moe")
    _scaled_last_block(model, lambda out: out.reshape(-1, out.shape[-1]))
    with pytest.raises(
        ConfigError,
        match=r"output 0 must have shape \(1, 16, 64\) as in Int4SparseMoeBlock, got \(16, 64\)",
    ):
        replace_moe_blocks(model, backend="reference")
    model = _build("qwen3_moe")
    _scaled_last_block(model, lambda out: (out, out))
    with pytest.raises(
        ConfigError,
        match=r"must return what Int4SparseMoeBlock returns, got 2 outputs against 1",
    ):
        replace_moe_blocks(model, backend="reference")


def test_a_refused_model_keeps_its_float_experts(generator: torch.Generator) -> None:
    """The check stands the int4 experts in for the float ones only while it runs: a
    refused model computes what it computed before."""
    model = _build("qwen3_moe")
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    before = _logits(model, ids)
    experts = [model.get_submodule(f"model.layers.{i}.mlp.experts") for i in (0, 1)]
    _scaled_last_block(model, lambda out: 2.5 * out)
    with pytest.raises(ConfigError):
        replace_moe_blocks(model, backend="reference")
    assert [
        model.get_submodule(f"model.layers.{i}.mlp.experts") for i in (0, 1)
    ] == experts
    model.get_submodule("model.layers.1.mlp").__dict__.pop("forward")
    torch.testing.assert_close(_logits(model, ids), before, rtol=0, atol=0)


def test_a_model_in_training_is_checked_in_eval_and_left_in_training() -> None:
    """The check runs the blocks in eval mode (a block acting otherwise in training,
    as dropout or router jitter do, is not refused for it), and every module's mode
    is restored afterwards."""
    model = _build("qwen3_moe")
    last = model.get_submodule("model.layers.1.mlp")
    plain = type(last).forward

    def forward(self: torch.nn.Module, h: torch.Tensor) -> Any:
        return plain(self, h) * (0.5 if self.training else 1.0)

    last.forward = forward.__get__(last)
    model.train()
    assert len(replace_moe_blocks(model, backend="reference")) == 2
    assert all(m.training for m in model.modules())


def test_gpt_oss_from_an_int4_checkpoint_is_refused() -> None:
    """Its expert biases are not read from checkpoints: refused, not run without them
    (the replacement check cannot see it: both sides run the same int4 experts). The
    checkpoint holds the experts without biases, as export_expert_weights writes them."""
    quantized = _build("gpt_oss")
    names = replace_moe_blocks(quantized, backend="reference")
    state: dict[str, torch.Tensor] = {}
    for block in names:
        int4 = quantized.get_submodule(f"{block}.experts")
        assert isinstance(int4, Int4MoE)
        unbiased = attrs.evolve(int4.weights, w13_bias=None, w2_bias=None)
        state |= export_expert_weights(unbiased, prefix=f"{block}.experts")
    model = _build("gpt_oss")
    with pytest.raises(
        ConfigError,
        match="loading gpt-oss int4 experts from a checkpoint is not supported",
    ):
        replace_moe_blocks(model, backend="reference", checkpoint=state)
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules())


def test_a_second_replacement_says_the_blocks_are_already_replaced() -> None:
    model = _build("qwen2_moe")
    replace_moe_blocks(model, backend="reference")
    with pytest.raises(ConfigError, match="already are Int4SparseMoeBlock"):
        replace_moe_blocks(model, backend="reference")


def test_a_backend_that_cannot_run_the_block_is_reported_as_such() -> None:
    """The replacement check runs the new block; a backend refusing the device is
    that error, not a complaint about the block's layout."""
    model = _build("mixtral")
    with pytest.raises(BackendUnavailableError, match=r"xpu-fused: device must be"):
        replace_moe_blocks(model, backend="xpu-fused")
