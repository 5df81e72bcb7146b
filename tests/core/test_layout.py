"""WeightLayout: the canonical layout, named packings, and errors that name the field."""

import pytest

from core.errors import ConfigError, ConfigTypeError
from core.layout import CANONICAL_LAYOUT, PackingFormat, WeightLayout


def test_canonical_layout_and_packing_by_name() -> None:
    assert WeightLayout() == CANONICAL_LAYOUT
    assert WeightLayout(packing="uint8_low_first") == CANONICAL_LAYOUT
    assert CANONICAL_LAYOUT.packing is PackingFormat.UINT8_LOW_FIRST
    assert WeightLayout(w13_gate_up_halves=False) != CANONICAL_LAYOUT


def test_bad_fields_raise_library_errors_naming_them() -> None:
    with pytest.raises(
        ConfigError, match=r"packing must be one of `uint8_low_first`, got 'int32'"
    ):
        WeightLayout(packing="int32")
    with pytest.raises(
        ConfigTypeError, match=r"w13_gate_up_halves must be a bool, got int 1"
    ):
        WeightLayout(w13_gate_up_halves=1)  # type: ignore[arg-type]  # the wrong type is the test
