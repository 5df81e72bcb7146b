"""MoEConfig field validation: every bad value is an Int4MoEError naming the field."""

from typing import Any

import pytest
import torch

from core.config import MoEConfig
from core.errors import ConfigError, ConfigTypeError, Int4MoEError

SIZES: dict[str, Any] = {
    "num_experts": 8,
    "top_k": 2,
    "hidden_size": 64,
    "intermediate_size": 64,
}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("top_k", 2.0, "top_k must be an int, got float 2.0"),
        ("num_experts", True, "num_experts must be an int, got bool True"),
        ("hidden_size", "64", "hidden_size must be an int, got str '64'"),
        ("num_expert_group", 4.0, "num_expert_group must be an int, got float 4.0"),
        ("renormalize", 1, "renormalize must be a bool, got int 1"),
        ("expert_bias", None, "expert_bias must be a bool, got NoneType None"),
        (
            "routed_scaling_factor",
            "2",
            "routed_scaling_factor must be a number, got str '2'",
        ),
        ("swiglu_alpha", False, "swiglu_alpha must be a number, got bool False"),
    ],
)
def test_wrong_types_are_config_type_errors(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigTypeError, match=message) as info:
        MoEConfig(**{**SIZES, field: value})
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_experts", 0, "num_experts must be >= 1, got 0"),
        ("intermediate_size", -64, "intermediate_size must be >= 1, got -64"),
        ("topk_group", 0, "topk_group must be >= 1, got 0"),
        (
            "group_score",
            "max",
            "group_score ranks expert groups and needs num_expert_group and "
            "topk_group, got group_score='max' without them",
        ),
        (
            "routed_scaling_factor",
            float("inf"),
            "routed_scaling_factor must be a finite positive number, got inf",
        ),
        (
            "swiglu_limit",
            float("nan"),
            "swiglu_limit must be a finite positive number, got nan",
        ),
    ],
)
def test_bad_values_are_config_errors(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        MoEConfig(**{**SIZES, field: value})
    assert not isinstance(info.value, TypeError)


def test_config_type_error_is_both_builtins() -> None:
    assert issubclass(ConfigTypeError, Int4MoEError)
    assert issubclass(ConfigTypeError, ValueError)
    assert issubclass(ConfigTypeError, TypeError)


def test_ints_for_float_fields_are_accepted() -> None:
    config = MoEConfig(**SIZES, routed_scaling_factor=2, swiglu_limit=7)
    assert config.routed_scaling_factor == 2


INT_FIELDS = (
    "num_experts",
    "top_k",
    "hidden_size",
    "intermediate_size",
    "num_expert_group",
    "topk_group",
)


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("kind", ["int64", "int32", "uint8"])
def test_numpy_ints_are_accepted_and_stored_as_int(field: str, kind: str) -> None:
    """Like ``num_local_experts``: any non-bool ``numbers.Integral`` (was refused)."""
    np = pytest.importorskip("numpy")
    sizes = {**SIZES, "num_expert_group": 2, "topk_group": 1}
    config = MoEConfig(**{**sizes, field: np.dtype(kind).type(sizes[field])})
    value = getattr(config, field)
    assert type(value) is int
    assert value == sizes[field]
    assert config == MoEConfig(**sizes)
    assert hash(config) == hash(MoEConfig(**sizes))


@pytest.mark.parametrize("field", INT_FIELDS)
def test_numpy_bools_and_floats_are_still_refused(field: str) -> None:
    np = pytest.importorskip("numpy")
    sizes = {**SIZES, "num_expert_group": 2, "topk_group": 1}
    with pytest.raises(ConfigTypeError, match=rf"{field} must be an int, got bool"):
        MoEConfig(**{**sizes, field: np.True_})
    with pytest.raises(
        ConfigTypeError,
        match=rf"{field} must be an int, got float64 np\.float64\(2\.0\)",
    ):
        MoEConfig(**{**sizes, field: np.float64(2.0)})
    with pytest.raises(
        ConfigTypeError, match=rf"{field} must be an int, got bool True"
    ):
        MoEConfig(**{**sizes, field: True})


@pytest.mark.parametrize("field", INT_FIELDS)
def test_zero_dim_integer_tensors_are_accepted_as_the_annotation_says(
    field: str,
) -> None:
    """The sizes are typed ``SupportsIndex``: what has ``__index__`` is an int."""
    sizes = {**SIZES, "num_expert_group": 2, "topk_group": 1}
    config = MoEConfig(**{**sizes, field: torch.tensor(sizes[field])})
    assert type(getattr(config, field)) is int
    assert config == MoEConfig(**sizes)
    for bad, shown in (
        (torch.tensor(True), "Tensor"),
        (torch.tensor(2.0), "Tensor"),
        (torch.tensor([1, 2]), "Tensor"),
    ):
        with pytest.raises(
            ConfigTypeError, match=rf"{field} must be an int, got {shown}"
        ):
            MoEConfig(**{**sizes, field: bad})


def test_numpy_ints_are_range_checked() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(ConfigError, match=r"num_experts must be >= 1, got 0$"):
        MoEConfig(**{**SIZES, "num_experts": np.int64(0)})
    with pytest.raises(ConfigError, match=r"top_k must be <= num_experts=8, got 9$"):
        MoEConfig(**{**SIZES, "top_k": np.int64(9)})
