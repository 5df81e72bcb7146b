"""Loading one MoE layer from safetensors files or state dicts, in every format."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core.config import MoEConfig
from core.errors import ConfigError, ShapeError
from core.formats import quantization_config
from core.quantize import quantize_expert_weights
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, Int4Scheme
from core.weights import QuantizedExpertWeights
from modules import Int4MoE
from modules.checkpoint import from_checkpoint, load_experts
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


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_compressed_tensors_state_dict_round_trips(
    generator: torch.Generator, scheme: Int4Scheme
) -> None:
    w = quantized_weights(generator, scheme)
    loaded = load_experts(ct_state(w), prefix=PREFIX, config=CFG)
    assert loaded.format == "compressed-tensors"
    assert_same(w, loaded.weights)


def test_gptq_v2_needs_the_quantization_config(generator: torch.Generator) -> None:
    w = quantized_weights(generator, INT4_ASYM_G32)
    state = gptq_state(w)
    qc = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 32,
        "sym": False,
        "checkpoint_format": "gptq",
    }
    assert_same(
        w,
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc).weights,
    )
    qc["checkpoint_format"] = "gptq_v2"
    shifted = load_experts(
        state, prefix=PREFIX, config=CFG, quantization_config=qc
    ).weights
    assert shifted.w13_zero_point is not None
    assert w.w13_zero_point is not None
    assert torch.equal(shifted.w13_zero_point.long() + 1, w.w13_zero_point.long())


def test_gptq_state_without_a_config_reads_symmetric_v1_and_v2(
    generator: torch.Generator,
) -> None:
    """Symmetric zero points tell v1 (7 stored) from v2 (8 stored): both read exactly."""
    w = quantized_weights(generator, INT4_SYM_G32)
    for v1 in (True, False):
        state = gptq_state(w, v1=v1)
        assert_same(w, load_experts(state, prefix=PREFIX, config=CFG).weights)


def test_gptq_state_without_a_config_refuses_asymmetric(
    generator: torch.Generator,
) -> None:
    """v1 and v2 would read one zero point apart: refused rather than guessed."""
    state = gptq_state(quantized_weights(generator, INT4_ASYM_G32))
    with pytest.raises(
        ConfigError, match="checkpoint_format must be known for GPTQ qzeros"
    ):
        load_experts(state, prefix=PREFIX, config=CFG)


@pytest.mark.parametrize("group", ["32", 32.0, True])
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_a_group_size_that_is_not_an_int_is_refused(
    method: str, group: object, generator: torch.Generator
) -> None:
    """Read as "not declared", the group size would be guessed from the tensors."""
    w = quantized_weights(generator, INT4_ASYM_G32)
    state = gptq_state(w) if method == "gptq" else awq_state(w)
    qc = {"quant_method": method, "bits": 4, "group_size": group}
    with pytest.raises(
        ConfigError,
        match=rf"quantization_config group_size must be an int, got {group!r}",
    ):
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc)


def test_single_file_and_module_forward(
    generator: torch.Generator, tmp_path: Path
) -> None:
    w = quantized_weights(generator, INT4_SYM_G32)
    gate = torch.randn(3, 64, generator=generator).to(torch.float16)
    save_file(
        ct_state(w) | {f"{PREFIX}.gate.weight": gate},
        str(tmp_path / "model.safetensors"),
    )
    moe = from_checkpoint(
        tmp_path / "model.safetensors", prefix=PREFIX, config=CFG, backend="reference"
    )
    via_class = Int4MoE.from_checkpoint(
        tmp_path / "model.safetensors", prefix=PREFIX, config=CFG, backend="reference"
    )
    for name, tensor in moe.state_dict().items():
        torch.testing.assert_close(via_class.state_dict()[name], tensor, **EXACT)
    direct = Int4MoE.from_quantized(
        w, config=CFG, backend="reference", gate_weight=gate
    )
    x = torch.randn(5, 64, generator=generator).to(torch.float16)
    torch.testing.assert_close(moe(x), direct(x), **EXACT)


def test_formats_that_disagree_or_are_not_int4_are_refused(
    generator: torch.Generator,
) -> None:
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    with pytest.raises(ConfigError, match="contradicts"):
        load_experts(
            state,
            prefix=PREFIX,
            config=CFG,
            format="gptq",
            quantization_config={"quant_method": "awq"},
        )
    with pytest.raises(ConfigError, match="bits must be 4"):
        load_experts(
            state,
            prefix=PREFIX,
            config=CFG,
            quantization_config={"quant_method": "gptq", "bits": 8},
        )
    with pytest.raises(ConfigError, match="version must be `gemm`"):
        load_experts(
            state,
            prefix=PREFIX,
            config=CFG,
            quantization_config={"quant_method": "awq", "version": "gemv"},
        )
    with pytest.raises(
        ConfigError,
        match=rf"prefix 'model.layers.9.mlp': no tensors under "
        rf"'model.layers.9.mlp.experts.' in the checkpoint; experts are under the "
        rf"prefixes \['{PREFIX}'\]",
    ):
        load_experts(state, prefix="model.layers.9.mlp", config=CFG)
    same = load_experts(state, prefix=PREFIX + ".", config=CFG)  # a trailing dot
    assert_same(load_experts(state, prefix=PREFIX, config=CFG).weights, same.weights)


def _weights_args(
    bits: int, *, symmetric: bool, group: int | None
) -> dict[str, object]:
    return {
        "num_bits": bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": "channel" if group is None else "group",
        "group_size": group,
    }


def _two_groups(attention: dict[str, object], ignore: list[str]) -> dict[str, object]:
    """Attention quantized by `attention` (listed first), experts int4 sym g32."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {"targets": ["re:.*self_attn.*"], "weights": attention},
            "group_1": {
                "targets": ["re:.*experts.*"],
                "weights": _weights_args(4, symmetric=True, group=32),
            },
        },
        "ignore": ignore,
    }


