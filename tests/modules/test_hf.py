"""Hugging Face MoE blocks replaced by Int4MoE, checked against the original model.

Tiny random-weight transformers models built from config (no downloads). Two checks
per model: against the original run on the dequantized int4 weights (float32
rounding only), and against the original float model (int4 error, SQNR floor).
"""

import copy
from typing import Any

import pytest
import torch
from torch import nn
from transformers import (
    JetMoeConfig,
    JetMoeForCausalLM,
    Lfm2MoeConfig,
    Lfm2MoeForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
)

from core.errors import BackendUnavailableError, ConfigError, ShapeError
from core.scheme import INT4_SYM_G32, Int4Scheme
from modules import Int4MoE
from modules.hf import (
    Int4SparseMoeBlock,
    RoutingMode,
    find_moe_blocks,
    replace_moe_blocks,
)
from tests.modules.hf_models import (
    COMMON,
    HEAD_DIM,
    MODELS,
    ROUTINGS,
    _assert_left_alone,
    _assert_runs_its_dequantized_experts,
    _build,
    _load_dequantized,
    _logits,
)
from tests.tolerances import EXACT, HF_LOGITS_SQNR_FLOOR_DB, KERNEL_VS_ORACLE, sqnr_db


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


def test_a_scheme_that_does_not_fit_the_layers_is_named_before_any_block() -> None:
    """The group size is checked against the model's sizes first, naming ``scheme``."""
    model = _build("mixtral")  # hidden_size 64
    before = [type(m) for m in model.modules()]
    with pytest.raises(
        ShapeError,
        match=r"scheme must fit the model's MoE layers, got int4_sym_g128: "
        r"hidden_size=64 must be divisible by group_size=128",
    ):
        replace_moe_blocks(model, scheme=Int4Scheme(group_size=128))
    assert [type(m) for m in model.modules()] == before


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
