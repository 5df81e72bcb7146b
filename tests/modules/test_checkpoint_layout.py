"""modules/checkpoint_layout.py: projection names, format detection, missing or
unexpected tensors and the router's correction bias, read through load_experts."""

import pytest
import torch

from core.config import MoEConfig
from core.errors import ConfigError
from core.formats import quantization_config
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32
from modules.checkpoint import load_experts
from tests.modules.checkpoint_states import (
    CFG,
    PREFIX,
    assert_same,
    asymmetric_export,
    awq_state,
    ct_state,
    gptq_state,
    quantized_weights,
)
from tests.tolerances import EXACT


def test_mixtral_naming_is_read(generator: torch.Generator) -> None:
    w = quantized_weights(generator, INT4_SYM_G32)
    state = ct_state(w, ("w1", "w3", "w2"))
    assert_same(w, load_experts(state, prefix=PREFIX, config=CFG).weights)


def test_gptq_is_detected_and_symmetric_zero_points_dropped(
    generator: torch.Generator,
) -> None:
    w = quantized_weights(generator, INT4_SYM_G32)
    loaded = load_experts(gptq_state(w), prefix=PREFIX, config=CFG)
    assert loaded.format == "gptq"
    assert_same(w, loaded.weights)


def test_awq_is_detected_from_qweight_shape(generator: torch.Generator) -> None:
    w = quantized_weights(generator, INT4_ASYM_G32)
    loaded = load_experts(awq_state(w), prefix=PREFIX, config=CFG)
    assert loaded.format == "awq"
    assert_same(w, loaded.weights)


def test_fused_three_d_experts(generator: torch.Generator) -> None:
    from core.formats import split_experts, to_compressed_tensors

    w = quantized_weights(generator, INT4_ASYM_G32)
    w13, w2 = split_experts(w)
    state = {
        f"{PREFIX}.experts.gate_up_proj.{k}": v
        for k, v in to_compressed_tensors(w13).items()
    }
    state |= {
        f"{PREFIX}.experts.down_proj.{k}": v
        for k, v in to_compressed_tensors(w2).items()
    }
    assert_same(w, load_experts(state, prefix=PREFIX, config=CFG).weights)


def test_missing_and_extra_tensors_are_named(generator: torch.Generator) -> None:
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    del state[f"{PREFIX}.experts.2.up_proj.weight_scale"]
    with pytest.raises(
        ConfigError, match=r"missing .*experts\.2\.up_proj\.weight_scale"
    ):
        load_experts(state, prefix=PREFIX, config=CFG)
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    state[f"{PREFIX}.experts.1.down_proj.bias"] = torch.zeros(64)
    with pytest.raises(ConfigError, match=r"unexpected .*experts\.1\.down_proj\.bias"):
        load_experts(state, prefix=PREFIX, config=CFG)
    with pytest.raises(ConfigError, match="missing"):
        load_experts(
            ct_state(quantized_weights(generator, INT4_SYM_G32)),
            prefix=PREFIX,
            config=MoEConfig(
                num_experts=4, top_k=2, hidden_size=64, intermediate_size=32
            ),
        )


def test_a_checkpoint_of_more_experts_than_the_config_says_is_named(
    generator: torch.Generator,
) -> None:
    """Reported as a list of unexpected tensors before, unlike a D or F mismatch."""
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    fewer = MoEConfig(
        num_experts=CFG.num_experts - 1, top_k=2,
        hidden_size=CFG.hidden_size, intermediate_size=CFG.intermediate_size,
    )  # fmt: skip
    held = CFG.num_experts
    with pytest.raises(
        ConfigError,
        match=rf"num_experts={held - 1} but '{PREFIX}\.experts\.' numbers experts up "
        rf"to {held - 1} "
        rf"\({held} held\)",
    ):
        load_experts(state, prefix=PREFIX, config=fewer)


