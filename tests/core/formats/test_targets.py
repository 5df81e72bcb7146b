"""config_groups selection; compressed-tensors' own target matcher is the reference."""

from collections import OrderedDict

import pytest
import torch
from compressed_tensors.utils.match import match_targets

from core.errors import ConfigError
from core.formats.targets import group_of_module, select_config_group

INT4_G32 = {
    "num_bits": 4,
    "type": "int",
    "symmetric": True,
    "strategy": "group",
    "group_size": 32,
}
INT8_CH = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
GROUPS: dict[str, dict[str, object]] = {
    "group_0": {"targets": ["Linear"], "weights": INT8_CH},
    "group_1": {"targets": ["re:.*experts.*"], "weights": INT4_G32},
    "group_2": {
        "targets": ["model.layers.0.mlp.experts.0.down_proj"],
        "weights": INT8_CH,
    },
    "group_3": {
        "targets": ["re:.*self_attn.*", "re:.*experts.*gate_proj", "Linear"],
        "weights": INT4_G32,
    },
}
MODULES = [
    "model.layers.0.mlp.experts.0.gate_proj",
    "model.layers.0.mlp.experts.0.down_proj",
    "model.layers.0.mlp.experts.1.up_proj",
    "model.layers.0.mlp.experts.gate_up_proj",
    "model.layers.0.self_attn.q_proj",
    "lm_head",
]


def _theirs(module: str, groups: dict[str, dict[str, object]]) -> str | None:
    by_target: OrderedDict[str, str] = OrderedDict()
    for label, group in groups.items():
        targets = group["targets"]
        assert isinstance(targets, list)
        for target in targets:
            by_target[target] = label
    matched = match_targets(module, torch.nn.Linear(1, 1), by_target)
    return by_target[matched[0]] if matched else None


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("drop", [None, "group_0", "group_1", "group_3"])
def test_group_of_module_matches_compressed_tensors(
    module: str, drop: str | None
) -> None:
    groups = {k: v for k, v in GROUPS.items() if k != drop}
    assert group_of_module(module, groups) == _theirs(module, groups)


def test_experts_group_is_chosen_among_mixed_recipes() -> None:
    config = {
        "config_groups": {
            "group_0": {"targets": ["re:.*self_attn.*"], "weights": INT8_CH},
            "group_1": {"targets": ["re:.*experts.*"], "weights": INT4_G32},
        },
        "ignore": ["lm_head", "re:.*mlp.gate$"],
    }
    label, group = select_config_group(config, module_names=MODULES[:3])
    assert (label, group["weights"]) == ("group_1", INT4_G32)
    assert select_config_group(config)[0] == "group_1"  # the only int4 group


def test_ambiguous_or_ignored_experts_are_refused() -> None:
    g128 = INT4_G32 | {"group_size": 128}
    two = {
        "config_groups": {
            "group_0": {"targets": ["re:.*self_attn.*"], "weights": g128},
            "group_1": {"targets": ["re:.*mlp.*"], "weights": INT4_G32},
        }
    }
    with pytest.raises(ConfigError, match=r"\['group_0', 'group_1'\] all have 4-bit"):
        select_config_group(two, module_names=["model.layers.0.block.w1"])
    split = {
        "config_groups": {
            "group_0": {"targets": ["re:.*down_proj"], "weights": g128},
            "group_1": {"targets": ["Linear"], "weights": INT4_G32},
        }
    }
    with pytest.raises(ConfigError, match=r"\['group_0', 'group_1'\] all target"):
        select_config_group(split, module_names=MODULES[:2])
    ignored = {
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": INT4_G32}},
        "ignore": ["re:.*experts.1.*"],
    }
    with pytest.raises(ConfigError, match=r"ignore entry 're:\.\*experts\.1\.\*'"):
        select_config_group(ignored, module_names=MODULES[:3])
    with pytest.raises(ConfigError, match="valid `re:` regex"):
        select_config_group(
            {"config_groups": {"g": {"targets": ["re:(experts"], "weights": INT4_G32}}},
            module_names=MODULES[:1],
        )
    with pytest.raises(ConfigError, match="a group with 4-bit weights"):
        select_config_group(
            {"config_groups": {"g": {"targets": ["Linear"], "weights": INT8_CH}}}
        )
    with pytest.raises(ConfigError, match="at least one group"):
        select_config_group({"config_groups": {}})


def test_an_exact_name_wins_over_a_regex_whatever_their_spelling() -> None:
    """Exact names first, then ``re:`` regexes: also for a name sorting after "re:"."""
    module = "transformer.h.0.mlp.experts.0.gate_proj"
    groups: dict[str, dict[str, object]] = {
        "int8": {"targets": ["re:.*gate_proj"], "weights": INT8_CH},
        "int4": {"targets": [module], "weights": INT4_G32},
    }
    assert _theirs(module, groups) == "int4"
    assert group_of_module(module, groups) == "int4"
    label, _ = select_config_group({"config_groups": groups}, module_names=[module])
    assert label == "int4"