@pytest.mark.parametrize(
    "attention",
    [
        _weights_args(8, symmetric=True, group=None),
        _weights_args(4, symmetric=True, group=128),
        _weights_args(4, symmetric=False, group=32),
    ],
    ids=["w8_channel", "w4_g128", "w4_asym_g32"],
)
def test_mixed_config_groups_read_the_experts_group(
    generator: torch.Generator, attention: dict[str, object]
) -> None:
    w = quantized_weights(generator, INT4_SYM_G32)
    qc = _two_groups(attention, ["lm_head", "re:.*mlp.gate$"])
    loaded = load_experts(
        ct_state(w), prefix=PREFIX, config=CFG, quantization_config=qc
    )
    assert_same(w, loaded.weights)
    qc = _two_groups(attention, ["re:.*experts\\.2\\..*"])
    with pytest.raises(ConfigError, match=r"leaves the expert module .*experts\.2\."):
        load_experts(ct_state(w), prefix=PREFIX, config=CFG, quantization_config=qc)


def test_format_names_are_checked_and_normalised(generator: torch.Generator) -> None:
    w = quantized_weights(generator, INT4_SYM_G32)
    for name in ("compressed_tensors", "Compressed-Tensors"):
        loaded = load_experts(ct_state(w), prefix=PREFIX, config=CFG, format=name)
        assert loaded.format == "compressed-tensors"
        assert_same(w, loaded.weights)
    with pytest.raises(ConfigError, match=r"format must be `auto`.* got 'gptq_v2'"):
        load_experts(ct_state(w), prefix=PREFIX, config=CFG, format="gptq_v2")


@pytest.mark.parametrize("packing", ["auto_round:auto_gptq", "auto_round:auto_awq"])
def test_auto_round_checkpoints_load_as_their_packing(
    packing: str, generator: torch.Generator
) -> None:
    w = quantized_weights(generator, INT4_ASYM_G32)
    state = gptq_state(w) if packing.endswith("gptq") else awq_state(w)
    qc = {
        "quant_method": "auto-round",
        "packing_format": packing,
        "bits": 4,
        "group_size": 32,
        "sym": False,
    }
    loaded = load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc)
    assert loaded.format == packing.rsplit("_", 1)[-1]
    assert_same(w, loaded.weights)


def test_int4_moe_own_state_is_read_as_it_is(generator: torch.Generator) -> None:
    """A saved Int4MoE's buffers under ``<prefix>.experts.``: the scheme follows from
    them (zero points: asymmetric; scale groups: the group size)."""
    from core.scheme import INT4_SYM

    def saved(w: QuantizedExpertWeights) -> dict[str, torch.Tensor]:
        moe = Int4MoE.from_quantized(w, config=CFG)
        return {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()}

    for scheme in (INT4_ASYM_G32, INT4_SYM):
        w = quantized_weights(generator, scheme)
        loaded = load_experts(saved(w), prefix=PREFIX, config=CFG)
        assert loaded.format == "int4-moe"
        assert_same(w, loaded.weights)
    state = saved(quantized_weights(generator, INT4_SYM_G32))
    gate = torch.randn(3, 64, generator=generator)
    routed = Int4MoE.from_quantized(
        quantized_weights(generator, INT4_SYM_G32), config=CFG
    )
    with_gate = {f"{PREFIX}.experts.{k}": v for k, v in routed.state_dict().items()}
    with_gate[f"{PREFIX}.experts.gate_weight"] = gate  # a standalone layer's router
    got = load_experts(with_gate, prefix=PREFIX, config=CFG).gate_weight
    assert got is not None
    torch.testing.assert_close(got, gate, **EXACT)
    two = with_gate | {f"{PREFIX}.gate.weight": gate}
    with pytest.raises(ConfigError, match=r"checkpoint must hold one router for"):
        load_experts(two, prefix=PREFIX, config=CFG)
    with pytest.raises(ConfigError, match="format 'gptq' contradicts the checkpoint"):
        load_experts(state, prefix=PREFIX, config=CFG, format="gptq")
    shard = state | {f"{PREFIX}.experts.expert_map": torch.zeros(3, dtype=torch.int32)}
    with pytest.raises(
        ConfigError, match=r"unexpected tensors beside int4-moe's own .*expert_map"
    ):
        load_experts(shard, prefix=PREFIX, config=CFG)


