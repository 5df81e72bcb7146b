"""modules/hf_experts.py: a block's int4 experts, from float weights or a checkpoint.

gpt-oss biases carried, int4 checkpoints read under each block's names (Mixtral's old
one too), read back bit for bit, and refused with every block left as it was.
"""

import copy
from pathlib import Path

import attrs
import pytest
import torch
from torch import nn

from core.config import MoEConfig
from core.errors import ConfigError, DeviceError
from core.formats import export_expert_weights
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, Int4Scheme
from modules import Int4MoE
from modules.hf import replace_moe_blocks
from modules.hf_block import Int4SparseMoeBlock
from modules.hf_experts import _same_groups
from tests.modules.hf_models import MODELS, _assert_left_alone, _build, _logits, _tensor
from tests.tolerances import EXACT


def test_gpt_oss_biases_are_carried() -> None:
    model = _build("gpt_oss")
    experts = model.get_submodule("model.layers.0.mlp.experts")
    gate_up_bias = _tensor(experts, "gate_up_proj_bias").detach().clone()
    down_bias = _tensor(experts, "down_proj_bias").detach().clone()
    assert bool(down_bias.ne(0).any())
    replace_moe_blocks(model, backend="reference")
    int4 = model.get_submodule("model.layers.0.mlp.experts")
    assert isinstance(int4, Int4MoE)
    assert int4.config.expert_bias
    f = gate_up_bias.shape[-1] // 2
    w13_bias, w2_bias = int4.weights.w13_bias, int4.weights.w2_bias
    assert w13_bias is not None
    torch.testing.assert_close(w13_bias[:, :f], gate_up_bias[:, 0::2], **EXACT)
    torch.testing.assert_close(w13_bias[:, f:], gate_up_bias[:, 1::2], **EXACT)
    torch.testing.assert_close(w2_bias, down_bias, **EXACT)


def _as_mixtral_checkpoint_name(name: str) -> str:
    """Mixtral's int4 checkpoints keep ``block_sparse_moe`` and ``w1 / w3 / w2``."""
    name = name.replace(".mlp.", ".block_sparse_moe.")
    for hf, mixtral in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        name = name.replace(f".{hf}.", f".{mixtral}.")
    return name


def _quantized_and_exported(
    original: nn.Module,
) -> tuple[nn.Module, list[str], dict[str, torch.Tensor]]:
    """A copy of ``original`` replaced in int4 asym g32, its block names, and its
    experts exported under each block's name (the state of an int4 checkpoint)."""
    quantized = copy.deepcopy(original)
    names = replace_moe_blocks(quantized, scheme=INT4_ASYM_G32, backend="reference")
    state: dict[str, torch.Tensor] = {}
    for block in names:
        int4 = quantized.get_submodule(f"{block}.experts")
        assert isinstance(int4, Int4MoE)
        state |= export_expert_weights(int4.weights, prefix=f"{block}.experts")
    return quantized, names, state


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_blocks_from_an_int4_checkpoint(name: str, generator: torch.Generator) -> None:
    original = _build(name)
    quantized, _, state = _quantized_and_exported(original)
    if name == "mixtral":
        state = {_as_mixtral_checkpoint_name(k): v for k, v in state.items()}
        assert "model.layers.0.block_sparse_moe.experts.3.w2.weight_packed" in state
    loaded = copy.deepcopy(original)
    replace_moe_blocks(loaded, backend="reference", checkpoint=state)
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    torch.testing.assert_close(_logits(loaded, ids), _logits(quantized, ids), **EXACT)


def test_a_checkpoint_of_another_scheme_than_asked_replaces_none() -> None:
    """``scheme`` with ``checkpoint`` is the scheme its experts must have: asked for
    sym g32 of an asym g32 checkpoint, every block is left as it was (it was ignored
    before); asked for the checkpoint's own, or not at all, it loads."""
    original = _build("qwen3_moe")
    _, names, state = _quantized_and_exported(original)
    model = copy.deepcopy(original)
    with pytest.raises(
        ConfigError,
        match=r"experts of MoE block 'model.layers.0.mlp' must be of scheme="
        r"int4_sym_g32 as asked, got int4_asym_g32",
    ):
        replace_moe_blocks(model, scheme=INT4_SYM_G32, checkpoint=state)
    _assert_left_alone(model)
    replace_moe_blocks(
        model, scheme=INT4_ASYM_G32, backend="reference", checkpoint=state
    )
    int4 = model.get_submodule(f"{names[0]}.experts")
    assert isinstance(int4, Int4MoE)
    assert int4.scheme == INT4_ASYM_G32


def test_a_whole_row_group_is_the_same_scheme_as_g_minus_1() -> None:
    """Asked ``g-1``, a checkpoint loaded as ``g64`` of a layer whose two reductions
    are both 64 wide has the same groups; with a 32-wide w2 reduction it has not."""
    asked = Int4Scheme(mapping="asymmetric", group_size=-1)
    held = Int4Scheme(mapping="asymmetric", group_size=64)
    square = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=64)
    narrow = attrs.evolve(square, intermediate_size=32)
    assert _same_groups(asked, held, square)
    assert not _same_groups(asked, held, narrow)
    assert not _same_groups(asked, held, attrs.evolve(square, hidden_size=32))
    assert not _same_groups(INT4_SYM_G32, INT4_ASYM_G32, square)  # the mapping too


