"""modules/hf_block.py: Int4SparseMoeBlock returns and records what the block did.

Output structure, router logits recorded, Mixtral's router jitter in training mode, and
an unknown routing mode refused.
"""

import copy

import pytest
import torch
from torch import nn

from core.errors import ConfigError
from modules.hf import find_moe_blocks, replace_moe_blocks
from modules.hf_block import Int4SparseMoeBlock
from tests.modules.hf_models import MODELS, _build, _load_dequantized
from tests.tolerances import EXACT, KERNEL_VS_ORACLE


@pytest.mark.parametrize("name", list(MODELS))
def test_block_returns_what_the_original_returned(
    name: str, generator: torch.Generator
) -> None:
    original = _build(name)
    replaced = copy.deepcopy(original)
    block_name = replace_moe_blocks(replaced, backend="reference")[-1]
    x = torch.randn(2, 5, 64, generator=generator)
    with torch.no_grad():
        before = original.get_submodule(block_name)(x)
        after = replaced.get_submodule(block_name)(x)
    assert type(after) is type(before)
    if isinstance(before, tuple):  # gpt-oss: (hidden, router_scores)
        assert after[0].shape == before[0].shape
        torch.testing.assert_close(after[1], before[1], **EXACT)
    else:
        assert after.shape == before.shape


def test_router_logits_are_still_recorded(generator: torch.Generator) -> None:
    original = _build("qwen2_moe")
    replaced = copy.deepcopy(original)
    replace_moe_blocks(replaced, backend="reference")
    ids = torch.randint(0, 64, (1, 6), generator=generator)
    with torch.no_grad():
        ref = original(ids, output_router_logits=True).router_logits
        got = replaced(ids, output_router_logits=True).router_logits
    assert len(got) == len(ref) == 2
    torch.testing.assert_close(got[0], ref[0], **EXACT)


def test_mixtral_router_jitter_runs_in_training_as_in_the_original() -> None:
    """Mixtral's block scales its hidden states by uniform noise in training mode
    (``router_jitter_noise``): the replacement draws the same noise the same way."""
    model = _build("mixtral")
    names = list(find_moe_blocks(model))
    for name in names:
        setattr(model.get_submodule(name), "jitter_noise", 0.1)  # noqa: B010  # typed Module
    original = copy.deepcopy(model)
    replace_moe_blocks(model, backend="reference")
    _load_dequantized(original, model, names, gpt_oss=False)
    new, old = model.get_submodule(names[0]), original.get_submodule(names[0])
    assert isinstance(new, Int4SparseMoeBlock)
    assert new.jitter_noise == 0.1
    x = torch.randn(1, 5, model.config.hidden_size)

    def run(block: nn.Module, seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            out = block(x.clone())  # the original scales its input in place
        assert isinstance(out, torch.Tensor)
        return out

    old.train()
    new.train()
    want = run(old, 3)
    torch.testing.assert_close(run(new, 3), want, **KERNEL_VS_ORACLE[torch.float32])
    assert not torch.equal(run(new, 4), want)  # other noise: the jitter ran
    old.eval()
    new.eval()
    torch.testing.assert_close(
        run(new, 4), run(old, 5), **KERNEL_VS_ORACLE[torch.float32]
    )


def test_an_unknown_routing_mode_is_refused() -> None:
    """Not silently read as ``config``: refused, and no block is replaced."""
    model = _build("qwen3_moe")
    with pytest.raises(
        ConfigError, match=r"routing must be `model` or `config`, got 'gate'"
    ):
        replace_moe_blocks(model, backend="reference", routing="gate")  # type: ignore[arg-type]
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules())
