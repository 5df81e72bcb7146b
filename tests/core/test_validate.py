"""Predicates and checks of core.validate not covered through their callers."""

import pytest

from core.validate import is_supported_group_size


@pytest.mark.parametrize(
    ("group_size", "supported"),
    [(32, True), (-1, True), (48, False), (32.0, False), (True, False)],
    ids=str,
)
def test_is_supported_group_size(group_size: int, supported: bool) -> None:
    assert is_supported_group_size(group_size) is supported
