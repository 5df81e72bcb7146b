"""modules/hf_checks.py: what replace_moe_blocks refuses before it swaps a block in.

A block that does more around its experts than ``Int4SparseMoeBlock`` (a shared expert
under another name, a factor of its own), and experts that compute another
activation, are refused with every block left as it was.
"""

import re
from typing import Any

import pytest
import torch
from torch import nn
from transformers import HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM

from core.errors import ConfigError
from modules.hf import find_moe_blocks, replace_moe_blocks
from tests.modules.hf_models import COMMON, HEAD_DIM, _assert_left_alone, _build


def test_a_shared_expert_under_another_name_is_refused() -> None:
    """HunYuan-MoE keeps its shared expert as ``shared_mlp``: replaced, it would be
    dropped (block output off by about 0.8). The check against the original block on
    the same int4 experts refuses it before any block is replaced."""
    model = HunYuanMoEV1ForCausalLM(
        HunYuanMoEV1Config(
            **COMMON, **HEAD_DIM, intermediate_size=64, num_experts=8, moe_topk=2
        )
    )
    assert "shared_mlp" in dict(model.model.layers[0].mlp.named_children())
    with pytest.raises(
        ConfigError,
        match=r"MoE block 'model\.layers\.0\.mlp' must compute what Int4SparseMoeBlock "
        r"computes .* differing by [0-9.]+ .*its children: \['experts', 'gate', "
        r"'shared_mlp'\]",
    ):
        replace_moe_blocks(model, backend="reference")
    _assert_left_alone(model)


class _SoftcappedSilu(nn.Module):
    """silu of the gate softcapped at ``cap`` (as some families' experts do)."""

    def __init__(self, cap: float) -> None:
        super().__init__()
        self.cap = cap

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.cap * torch.tanh(g / self.cap))


@pytest.mark.parametrize(
    ("act", "scale"), [(nn.GELU(), "1"), (_SoftcappedSilu(1.0), "(1|30)")]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_experts_computing_another_activation_are_refused(
    act: nn.Module, scale: str, dtype: torch.dtype
) -> None:
    """The block's own experts module computes something else than the config's
    ``act(gate) * up`` (another activation, a softcap): the check on the same int4
    experts cannot see it; running the block's own experts on the dequantized int4
    weights does. Only the last block's experts differ: no block is replaced, and the
    first block's experts keep their float weights (restored after the check)."""
    model = _build("qwen3_moe")
    nn.Module.to(model, dtype)
    names = list(find_moe_blocks(model))
    first = model.get_submodule(f"{names[0]}.experts")
    before = [p.clone() for p in first.parameters()]
    model.get_submodule(f"{names[-1]}.experts").act_fn = act
    with pytest.raises(
        ConfigError,
        match=rf"block '{re.escape(names[-1])}' must have experts that compute what "
        rf"Int4MoE's do \(down\(act\(gate\) \* up\), activation 'silu'\), got "
        rf"Qwen3MoeExperts differing by [0-9.e-]+ .* inputs of scale {scale}:",
    ):
        replace_moe_blocks(model, backend="reference")
    _assert_left_alone(model)
    for p, q in zip(first.parameters(), before, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_block_scaling_its_output_is_refused(generator: torch.Generator) -> None:
    """A factor applied in the block's own forward (not by its router) would be lost.
    Only the last block does it here: the first is not replaced either."""
    model = _build("qwen3_moe")
    last = model.get_submodule(list(find_moe_blocks(model))[-1])
    plain = type(last).forward

    def scaled(self: nn.Module, h: torch.Tensor) -> Any:
        return 2.5 * plain(self, h)

    last.forward = scaled.__get__(last)  # this block only
    with pytest.raises(
        ConfigError, match=r"block 'model\.layers\.1\.mlp' .* differing by 0\.6"
    ):
        replace_moe_blocks(model, backend="reference")
    _assert_left_alone(model)
