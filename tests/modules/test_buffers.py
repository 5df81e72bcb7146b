"""Int4MoE's expert map: its default and the checks on a given or loaded one."""

import pytest
import torch

from core.config import MoEConfig
from core.errors import ConfigError, DTypeError, ShapeError
from core.quantize import quantize_expert_weights
from core.scheme import INT4_SYM_G32
from modules import Int4MoE
from modules.buffers import check_expert_map

CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)


def test_default_expert_map_names_only_held_experts() -> None:
    moe = Int4MoE(CFG, num_local_experts=3)
    assert moe.get_buffer("expert_map").tolist() == [0, 1, 2, -1, -1, -1, -1, -1]


def test_load_refuses_an_expert_map_beyond_the_local_experts(
    generator: torch.Generator,
) -> None:
    w13 = torch.randn(4, 128, 128, generator=generator)
    w2 = torch.randn(4, 128, 64, generator=generator)
    local = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    emap = torch.tensor([-1] * 4 + [0, 1, 2, 3], dtype=torch.int32)
    shard = Int4MoE.from_quantized(local, config=CFG, expert_map=emap)
    state = shard.state_dict()
    fresh = Int4MoE(CFG, num_local_experts=4)
    fresh.load_state_dict(state)
    assert fresh.get_buffer("expert_map").tolist() == emap.tolist()
    state["expert_map"] = torch.arange(8, dtype=torch.int32)
    with pytest.raises(
        ShapeError,
        match=r"expert_map values must be -1 or local ids in \[0, 4\), got values in \[0, 7\]",
    ):
        fresh.load_state_dict(state)
    assert (
        fresh.get_buffer("expert_map").tolist() == emap.tolist()
    )  # refused before any copy


def test_check_expert_map_names_what_is_wrong() -> None:
    with pytest.raises(
        ShapeError, match=r"expert_map must have shape \(8,\), got \(4,\)"
    ):
        check_expert_map(
            torch.zeros(4, dtype=torch.int32), num_experts=8, num_local_experts=4
        )
    with pytest.raises(
        DTypeError, match=r"expert_map must be int32 or int64, got dtype torch\.float32"
    ):
        check_expert_map(torch.zeros(8), num_experts=8, num_local_experts=4)
    with pytest.raises(
        ShapeError, match=r"local ids in \[0, 4\), got values in \[-2, 0\]"
    ):
        check_expert_map(
            torch.tensor([-2, 0, 0, 0, 0, 0, 0, 0]), num_experts=8, num_local_experts=4
        )
    with pytest.raises(
        ShapeError,
        match=r"each local id to at most one global expert, got local id 2 for "
        r"global experts \[1, 6\]",
    ):
        check_expert_map(
            torch.tensor([-1, 2, 0, -1, 1, -1, 2, 3]),
            num_experts=8,
            num_local_experts=4,
        )
    check_expert_map(  # a held expert no global id reaches is only wasted memory
        torch.tensor([-1, -1, 0, -1, 1, -1, 2, -1]), num_experts=8, num_local_experts=4
    )
    check_expert_map(  # meta tensors have no values to check
        torch.empty(8, dtype=torch.int64, device="meta"),
        num_experts=8,
        num_local_experts=4,
    )


def test_expert_map_naming_one_past_the_last_local_expert_is_refused() -> None:
    """Local ids are ``[0, L)``: the id ``L`` itself would read past the weights."""
    with pytest.raises(
        ShapeError, match=r"local ids in \[0, 4\), got values in \[-1, 4\]"
    ):
        check_expert_map(
            torch.tensor([0, 1, 2, 4, -1, -1, -1, -1]),
            num_experts=8,
            num_local_experts=4,
        )
    check_expert_map(  # 3 is the last one held
        torch.tensor([0, 1, 2, 3, -1, -1, -1, -1]), num_experts=8, num_local_experts=4
    )


def test_zero_local_experts_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"num_local_experts must be in \[1, num_experts=8\], got 0"
    ):
        Int4MoE(CFG, num_local_experts=0, device="meta")


def test_an_int64_expert_map_is_held_as_int32(generator: torch.Generator) -> None:
    """The map buffer is int32 (what the kernels index with), whatever came in."""
    w13 = torch.randn(4, 128, 128, generator=generator)
    w2 = torch.randn(4, 128, 64, generator=generator)
    local = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    emap = torch.tensor([-1] * 4 + [0, 1, 2, 3], dtype=torch.int64)
    shard = Int4MoE.from_quantized(local, config=CFG, expert_map=emap)
    held = shard.get_buffer("expert_map")
    assert held.dtype == torch.int32
    assert held.tolist() == emap.tolist()
