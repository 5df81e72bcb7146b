"""Group sizes from declared values, stored scale groups and ``g_idx``."""

import pytest
import torch

from core.errors import ConfigError, DTypeError, ShapeError
from core.formats.projection import group_size_of, resolve_groups


@pytest.mark.parametrize(
    ("k", "groups", "expected"),
    [(256, 2, 128), (192, 3, 64), (64, 2, 32), (96, 1, 96), (36, 1, 36)],
)
def test_supported_or_whole_row_groups_are_inferred(
    k: int, groups: int, expected: int
) -> None:
    assert group_size_of("scales", k, groups) == expected


def test_inferred_group_that_is_not_supported_is_refused() -> None:
    # K=96 quantized with group 64 stores ceil(96/64) = 2 groups; reading them as two
    # groups of 48 would be silently wrong.
    with pytest.raises(
        ConfigError, match=r"implying group_size=48.*declare group_size"
    ):
        group_size_of("scales", 96, 2)
    with pytest.raises(ShapeError, match="do not divide the input dim 96"):
        group_size_of("scales", 96, 5)


def test_declared_group_of_at_least_k_is_one_group_per_row() -> None:
    assert group_size_of("scales", 64, 1, declared=128) == 64
    assert group_size_of("scales", 64, 1, declared=64) == 64
    assert group_size_of("scales", 64, 1, declared=-1) == 64
    with pytest.raises(ConfigError, match="needs 1 groups for input dim 64"):
        group_size_of("scales", 64, 2, declared=128)


def test_declared_group_must_divide_k_and_match_the_groups() -> None:
    with pytest.raises(
        ShapeError, match="group_size=64 does not divide the input dim 96"
    ):
        group_size_of("scales", 96, 2, declared=64)
    with pytest.raises(
        ConfigError, match=r"scales have 2 \(they imply group_size=32\)"
    ):
        group_size_of("scales", 64, 2, declared=16)
    with pytest.raises(ConfigError, match="must be positive or `-1`"):
        group_size_of("scales", 64, 2, declared=0)


def test_g_idx_gives_the_group_where_it_first_changes() -> None:
    g_idx = torch.tensor([1] * 32 + [0] * 32, dtype=torch.int32)
    group, rows = resolve_groups("scales", 64, 2, g_idx=g_idx)
    assert group == 32
    assert rows is not None
    assert rows.tolist() == [1, 0]


def test_g_idx_with_a_partial_last_group_is_not_called_act_order() -> None:
    g_idx = torch.arange(96, dtype=torch.int32) // 64
    with pytest.raises(
        ShapeError, match="group size 64 does not divide the input dim 96"
    ):
        resolve_groups("scales", 96, 2, g_idx=g_idx)
    with pytest.raises(ShapeError, match="group_size=64 does not divide"):
        resolve_groups("scales", 96, 2, declared=64, g_idx=g_idx)


def test_g_idx_must_be_integer_and_one_entry_per_column() -> None:
    with pytest.raises(ShapeError, match=r"g_idx must have shape \(K,\) = \(256,\)"):
        resolve_groups("scales", 256, 2, g_idx=torch.zeros(128, dtype=torch.int32))
    with pytest.raises(ShapeError, match=r"g_idx must have shape \(K,\)"):
        resolve_groups("scales", 64, 2, g_idx=torch.zeros(2, 32, dtype=torch.int32))
    with pytest.raises(DTypeError, match="g_idx must be an integer tensor"):
        resolve_groups("scales", 64, 2, g_idx=torch.zeros(64))


def test_g_idx_out_of_range_and_scattered_are_refused(
    generator: torch.Generator,
) -> None:
    with pytest.raises(ShapeError, match=r"scale rows in \[0, 2\), got values 0\.\.2"):
        resolve_groups("scales", 96, 2, g_idx=torch.arange(96) // 32)
    scattered = torch.randperm(64, generator=generator) // 32
    with pytest.raises(ConfigError, match="act-order"):
        resolve_groups("scales", 64, 2, g_idx=scattered)
    one_row = torch.zeros(64, dtype=torch.int32)  # one block, but two stored rows
    with pytest.raises(ConfigError, match=r"1 blocks of 64 columns.*2 groups"):
        resolve_groups("scales", 64, 2, g_idx=one_row)
