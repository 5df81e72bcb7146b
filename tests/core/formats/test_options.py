"""Format names, quantization_config parsing and import dispatch."""

import attrs
import pytest
import torch

from core.errors import ConfigError
from core.formats import FormatOptions, import_projection, parse_quantization_config
from core.formats.options import to_checkpoint_format
from tests.core.formats.packers import (
    dequantize_projection,
    gptq_dequantize,
    gptq_pack,
)
from tests.tolerances import EXACT

INT4_G32 = {
    "num_bits": 4,
    "type": "int",
    "symmetric": True,
    "strategy": "group",
    "group_size": 32,
}
EXPERTS = ["model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0.w2"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("auto", "auto"),
        ("GPTQ", "gptq"),
        ("awq", "awq"),
        ("compressed_tensors", "compressed-tensors"),
        ("Compressed-Tensors", "compressed-tensors"),
    ],
)
def test_format_names_are_normalised(name: str, expected: str) -> None:
    assert to_checkpoint_format(name) == expected


@pytest.mark.parametrize("name", ["gptq_v2", "exl2", "", None])
def test_unknown_format_names_are_config_errors(name: object) -> None:
    with pytest.raises(ConfigError, match="format must be `auto`, `gptq`, `awq`"):
        to_checkpoint_format(name)
    with pytest.raises(ConfigError, match="format must be `auto`"):
        parse_quantization_config(None, name)  # type: ignore[arg-type]


def test_format_options_check_their_fields() -> None:
    assert FormatOptions(format="compressed_tensors").format == "compressed-tensors"
    with pytest.raises(ConfigError, match=r"FormatOptions\.format must be `gptq`"):
        FormatOptions(format="auto")
    with pytest.raises(ConfigError, match=r"FormatOptions\.format .* got 'gptq_v2'"):
        FormatOptions(format="gptq_v2")
    with pytest.raises(ConfigError, match="checkpoint_format must be `gptq` or"):
        FormatOptions(format="gptq", checkpoint_format="marlin")


def test_import_projection_dispatches_on_the_normalised_name(
    generator: torch.Generator,
) -> None:
    codes = torch.randint(0, 16, (64, 16), generator=generator)
    zeros = torch.randint(1, 16, (2, 16), generator=generator)
    qweight, qzeros = gptq_pack(codes, zeros)
    scales = (torch.rand(2, 16, generator=generator) + 0.1).to(torch.float16)
    tensors = {"qweight": qweight, "scales": scales, "qzeros": qzeros}
    proj = import_projection(
        FormatOptions(format="GPTQ", checkpoint_format="gptq"), tensors
    )
    expected_KN = gptq_dequantize(
        qweight, scales, qzeros, (torch.arange(64) // 32).tolist()
    )
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float16).T, expected_KN, **EXACT
    )
    with pytest.raises(
        ConfigError, match=r"awq projection tensors must include \['qzeros'\]"
    ):
        import_projection(
            FormatOptions(format="awq"), {"qweight": qweight, "scales": scales}
        )
    with pytest.raises(
        ConfigError, match=r"must include \['weight_packed', 'weight_scale'\]"
    ):
        import_projection(FormatOptions(format="compressed-tensors"), tensors)


def _mixed(int8_targets: list[str], int4_targets: list[str]) -> dict[str, object]:
    """W8A16 for some modules and asymmetric W4A16 g32 for others, per-group formats."""
    return {
        "quant_method": "compressed-tensors",
        "format": "mixed-precision",
        "config_groups": {
            "group_0": {
                "targets": int8_targets,
                "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
                "format": "pack-quantized",
            },
            "group_1": {
                "targets": int4_targets,
                "weights": INT4_G32 | {"symmetric": False},
                "format": "pack-quantized",
            },
        },
        "ignore": ["lm_head"],
    }


