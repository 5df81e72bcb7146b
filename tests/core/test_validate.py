"""Predicates and checks of core.validate not covered through their callers."""

import pytest
import torch

from core.validate import is_supported_group_size


@pytest.mark.parametrize(
    ("group_size", "supported"),
    [(32, True), (-1, True), (48, False), (32.0, False), (True, False)],
    ids=str,
)
def test_is_supported_group_size(group_size: int, supported: bool) -> None:
    assert is_supported_group_size(group_size) is supported


def test_check_cast_fits() -> None:
    """Overflow to inf and nonzero values rounding to 0 are refused, by count."""
    from core.errors import ShapeError
    from core.validate import check_cast_fits

    scales = torch.tensor([1e-3, 2.0, 0.0], dtype=torch.bfloat16)
    check_cast_fits("s", scales, torch.float16)  # fits (0 stays 0)
    check_cast_fits("s", scales.to("meta"), torch.float16)  # no values to check
    with pytest.raises(
        ShapeError, match=r"s must fit torch.float16, got 1 values overflowing it"
    ):
        check_cast_fits(
            "s", torch.tensor([1e5, 1.0], dtype=torch.bfloat16), torch.float16
        )
    with pytest.raises(
        ShapeError,
        match=r"s must fit torch.float16, got 2 nonzero values rounding to 0 "
        r"\(smallest magnitude 1e-10\)",
    ):
        check_cast_fits("s", torch.tensor([1e-9, 1e-10, 1.0]), torch.float16)
    check_cast_fits(
        "s", torch.tensor([float("inf")]), torch.float16
    )  # not made inf here