def test_checkpoint_without_the_block_names_each_prefix_tried() -> None:
    with pytest.raises(
        ConfigError,
        match=r"block 'model.layers.0.mlp', got for each prefix: 'model.layers.0.mlp': "
        r"cannot tell the format: .* got suffixes \['x'\]; "
        r"'model.layers.0.block_sparse_moe': prefix 'model.layers.0.block_sparse_moe': "
        r"no tensors under 'model.layers.0.block_sparse_moe.experts.' in the checkpoint",
    ):  # names under each block's prefix, but not tensors loading can read
        replace_moe_blocks(
            _build("mixtral"),
            checkpoint={
                f"model.layers.{i}.mlp.experts.x": torch.zeros(1) for i in (0, 1)
            },
        )


def test_a_checkpoint_missing_a_later_block_replaces_none() -> None:
    """Every block's names are looked for before any block is replaced: a checkpoint
    holding only the first layer's experts leaves the model as it was."""
    original = _build("qwen3_moe")
    quantized = copy.deepcopy(original)
    names = replace_moe_blocks(quantized, backend="reference")
    int4 = quantized.get_submodule(f"{names[0]}.experts")
    assert isinstance(int4, Int4MoE)
    first = export_expert_weights(int4.weights, prefix=f"{names[0]}.experts")
    model = copy.deepcopy(original)
    with pytest.raises(
        ConfigError,
        match=r"checkpoint must hold the experts of block 'model.layers.1.mlp' \(under "
        r"'model.layers.1.mlp.experts.' or 'model.layers.1.block_sparse_moe.experts.'\), "
        r"got none; no block was replaced",
    ):
        replace_moe_blocks(model, backend="reference", checkpoint=first)
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules()), (
        "a block was replaced"
    )


def test_deepseek_correction_bias_is_not_shared_with_the_router() -> None:
    model = _build("deepseek_v3")
    replace_moe_blocks(model, backend="reference")
    router = _tensor(
        model.get_submodule("model.layers.1.mlp.gate"), "e_score_correction_bias"
    )
    int4 = model.get_submodule("model.layers.1.mlp.experts")
    assert isinstance(int4, Int4MoE)
    bias = int4.get_buffer("e_score_correction_bias")
    torch.testing.assert_close(bias, router.float(), **EXACT)
    # shared storage makes safetensors (and save_pretrained) refuse the state dict
    pointers = [t.untyped_storage().data_ptr() for t in model.state_dict().values()]
    assert len(set(pointers)) == len(pointers)


def test_a_checkpoint_into_a_model_on_meta_is_a_device_error() -> None:
    """Int4 experts are loaded where the block's float experts are: not on meta."""
    source = _build("qwen3_moe")
    names = replace_moe_blocks(source, backend="reference")
    state: dict[str, torch.Tensor] = {}
    for name in names:
        int4 = source.get_submodule(f"{name}.experts")
        assert isinstance(int4, Int4MoE)
        state |= export_expert_weights(int4.weights, prefix=f"{name}.experts")
    with torch.device("meta"):
        model = MODELS["qwen3_moe"]()
    with pytest.raises(
        DeviceError,
        match=r"block 'model\.layers\.0\.mlp' must hold its float experts on a real "
        r"device .* got them on the meta device",
    ):
        replace_moe_blocks(model, checkpoint=state)
    _assert_left_alone(model)


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_a_replaced_model_saved_by_transformers_loads_back(
    name: str, generator: torch.Generator, tmp_path: Path
) -> None:
    """``save_pretrained`` of a replaced model writes int4-moe's own tensors (Mixtral's
    under ``block_sparse_moe``: transformers renames the block on saving); they are
    read back as they are, bit for bit."""
    original = _build(name)
    quantized = copy.deepcopy(original)
    replace_moe_blocks(quantized, scheme=INT4_ASYM_G32, backend="reference")
    quantized.save_pretrained(tmp_path)
    loaded = copy.deepcopy(original)
    names = replace_moe_blocks(loaded, backend="reference", checkpoint=tmp_path)
    for block in names:
        want = quantized.get_submodule(f"{block}.experts")
        got = loaded.get_submodule(f"{block}.experts")
        assert isinstance(want, Int4MoE)
        assert isinstance(got, Int4MoE)
        assert got.scheme == INT4_ASYM_G32
        for key, tensor in want.state_dict().items():
            torch.testing.assert_close(got.state_dict()[key], tensor, **EXACT)
    ids = torch.randint(0, 64, (2, 7), generator=generator)
    torch.testing.assert_close(_logits(loaded, ids), _logits(quantized, ids), **EXACT)


def test_gpt_oss_from_an_int4_checkpoint_is_refused() -> None:
    """Its expert biases are not read from checkpoints: refused, not run without them
    (the replacement check cannot see it: both sides run the same int4 experts). The
    checkpoint holds the experts without biases, as export_expert_weights writes them."""
    quantized = _build("gpt_oss")
    names = replace_moe_blocks(quantized, backend="reference")
    state: dict[str, torch.Tensor] = {}
    for block in names:
        int4 = quantized.get_submodule(f"{block}.experts")
        assert isinstance(int4, Int4MoE)
        unbiased = attrs.evolve(int4.weights, w13_bias=None, w2_bias=None)
        state |= export_expert_weights(unbiased, prefix=f"{block}.experts")
    model = _build("gpt_oss")
    with pytest.raises(
        ConfigError,
        match="loading gpt-oss int4 experts from a checkpoint is not supported",
    ):
        replace_moe_blocks(model, backend="reference", checkpoint=state)
    assert not any(isinstance(m, Int4SparseMoeBlock) for m in model.modules())
