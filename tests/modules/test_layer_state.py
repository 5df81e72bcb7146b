"""Int4MoE's state (modules/layer_state.py): round trips, loads, to_empty, maps, checks."""

import io
import pickle
from typing import Any

import attrs
import pytest
import torch
from torch import nn

from core.errors import (
    DTypeError,
    NotLoadedError,
    ShapeError,
)
from core.quantize import quantize_expert_weights
from core.scheme import (
    INT4_ASYM_G32,
    INT4_SYM_G32,
    Int4Scheme,
)
from modules import Int4MoE, layer_state
from tests.modules.int4_moe_cases import (
    CFG,
    _float_weights,
    _module,
    _routed_layer,
    _shard_after_one_call,
)
from tests.tolerances import (
    EXACT,
)


def test_state_dict_round_trip_bit_exact(generator: torch.Generator) -> None:
    moe = _module(
        generator, INT4_ASYM_G32, gate_weight=torch.randn(8, 128, generator=generator)
    )
    x = torch.randn(6, 128, generator=generator, dtype=torch.bfloat16)
    before = moe(x)
    buffer = io.BytesIO()
    torch.save(moe.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert set(state) == {
        "gate_weight",
        "w13_qdata",
        "w13_scale",
        "w13_zero_point",
        "w2_qdata",
        "w2_scale",
        "w2_zero_point",
    }
    fresh = Int4MoE(CFG, scheme=INT4_ASYM_G32, with_gate=True)
    fresh.load_state_dict(state)
    for name, tensor in moe.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[name], tensor, **EXACT)
    torch.testing.assert_close(fresh(x), before, **EXACT)


def test_holds_only_int4_bytes_and_scales(generator: torch.Generator) -> None:
    moe = _module(generator)
    moe(torch.randn(3, 128, generator=generator), router_logits=torch.randn(3, 8))
    state = moe.state_dict()
    assert state["w13_qdata"].dtype == torch.uint8
    float_bytes = sum(
        t.numel() * t.element_size() for t in state.values() if t.is_floating_point()
    )
    int4_bytes = moe.weights.nbytes()
    e, f, d = 8, 64, 128
    assert int4_bytes == e * 3 * f * d // 2 + float_bytes
    assert float_bytes == e * 3 * f * d // 32 * 2  # one bf16 scale per group of 32


def test_assign_load_keeps_the_router_in_float32(generator: torch.Generator) -> None:
    moe, _ = _routed_layer(generator)
    state = {k: v.clone() for k, v in moe.state_dict().items()}
    state["gate_weight"] = state["gate_weight"].to(torch.bfloat16)
    fresh = Int4MoE(CFG, with_gate=True, with_correction_bias=True, device="meta")
    fresh.load_state_dict(state, assign=True)
    gate = fresh.get_parameter("gate_weight")
    assert gate.dtype == torch.float32
    torch.testing.assert_close(gate.data, state["gate_weight"].float(), **EXACT)


def test_buffers_are_checked_before_a_backend_reads_them(
    generator: torch.Generator,
) -> None:
    """A reassigned buffer of the wrong shape, or an expert map of garbage (what
    memory may hold), raises at the next call instead of being read out of bounds."""
    moe, x = _routed_layer(generator)
    moe.w13_scale = torch.ones(8, 128, 1, dtype=torch.bfloat16)
    with pytest.raises(ShapeError, match=r"w13_scale must have shape \(8, 128, 4\)"):
        moe(x)
    shard = Int4MoE(CFG, num_local_experts=4, device="meta").to_empty(device="cpu")
    for name in ("w13_scale", "w2_scale"):  # finite, so the map's check is the one hit
        shard.get_buffer(name).fill_(1.0)
    shard.get_buffer("expert_map").fill_(3)  # what uninitialized memory may hold
    with pytest.raises(ShapeError, match="expert_map must give each local id"):
        shard(x, router_logits=torch.randn(16, 8, generator=generator))


@pytest.mark.parametrize(
    "left_out", ["gate_weight", "w2_scale", "e_score_correction_bias"]
)
def test_to_empty_leaves_a_layer_as_new_for_a_partial_load(
    left_out: str, generator: torch.Generator
) -> None:
    """Built on meta, ``to_empty``, then a ``strict=False`` load without one float
    tensor: ``NotLoadedError`` names it, as after construction (it ran on whatever
    memory ``to_empty`` left: routing on garbage, finite and wrong); the map is the
    default one, not garbage."""
    source, x = _routed_layer(generator)
    state = source.state_dict()
    del state[left_out]
    shard = Int4MoE(
        CFG, with_gate=True, with_correction_bias=True, num_local_experts=8,
        device="meta",
    ).to_empty(device="cpu")  # fmt: skip
    assert torch.equal(shard.get_buffer("expert_map"), torch.arange(8))
    shard.load_state_dict(state, strict=False)
    with pytest.raises(NotLoadedError, match=rf"{left_out} was never loaded"):
        shard(x)