def test_load_experts_refuses_a_config_of_other_sizes(
    generator: torch.Generator,
) -> None:
    """The checkpoint's sizes are checked against the config by load_experts itself."""
    state = asymmetric_export(generator)
    wide = MoEConfig(num_experts=3, top_k=2, hidden_size=64, intermediate_size=64)
    with pytest.raises(
        ConfigError,
        match=r"checkpoint experts have \(num_experts, hidden_size, intermediate_size\) "
        r"= \(3, 64, 32\), but config says \(3, 64, 64\)",
    ):
        load_experts(
            state, prefix=PREFIX, config=wide,
            quantization_config=quantization_config(INT4_ASYM_G32),
        )  # fmt: skip


def test_int4_moe_own_state_takes_the_router_and_bias_of_the_gate(
    generator: torch.Generator,
) -> None:
    """A replaced model's saved layer keeps its router (and DeepSeek-V3's correction
    bias) on ``<prefix>.gate``, beside int4-moe's own tensors: both are read."""
    w = quantized_weights(generator, INT4_SYM_G32)
    moe = Int4MoE.from_quantized(w, config=CFG)
    gate = torch.randn(3, 64, generator=generator)
    bias = torch.randn(3, generator=generator)
    state = {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()} | {
        f"{PREFIX}.gate.weight": gate,
        f"{PREFIX}.gate.e_score_correction_bias": bias,
    }
    loaded = load_experts(state, prefix=PREFIX, config=CFG)
    assert loaded.format == "int4-moe"
    assert_same(w, loaded.weights)
    assert loaded.gate_weight is not None
    assert loaded.e_score_correction_bias is not None
    torch.testing.assert_close(loaded.gate_weight, gate, **EXACT)
    torch.testing.assert_close(loaded.e_score_correction_bias, bias, **EXACT)


def test_int4_moe_own_state_is_checked_against_the_config(
    generator: torch.Generator,
) -> None:
    """As for the quantizers' formats, the sizes are checked by load_experts itself,
    and a state missing one of int4-moe's required tensors is a ConfigError."""
    moe = Int4MoE.from_quantized(quantized_weights(generator, INT4_SYM_G32), config=CFG)
    state = {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()}
    wide = MoEConfig(num_experts=3, top_k=2, hidden_size=64, intermediate_size=64)
    with pytest.raises(
        ConfigError,
        match=r"checkpoint experts have \(num_experts, hidden_size, intermediate_size\) "
        r"= \(3, 64, 32\), but config says \(3, 64, 64\)",
    ):
        load_experts(state, prefix=PREFIX, config=wide)
    del state[f"{PREFIX}.experts.w2_scale"]
    with pytest.raises(ConfigError):
        load_experts(state, prefix=PREFIX, config=CFG)


def test_a_single_expert_layer_is_read(generator: torch.Generator) -> None:
    """Per-expert names stack into (E, ...) even for one expert."""

    one = MoEConfig(num_experts=1, top_k=1, hidden_size=64, intermediate_size=32)
    w = quantize_expert_weights(
        torch.randn(1, 64, 64, generator=generator),
        torch.randn(1, 64, 32, generator=generator),
        INT4_SYM_G32,
        scale_dtype=torch.float16,
    )
    assert_same(w, load_experts(ct_state(w), prefix=PREFIX, config=one).weights)


def test_a_malformed_projection_is_named_in_the_error(
    generator: torch.Generator,
) -> None:
    """A format error inside one projection says which projection it is."""
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    key = f"{PREFIX}.experts.2.down_proj.weight_scale"
    state[key] = state[key][:16]
    with pytest.raises(
        ShapeError, match=rf"{PREFIX}\.experts\.2\.down_proj: weight_scale must be"
    ):
        load_experts(state, prefix=PREFIX, config=CFG)


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_own_state_with_one_group_in_w13_and_several_in_w2(
    generator: torch.Generator, scheme: Int4Scheme
) -> None:
    """group_size == hidden_size < intermediate_size: w13 holds one group a row and w2
    two; the group size is read from both, and the state round-trips exactly."""
    cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=32, intermediate_size=64)
    w = quantize_expert_weights(
        torch.randn(2, 128, 32, generator=generator),
        torch.randn(2, 32, 64, generator=generator),
        scheme,
    )
    moe = Int4MoE.from_quantized(w, config=cfg)
    state = {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()}
    loaded = load_experts(state, prefix=PREFIX, config=cfg).weights
    assert loaded.scheme == scheme
    assert_same(w, loaded)
    scale = state[f"{PREFIX}.experts.w2_scale"]
    state[f"{PREFIX}.experts.w2_scale"] = torch.cat([scale, scale], dim=-1)
    with pytest.raises(
        ConfigError, match=r"must share one group size, got 32/1 and 64/4"
    ):
        load_experts(state, prefix=PREFIX, config=cfg)
