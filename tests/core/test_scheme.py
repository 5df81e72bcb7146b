"""Int4Scheme, MoEConfig and WeightLayout: validation, names, hashing."""

from typing import Any

import attrs
import pytest

from core.config import MoEConfig
from core.errors import ConfigError, ConfigTypeError, ShapeError
from core.layout import CANONICAL_LAYOUT, PackingFormat
from core.scheme import (
    INT4_ASYM_G32,
    INT4_ASYM_G128,
    INT4_SYM,
    INT4_SYM_G32,
    INT4_SYM_G128,
    Int4Mapping,
    Int4Scheme,
)


def test_named_schemes() -> None:
    assert Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=32) == INT4_SYM_G32
    assert INT4_ASYM_G32.has_zero_point
    assert not INT4_SYM_G128.has_zero_point
    assert INT4_ASYM_G128.name == "int4_asym_g128"
    assert INT4_SYM.group_size == -1
    assert (INT4_SYM_G32.qmin, INT4_SYM_G32.qmax) == (0, 15)
    assert len({INT4_SYM_G32, Int4Scheme(mapping="symmetric", group_size=32)}) == 1


def test_scheme_converts_strings_and_rejects_bad_group() -> None:
    assert Int4Scheme(mapping="asymmetric").mapping is Int4Mapping.ASYMMETRIC
    with pytest.raises(ConfigError, match=r"group_size must be one of .* got 48"):
        Int4Scheme(group_size=48)
    with pytest.raises(
        ConfigError, match="mapping must be one of `symmetric`, `asymmetric`, got 'sym'"
    ):
        Int4Scheme(mapping="sym")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 32.0}, "group_size must be an int, got float 32.0"),
        ({"group_size": True}, "group_size must be an int, got bool True"),
        ({"mapping": 1}, "mapping must be an Int4Mapping or one of .* got int 1"),
    ],
)
def test_scheme_wrong_types_are_config_type_errors(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigTypeError, match=message) as info:
        Int4Scheme(**kwargs)
    assert isinstance(info.value, TypeError)


def test_scheme_is_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        INT4_SYM_G32.group_size = 64  # type: ignore[misc]  # the point is that it raises


def test_num_groups() -> None:
    assert INT4_SYM_G32.num_groups(128) == 4
    assert INT4_SYM.num_groups(96) == 1
    with pytest.raises(
        ShapeError, match="hidden_size=96 must be divisible by group_size=128"
    ):
        INT4_SYM_G128.num_groups(96, name="hidden_size")
    with pytest.raises(ShapeError, match="positive even number, got 33"):
        INT4_SYM.num_groups(33)


def test_layout() -> None:
    assert CANONICAL_LAYOUT.packing is PackingFormat.UINT8_LOW_FIRST
    assert CANONICAL_LAYOUT.w13_gate_up_halves


def _cfg(**kw: Any) -> MoEConfig:
    base = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64)
    return attrs.evolve(base, **kw)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 9}, "top_k must be <= num_experts=8, got 9"),
        ({"activation": "relu"}, "activation must be one of .* got 'relu'"),
        ({"scoring_func": "tanh"}, "scoring_func must be one of"),
        ({"apply_router_weight_on_input": True}, "needs top_k=1, got top_k=2"),
        ({"num_expert_group": 4}, "must be given together"),
        ({"num_expert_group": 3, "topk_group": 1}, "must divide num_experts=8, got 3"),
        (
            {"num_expert_group": 4, "topk_group": 5},
            "topk_group must be <= num_expert_group=4",
        ),
        ({"num_expert_group": 4, "topk_group": 1, "top_k": 3}, "top_k=3 must be <="),
        (
            {"routed_scaling_factor": 0.0},
            "routed_scaling_factor must be a finite positive number",
        ),
    ],
)
def test_config_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _cfg(**kwargs)


def test_config_is_hashable_and_grouping_flag() -> None:
    assert hash(_cfg()) == hash(_cfg())
    assert _cfg(num_expert_group=4, topk_group=2).uses_grouped_topk
    assert not _cfg().uses_grouped_topk


def test_grouping_at_its_bounds_is_accepted() -> None:
    """Every group kept, and top_k filling the kept groups exactly, are valid."""
    every_group = MoEConfig(
        num_experts=8, top_k=2, hidden_size=64, intermediate_size=64,
        num_expert_group=4, topk_group=4,
    )  # fmt: skip
    assert every_group.uses_grouped_topk
    full = MoEConfig(
        num_experts=8, top_k=4, hidden_size=64, intermediate_size=64,
        num_expert_group=4, topk_group=2,
    )  # 4 = 2 kept groups of 2 experts  # fmt: skip
    assert full.uses_grouped_topk


def test_unsupported_group_size_16_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"group_size must be one of .* got 16"):
        Int4Scheme(group_size=16)