def test_an_assigned_state_that_requires_grad_leaves_the_experts_frozen(
    generator: torch.Generator,
) -> None:
    """``load_state_dict(assign=True)`` with tensors that require grad: the int4 and
    float buffers are detached (a gradient reached the scales on reference, and the
    int4 kernel's backward raised on cpu-int4)."""
    source, x = _routed_layer(generator)
    state = {
        k: v.detach().clone().requires_grad_(v.is_floating_point())
        for k, v in source.state_dict().items()
    }
    for backend in ("reference", "cpu-int4"):
        moe = Int4MoE(CFG, with_gate=True, with_correction_bias=True, backend=backend)
        moe.load_state_dict(state, assign=True)
        assert not any(b.requires_grad for b in moe.buffers())
        xg = x.clone().requires_grad_()
        out = moe(xg)
        torch.autograd.backward(out.float().sum())
        assert xg.grad is not None
        assert moe.get_buffer("w13_scale").grad is None
        source.backend = backend
        torch.testing.assert_close(out, source(x), **EXACT)


def test_non_finite_router_loaded_later_is_refused_at_the_next_call(
    generator: torch.Generator,
) -> None:
    moe, x = _routed_layer(generator)
    moe(x)
    state = moe.state_dict()
    state["gate_weight"] = state["gate_weight"].clone()
    state["gate_weight"][2, 3] = float("inf")
    moe.load_state_dict(state)
    with pytest.raises(ShapeError, match="gate_weight must be finite, got 1 NaN/inf"):
        moe(x)


def test_reassigned_expert_map_is_checked_again(generator: torch.Generator) -> None:
    """The map is read on every call but checked only before a prepare: replacing it
    drops the prepared form, so the next call checks it."""
    moe, x, logits = _shard_after_one_call(generator)
    moe.expert_map = torch.tensor([0, 0, 1, 1, -1, -1, -1, -1], dtype=torch.int32)
    with pytest.raises(ShapeError, match=r"each local id to at most one global expert"):
        moe(x, router_logits=logits)
    moe.expert_map = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(
        ShapeError, match=r"expert_map must have shape \(8,\), got \(2,\)"
    ):
        moe(x, router_logits=logits)
    prepared = moe._prepared
    moe.expert_map = torch.tensor([-1, -1, 1, 0, -1, -1, -1, -1], dtype=torch.int32)
    moe(x, router_logits=logits)  # a valid new map: checked, no second prepare
    assert moe._prepared is prepared
    emap = moe.get_buffer("expert_map")
    emap.data = torch.zeros(8, dtype=torch.int32)  # new memory, same tensor: seen
    with pytest.raises(ShapeError, match=r"each local id to at most one global expert"):
        moe(x, router_logits=logits)


def test_expert_map_is_checked_again_when_the_weights_shrink(
    generator: torch.Generator,
) -> None:
    """Weights swapped for a shard of fewer experts: the same map now names too many."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13[:4], w2[:4], INT4_SYM_G32)
    emap = torch.tensor([0, 1, 2, 3, -1, -1, -1, -1], dtype=torch.int32)
    moe = Int4MoE.from_quantized(q, config=CFG, expert_map=emap, backend="reference")
    x = torch.randn(4, 128, generator=generator)
    moe(x, router_logits=torch.randn(4, 8, generator=generator))
    small = quantize_expert_weights(w13[:2], w2[:2], INT4_SYM_G32)
    for name, tensor in small.tensors().items():
        setattr(moe, name, tensor)
    with pytest.raises(
        ShapeError, match=r"expert_map values must be -1 or local ids in \[0, 2\)"
    ):
        moe(x, router_logits=torch.randn(4, 8, generator=generator))


def test_expert_map_edited_in_place_is_checked_again(
    generator: torch.Generator,
) -> None:
    """An in-place edit bumps the map's version counter: the next call checks it."""
    moe, x, logits = _shard_after_one_call(generator)
    moe.get_buffer("expert_map")[2] = 7  # local id 7 of a 2-expert shard
    with pytest.raises(ShapeError, match=r"expert_map"):
        moe(x, router_logits=logits)
    moe.get_buffer("expert_map")[2] = 0  # fixed in place again: runs
    moe(x, router_logits=logits)