def test_compressed_tensors_group_of_the_experts_is_read() -> None:
    config = _mixed(["re:.*self_attn.*"], ["re:.*experts.*"])
    opts = parse_quantization_config(config, "auto", module_names=EXPERTS)
    assert opts == FormatOptions(
        format="compressed-tensors", group_size=32, symmetric=False
    )
    assert parse_quantization_config(config) == opts  # the only int4 group
    swapped = _mixed(["re:.*experts.*"], ["re:.*self_attn.*"])
    with pytest.raises(
        ConfigError,
        match=r"'group_0' weights num_bits must be 4 for int4 experts, got 8",
    ):
        parse_quantization_config(swapped, "auto", module_names=EXPERTS)


def test_compressed_tensors_asymmetric_without_zero_points_is_refused() -> None:
    """``symmetric: false`` and no ``weight_zero_point``: refused, not read as 8."""
    opts = FormatOptions(format="compressed-tensors", group_size=32, symmetric=False)
    tensors = {
        "weight_packed": torch.zeros(16, 8, dtype=torch.int32),
        "weight_scale": torch.ones(16, 2),
        "weight_shape": torch.tensor([16, 64]),
    }
    with pytest.raises(
        ConfigError,
        match=r"symmetric=False .* needs weight_zero_point, got None among "
        r"\['weight_packed', 'weight_scale', 'weight_shape'\]",
    ):
        import_projection(opts, tensors)
    symmetric = attrs.evolve(opts, symmetric=True)
    assert import_projection(symmetric, tensors).zero_point is None


@pytest.mark.parametrize(
    ("meta", "carry"),
    [
        ({"quantizer": ["gptqmodel:4.0.0"], "uri": "x"}, True),
        ({"quantizer": "GPTQModel:2.2.0"}, True),
        ({"quantizer": ["optimum:1.24"]}, False),
        (None, False),
    ],
)
def test_gptq_config_says_format_and_writer(
    meta: dict[str, object] | None, carry: bool
) -> None:
    config: dict[str, object] = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    if meta is not None:
        config["meta"] = meta
    opts = parse_quantization_config(config)
    assert opts is not None
    assert opts.checkpoint_format == "gptq"  # a config without the key is v1
    assert opts.gptq_v1_word_carry is carry
    config["checkpoint_format"] = "gptq_v2"
    assert parse_quantization_config(config) == attrs.evolve(
        opts, checkpoint_format="gptq_v2"
    )


def test_gptq_without_a_config_leaves_the_version_unsaid() -> None:
    opts = parse_quantization_config(None, "gptq")
    assert opts == FormatOptions(format="gptq")
    assert opts.checkpoint_format is None
    assert not opts.gptq_v1_word_carry


def test_gptq_marlin_checkpoints_are_refused_by_name() -> None:
    config = {"quant_method": "gptq", "bits": 4, "is_marlin_format": True}
    with pytest.raises(ConfigError, match="is_marlin_format must be false"):
        parse_quantization_config(config)


EXPERT_MODULES = [
    f"model.layers.1.mlp.experts.{e}.{p}"
    for e in range(2)
    for p in ("gate_proj", "up_proj", "down_proj")
]


def _gptq_dynamic(dynamic: dict[str, object]) -> dict[str, object]:
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "sym": True,
        "checkpoint_format": "gptq",
        "dynamic": dynamic,
    }


def test_gptq_dynamic_overrides_apply_to_the_experts() -> None:
    """GPTQModel's first matching rule decides: here the experts' group 32, asym."""
    config = _gptq_dynamic(
        {
            r"+:.*\.self_attn\..*": {"group_size": 64},
            r".*\.experts\..*": {"group_size": 32, "sym": False},
            r".*": {"bits": 8},
        }
    )
    opts = parse_quantization_config(config, module_names=EXPERT_MODULES)
    assert opts is not None
    assert (opts.group_size, opts.symmetric) == (32, False)
    attention = parse_quantization_config(
        config, module_names=["model.layers.1.self_attn.q_proj"]
    )
    assert attention is not None
    assert attention.group_size == 64
    assert parse_quantization_config(_gptq_dynamic({})) == FormatOptions(
        format="gptq", group_size=128, symmetric=True, checkpoint_format="gptq"
    )