def test_asymmetric_compressed_tensors_without_a_zero_point_are_refused(
    generator: torch.Generator,
) -> None:
    """Declared asymmetric: a missing weight_zero_point is named, not read as 8."""
    state = asymmetric_export(generator)
    dropped = f"{PREFIX}.experts.1.up_proj.weight_zero_point"
    del state[dropped]
    with pytest.raises(
        ConfigError, match=rf"missing compressed-tensors tensors: {dropped}"
    ):
        load_experts(
            state, prefix=PREFIX, config=CFG,
            quantization_config=quantization_config(INT4_ASYM_G32),
        )  # fmt: skip


def test_asymmetric_gptq_missing_one_qzeros_is_named(
    generator: torch.Generator,
) -> None:
    """``sym: false`` makes every projection's qzeros required: one dropped is
    reported by name, not read as zero point 8."""
    state = gptq_state(quantized_weights(generator, INT4_ASYM_G32))
    del state[f"{PREFIX}.experts.1.up_proj.qzeros"]
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False}
    with pytest.raises(
        ConfigError, match=r"missing gptq tensors: .*experts\.1\.up_proj\.qzeros"
    ):
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc)


def _act_order_config(fmt: str, *, declared: bool) -> dict[str, object]:
    """GPTQ ``desc_act`` with or without ``static_groups``; compressed-tensors
    ``actorder`` `group` or `weight`: act-order declared or not."""
    if fmt == "gptq":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 32,
            "desc_act": True,
            "static_groups": not declared,
        }
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": 32,
        "actorder": "group" if declared else "weight",
    }
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }


@pytest.mark.parametrize(
    ("fmt", "name"), [("gptq", "g_idx"), ("compressed-tensors", "weight_g_idx")]
)
def test_act_order_checkpoints_without_their_g_idx_are_refused(
    fmt: str, name: str, generator: torch.Generator
) -> None:
    """Act-order declared, g_idx not stored: refused by name, never read as
    contiguous groups; GPTQ static groups and `weight` ordering need none."""
    w = quantized_weights(generator, INT4_SYM_G32)
    state = gptq_state(w) if fmt == "gptq" else ct_state(w)
    stored = dict(state)
    state = {n: t for n, t in state.items() if not n.endswith(f".{name}")}
    declared = _act_order_config(fmt, declared=True)
    with pytest.raises(
        ConfigError,
        match=rf"missing {fmt} tensors: .*experts\.0\.down_proj\.{name}.* "
        r"\(quantization_config declares act-order",
    ):
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=declared)
    spared = _act_order_config(fmt, declared=False)
    loaded = load_experts(state, prefix=PREFIX, config=CFG, quantization_config=spared)
    assert_same(w, loaded.weights)
    if fmt == "gptq":  # stored, the g_idx is read (here: contiguous groups)
        loaded = load_experts(
            stored, prefix=PREFIX, config=CFG, quantization_config=declared
        )
        assert_same(w, loaded.weights)


@pytest.mark.parametrize("dot", ["", "."], ids=["prefix", "prefix_with_dot"])
@pytest.mark.parametrize("where", ["gate.", ""], ids=["on_gate", "on_block"])
def test_correction_bias_is_read_from_the_gate_or_the_block(
    where: str, dot: str, generator: torch.Generator
) -> None:
    """DeepSeek-V3 stores it on the gate, MiniMax-M2 on the block; both at once is
    ambiguous and raises. A prefix written with a trailing dot finds the router and
    the bias as it finds the experts."""
    w = quantized_weights(generator, INT4_SYM_G32)
    bias = torch.randn(3, generator=generator)
    gate = torch.randn(3, 64, generator=generator)
    state = ct_state(w) | {
        f"{PREFIX}.{where}e_score_correction_bias": bias,
        f"{PREFIX}.gate.weight": gate,
    }
    loaded = load_experts(state, prefix=PREFIX + dot, config=CFG)
    assert loaded.e_score_correction_bias is not None
    torch.testing.assert_close(loaded.e_score_correction_bias, bias, **EXACT)
    assert loaded.gate_weight is not None
    torch.testing.assert_close(loaded.gate_weight, gate, **EXACT)
    both = state | {
        f"{PREFIX}.gate.e_score_correction_bias": bias,
        f"{PREFIX}.e_score_correction_bias": bias,
    }
    with pytest.raises(ConfigError, match="must hold one e_score_correction_bias"):
        load_experts(both, prefix=PREFIX, config=CFG)