@pytest.mark.parametrize(
    ("kw", "missing"),
    [
        ({}, "w13_scale"),
        ({"with_gate": True}, "w13_scale"),
    ],
)
@pytest.mark.parametrize("tokens", [3, 0])
def test_never_loaded_module_is_refused_at_its_first_call(
    kw: dict[str, Any], missing: str, tokens: int, generator: torch.Generator
) -> None:
    """``Int4MoE(config)`` holds NaN scales until loaded; a forward says so (with no
    tokens too: nothing to compute, but the layer is not usable)."""
    moe = Int4MoE(CFG, **kw)
    x = torch.randn(tokens, 128, generator=generator)
    with pytest.raises(NotLoadedError, match=rf"{missing} was never loaded"):
        moe(x, router_logits=torch.randn(tokens, 8, generator=generator))


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_absent_zero_points_and_biases_read_as_none(
    scheme: Int4Scheme, generator: torch.Generator
) -> None:
    """The attributes typed ``Tensor | None`` are ``None`` where absent (not an
    AttributeError), and stay out of the state."""
    for moe in (Int4MoE(CFG, scheme=scheme), _module(generator, scheme)):
        assert moe.w13_bias is None
        assert moe.w2_bias is None
        assert (moe.w13_zero_point is not None) is scheme.has_zero_point
        assert (moe.w2_zero_point is not None) is scheme.has_zero_point
        keys = set(moe.state_dict())
        assert ("w13_zero_point" in keys) is scheme.has_zero_point
        assert not keys & {"w13_bias", "w2_bias"}


def test_unloaded_correction_bias_is_refused_like_the_gate(
    generator: torch.Generator,
) -> None:
    """A ``strict=False`` load that leaves the correction bias out raises at the
    forward (NaN until loaded), as one without the gate does."""
    cfg = attrs.evolve(CFG, scoring_func="sigmoid")
    w13, w2 = _float_weights(generator)
    src = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=cfg,
        gate_weight=torch.randn(8, 128, generator=generator),
        e_score_correction_bias=torch.randn(8, generator=generator),
    )  # fmt: skip
    x = torch.randn(2, 128, generator=generator)
    for left in ("gate_weight", "e_score_correction_bias"):
        state = dict(src.state_dict())
        del state[left]
        moe = Int4MoE(cfg, with_gate=True, with_correction_bias=True)
        moe.load_state_dict(state, strict=False)
        with pytest.raises(NotLoadedError, match=left):
            moe(x)


def test_a_reassigned_gate_of_another_shape_is_named(
    generator: torch.Generator,
) -> None:
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG,
        gate_weight=torch.randn(8, 128, generator=generator),
    )  # fmt: skip
    x = torch.randn(2, 128, generator=generator)
    moe(x)
    for shape in ((9, 128), (8, 129)):
        moe.gate_weight = nn.Parameter(torch.randn(shape), requires_grad=False)
        with pytest.raises(ShapeError, match=r"gate_weight must have shape \(8, 128\)"):
            moe(x)


def test_layers_pickled_before_the_state_split_still_load(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pickles written before ``Int4MoEState`` existed name the load hooks in
    ``modules.int4_moe``: they load, run, and their hooks still check a state."""
    moe = _module(generator)
    x = torch.randn(5, 128, generator=generator)
    logits = torch.randn(5, 8, generator=generator)
    expected = moe(x, router_logits=logits)
    for hook in (layer_state._check_loaded_state, layer_state._invalidate_after_load):
        monkeypatch.setattr(hook, "__module__", "modules.int4_moe")  # as they were
    data = pickle.dumps(moe)  # a global reference by module and name
    monkeypatch.undo()
    assert b"modules.int4_moe" in data
    loaded = pickle.loads(data)
    torch.testing.assert_close(loaded(x, router_logits=logits), expected, **EXACT)
    state = loaded.state_dict()
    state["w13_qdata"] = state["w13_qdata"].to(torch.int32)
    with pytest.raises(DTypeError, match="w13_qdata must be uint8"):
        loaded.load_state_dict(state)


@pytest.mark.parametrize(
    ("edit", "got"),
    [
        ("none", r"got None; assign the tensor back"),
        ("delete", r"got none \(deleted\); register_buffer"),
        (
            "parameter",
            r"got an nn.Parameter; .*del the parameter, then register_buffer",
        ),
    ],
)
@pytest.mark.parametrize("name", ["w13_qdata", "w13_scale", "w2_qdata", "w2_scale"])
def test_a_required_buffer_removed_is_named_and_repr_still_works(
    generator: torch.Generator, name: str, edit: str, got: str
) -> None:
    """Each message's advice restores the layer: it runs as before again."""
    moe = _module(generator)
    x = torch.randn(2, 128, generator=generator)
    logits = torch.randn(2, 8, generator=generator)
    before = moe(x, router_logits=logits)
    tensor = getattr(moe, name)
    if edit == "none":
        setattr(moe, name, None)
    elif edit == "delete":
        delattr(moe, name)
    else:  # torch moves a Parameter out of the buffers
        setattr(moe, name, nn.Parameter(tensor.float(), requires_grad=False))
    with pytest.raises(NotLoadedError, match=f"{name} must be a tensor buffer.*{got}"):
        moe(x, router_logits=logits)
    assert "num_experts=8" in repr(moe)
    if edit == "none":
        setattr(moe, name, tensor)
    elif edit == "parameter":
        delattr(moe, name)
    if edit != "none":
        moe.register_buffer(name, tensor)
    torch.testing.assert_close(moe(x, router_logits=logits), before, **EXACT)