@pytest.mark.parametrize(
    ("dynamic", "message"),
    [
        (
            {r"-:.*\.experts\.1\..*": {}},
            r"must quantize every expert module, got \['model\.layers\.1\.mlp\.experts"
            r"\.1\.gate_proj'.* excluded by '-:\.\*",
        ),
        (
            {r".*\.experts\.0\..*": {"group_size": 32}},
            r"same settings, got \{'group_size': 32\} for .*experts\.0\.gate_proj' "
            r"and \{\} for .*experts\.1\.gate_proj' over the base config",
        ),
        ({r".*experts.*": {"bits": 8}}, r"bits must be 4 for int4 experts, got 8"),
    ],
    ids=["excluded", "differing", "eight_bit"],
)
def test_gptq_dynamic_refusals_name_the_rule(
    dynamic: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_quantization_config(_gptq_dynamic(dynamic), module_names=EXPERT_MODULES)


def _auto_round(**kw: object) -> dict[str, object]:
    return {"quant_method": "auto-round", "bits": 4, "group_size": 32, "sym": True} | kw


def test_auto_round_reads_as_its_packing() -> None:
    """As vLLM reads it: GPTQ v1 for auto_gptq (the default), AWQ GEMM for auto_awq;
    ``extra_config`` by exact module name."""
    assert parse_quantization_config(_auto_round()) == FormatOptions(
        format="gptq", group_size=32, symmetric=True, checkpoint_format="gptq"
    )
    extra = {m: {"group_size": 64, "sym": False} for m in EXPERT_MODULES}
    opts = parse_quantization_config(
        _auto_round(extra_config=extra | {"lm_head": {"bits": 16}}),
        module_names=EXPERT_MODULES,
    )
    assert opts == FormatOptions(
        format="gptq", group_size=64, symmetric=False, checkpoint_format="gptq"
    )
    awq = _auto_round(packing_format="auto_round:auto_awq", sym=False)
    assert parse_quantization_config(awq) == FormatOptions(format="awq", group_size=32)
    assert parse_quantization_config(awq, "awq") == FormatOptions(
        format="awq", group_size=32
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"packing_format": "auto_round:marlin"}, r"packing_format must be one in"),
        ({"data_type": "nv_fp"}, r"data_type must be `int`, got 'nv_fp'"),
        ({"bits": 2}, r"bits must be 4 for int4 experts, got 2"),
        (
            {"packing_format": "auto_round:auto_awq"},
            r"AWQ's layout must be asymmetric",
        ),
        (
            {"block_name_to_quantize": "model.layers.0"},
            r"must cover the expert modules, got \['model\.layers\.0'\] without "
            r"'model\.layers\.1\.mlp\.experts\.0\.gate_proj'",
        ),
        (
            {"extra_config": {EXPERT_MODULES[0]: {"bits": 8}}},
            r"extra_config must give every expert module the same settings, got "
            r"\{.bits.: 8\} for .*experts\.0\.gate_proj. and \{\} for "
            r".*experts\.0\.up_proj. over the base config",
        ),
    ],
    ids=["packing", "data_type", "bits", "awq_sym", "blocks", "extra"],
)
def test_auto_round_refusals_say_why(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_quantization_config(_auto_round(**changes), module_names=EXPERT_MODULES)


def test_gptq_dynamic_restating_the_base_is_no_difference() -> None:
    """GPTQModel gives every expert group 128 here: not a difference between them."""
    config = _gptq_dynamic({r"+:.*experts\.0\..*": {"group_size": 128}})
    opts = parse_quantization_config(config, module_names=EXPERT_MODULES)
    assert opts is not None
    assert opts.group_size == 128


@pytest.mark.parametrize(
    "key", [r".*\.experts\..*", "model.layers.1.mlp.experts.1"], ids=["regex", "parent"]
)
def test_auto_round_extra_config_patterns_reaching_experts_are_refused(
    key: str,
) -> None:
    """Newer vLLM applies such keys as patterns; here they are refused, not ignored."""
    config = _auto_round(
        extra_config={key: {"group_size": 64}, "lm_head": {"bits": 16}}
    )
    with pytest.raises(ConfigError, match="must name the expert modules exactly, got"):
        parse_quantization_config(config, module_names=EXPERT_MODULES)


@pytest.mark.parametrize("key", ["zero_point", "zero_point_false_as_string"])
def test_awq_without_zero_points_is_refused(key: str) -> None:
    """AutoAWQ's ``zero_point: false`` (and a value that is not ``true``) is refused."""
    value: object = False if key == "zero_point" else "false"
    with pytest.raises(
        ConfigError, match=r"AWQ without zero points \(zero_point=false\)"
    ):
        parse_quantization_config(
            {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": value}
        )
    parse_quantization_config(
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    )


@pytest.mark.parametrize(
    ("config", "act_order"),
    [
        ({"desc_act": True}, True),
        ({"desc_act": True, "static_groups": True}, False),
        ({"desc_act": True, "static_groups": False}, True),
        ({"desc_act": False}, False),
        ({}, False),
    ],
    ids=["desc_act", "static_groups", "static_groups_false", "no_desc_act", "unsaid"],
)
def test_gptq_desc_act_declares_act_order(
    config: dict[str, object], act_order: bool
) -> None:
    """Static groups keep the groups in column order, so only they spare the g_idx."""
    opts = parse_quantization_config(
        {"quant_method": "gptq", "bits": 4, "group_size": 32} | config
    )
    assert opts is not None
    assert opts.act_order is act_order


@pytest.mark.parametrize(
    ("actorder", "act_order"),
    [
        ("group", True),
        (True, True),
        ("dynamic", True),  # compressed-tensors' alias of `group`
        ("weight", False),
        ("static", False),  # compressed-tensors' alias of `weight`
        (None, False),
        (False, False),
    ],
)
def test_compressed_tensors_actorder_group_declares_act_order(
    actorder: object, act_order: bool
) -> None:
    group = {"targets": ["Linear"], "weights": INT4_G32 | {"actorder": actorder}}
    config = {"quant_method": "compressed-tensors", "config_groups": {"g": group}}
    opts = parse_quantization_config(config, module_names=EXPERTS)
    assert opts is not None
    assert opts.act_order is act_order


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("gptq", "g_idx"), ("compressed-tensors", "weight_g_idx")],
)
def test_act_order_projection_without_its_g_idx_is_refused(fmt: str, name: str) -> None:
    """Read without the g_idx, act-order groups would be taken as contiguous."""
    tensors = {
        "qweight": torch.zeros(8, 16, dtype=torch.int32),
        "scales": torch.ones(2, 16),
        "weight_packed": torch.zeros(16, 8, dtype=torch.int32),
        "weight_scale": torch.ones(16, 2),
    }
    opts = FormatOptions(format=fmt, group_size=32, symmetric=True, act_order=True)
    with pytest.raises(
        ConfigError,
        match=rf"must include '{name}': quantization_config declares act-order",
    ):
        import_projection(opts, tensors)


def test_auto_round_extra_config_restating_the_base_is_no_difference() -> None:
    """An entry for one expert that restates the base config changes nothing."""
    extra = {EXPERT_MODULES[0]: {"bits": 4, "group_size": 32, "sym": True}}
    opts = parse_quantization_config(
        _auto_round(extra_config=extra), module_names=EXPERT_MODULES
    )
    assert opts == FormatOptions(
        format="gptq", group_size=32, symmetric=True, checkpoint_format="gptq"
    )
