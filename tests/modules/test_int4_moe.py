"""Int4MoE: construction, forward paths, state_dict, moves, backend choice, errors."""

import contextlib
import copy
import gc
import io
import pickle
import re
import weakref
from typing import Any

import attrs
import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from backends.triton import route_topk_fused
from core.config import MoEConfig
from core.errors import (
    BackendUnavailableError,
    ConfigError,
    ConfigTypeError,
    DeviceError,
    DTypeError,
    NotLoadedError,
    ShapeError,
)
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import TopkRouter, route_topk
from core.scheme import (
    INT4_ASYM_G32,
    INT4_SYM,
    INT4_SYM_G32,
    INT4_SYM_G128,
    Int4Scheme,
)
from modules import Int4MoE, int4_moe
from tests.dense import dense_moe_f64, dequant_f64
from tests.tolerances import (
    EXACT,
    LAYER_SQNR_FLOOR_DB,
    rel_l2,
    sqnr_db,
)

CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)


def _float_weights(
    gen: torch.Generator, cfg: MoEConfig = CFG
) -> tuple[torch.Tensor, torch.Tensor]:
    e, f, d = cfg.num_experts, cfg.intermediate_size, cfg.hidden_size
    return torch.randn(e, 2 * f, d, generator=gen) * 0.05, torch.randn(
        e, d, f, generator=gen
    ) * 0.05


def _dense(moe: Int4MoE) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's w13 and w2 buffers dequantized by tests/dense.py, in float64."""
    q = moe.weights  # the buffers themselves, not copies
    return (
        dequant_f64(q.w13_qdata, q.w13_scale, q.w13_zero_point),
        dequant_f64(q.w2_qdata, q.w2_scale, q.w2_zero_point),
    )


def _module(
    gen: torch.Generator, scheme: Int4Scheme = INT4_SYM_G32, **kw: Any
) -> Int4MoE:
    w13, w2 = _float_weights(gen)
    return Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, scheme=scheme, **kw
    )


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_forward_matches_float64_on_dequantized_weights(
    scheme: Int4Scheme, dtype: torch.dtype, generator: torch.Generator
) -> None:
    moe = _module(generator, scheme, backend="reference")
    x = torch.randn(3, 5, 128, generator=generator).to(dtype)
    logits = torch.randn(3, 5, 8, generator=generator)
    y = moe(x, router_logits=logits)
    assert y.shape == x.shape
    assert y.dtype == dtype
    routing = route_topk(logits.reshape(15, 8), CFG)
    w13, w2 = _dense(moe)
    expected = dense_moe_f64(
        x.reshape(15, 128), w13, w2, routing.topk_weights, routing.topk_ids, CFG
    )
    assert (
        rel_l2(expected, y.reshape(15, 128))
        < {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    )


def test_quantized_vs_float_layer_error(generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, dtype=torch.float32
    )
    x = torch.randn(64, 128, generator=generator)
    logits = torch.randn(64, 8, generator=generator)
    routing = route_topk(logits, CFG)
    exact = dense_moe_f64(x, w13, w2, routing.topk_weights, routing.topk_ids, CFG)
    assert sqnr_db(exact, moe(x, router_logits=logits)) > LAYER_SQNR_FLOOR_DB


def test_topk_inputs_equal_logits_path(generator: torch.Generator) -> None:
    moe = _module(generator)
    x = torch.randn(7, 128, generator=generator, dtype=torch.float32)
    logits = torch.randn(7, 8, generator=generator)
    routing = route_topk(logits, CFG)
    a = moe(x, router_logits=logits)
    b = moe(
        x, topk_weights=routing.topk_weights, topk_ids=routing.topk_ids.to(torch.int32)
    )
    torch.testing.assert_close(a, b, **EXACT)


def test_gate_and_correction_bias(generator: torch.Generator) -> None:
    cfg = MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=128,
        intermediate_size=64,
        scoring_func="sigmoid",
        num_expert_group=4,
        topk_group=2,
        routed_scaling_factor=2.0,
    )
    w13, w2 = _float_weights(generator, cfg)
    gate = torch.randn(8, 128, generator=generator)
    bias = torch.randn(8, generator=generator)
    moe = Int4MoE.from_float(
        w13_weight=w13,
        w2_weight=w2,
        config=cfg,
        gate_weight=gate,
        e_score_correction_bias=bias,
        dtype=torch.float32,
        backend="reference",  # float32 math: the wiring is checked at fp32 tolerance
    )
    x = torch.randn(9, 128, generator=generator)
    routing = route_topk(x @ gate.T, cfg, correction_bias=bias)
    expected = moe_forward_reference(x, moe.weights, routing, cfg)
    torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-6)


def test_expert_parallel_shards_sum_to_full_layer(generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    full = quantize_expert_weights(w13, w2, INT4_SYM_G32, scale_dtype=torch.float32)
    x = torch.randn(11, 128, generator=generator)
    logits = torch.randn(11, 8, generator=generator)
    total = torch.zeros(11, 128)
    for shard in (range(0, 3), range(3, 8)):
        emap = torch.full((8,), -1, dtype=torch.int32)
        emap[list(shard)] = torch.arange(len(shard), dtype=torch.int32)
        local = quantize_expert_weights(
            w13[list(shard)], w2[list(shard)], INT4_SYM_G32, scale_dtype=torch.float32
        )
        moe = Int4MoE.from_quantized(local, config=CFG, expert_map=emap)
        total += moe(x, router_logits=logits)
    whole = Int4MoE.from_quantized(full, config=CFG)(x, router_logits=logits)
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-6)


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


def test_zero_tokens(generator: torch.Generator) -> None:
    moe = _module(generator)
    y = moe(torch.zeros(0, 128), router_logits=torch.zeros(0, 8))
    assert y.shape == (0, 128)
    y = moe(
        torch.zeros(2, 0, 128, dtype=torch.bfloat16), router_logits=torch.zeros(2, 0, 8)
    )
    assert y.shape == (2, 0, 128)


def test_extra_repr(generator: torch.Generator) -> None:
    moe = _module(generator, Int4Scheme(group_size=64))
    text = repr(moe)
    assert "scheme=int4_sym_g64" in text
    assert "group_size=64" in text
    assert "backend=auto" in text
    assert "scale_dtype=bfloat16" in text
    assert "num_local_experts" not in text  # all experts held
    moe(torch.randn(1, 128), router_logits=torch.randn(1, 8))
    assert f"auto -> {moe.backend_name}" in repr(moe)
    shard = Int4MoE(CFG, num_local_experts=2, dtype=torch.float16)
    assert "num_experts=8, num_local_experts=2, top_k=2" in repr(shard)
    assert "scale_dtype=float16" in repr(shard)


def test_explicit_reference_backend(generator: torch.Generator) -> None:
    moe = _module(generator, backend="reference")
    moe(torch.randn(2, 128), router_logits=torch.randn(2, 8))
    assert moe.backend_name == "reference"


def test_from_quantized_does_not_copy(generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    moe = Int4MoE.from_quantized(q, config=CFG)
    assert moe.w13_qdata is q.w13_qdata
    assert moe.w2_scale is q.w2_scale


# ---------------------------------------------------------------- bad input
def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(BackendUnavailableError, match=r"got 'nope'.*reference: ok"):
        Int4MoE(CFG, backend="nope")


@pytest.mark.parametrize(
    ("w13_shape", "w2_shape", "message"),
    [
        ((8, 128, 127), (8, 128, 64), r"w13_weight must have shape \(8, 128, 128\)"),
        ((8, 128, 128), (8, 64, 128), r"w2_weight must have shape \(8, 128, 64\)"),
        ((128, 128), (8, 128, 64), r"w13_weight must have shape"),
    ],
)
def test_from_float_rejects_shapes(
    w13_shape: tuple[int, ...], w2_shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ShapeError, match=message):
        Int4MoE.from_float(
            w13_weight=torch.zeros(w13_shape),
            w2_weight=torch.zeros(w2_shape),
            config=CFG,
        )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_from_float_rejects_non_finite(bad: float, generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    w2[3, 5, 7] = bad
    with pytest.raises(
        ShapeError,
        match=r"w2_weight must be finite, got 1 NaN/inf values \(first at \(3, 5, 7\)\)",
    ):
        Int4MoE.from_float(w13_weight=w13, w2_weight=w2, config=CFG)


def test_group_size_must_divide() -> None:
    cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=96, intermediate_size=64)
    with pytest.raises(
        ShapeError, match="hidden_size=96 must be divisible by group_size=128"
    ):
        Int4MoE(cfg, scheme=INT4_SYM_G128)
    odd = MoEConfig(num_experts=2, top_k=1, hidden_size=64, intermediate_size=33)
    with pytest.raises(
        ShapeError, match="intermediate_size must be a positive even number, got 33"
    ):
        Int4MoE(odd, scheme=Int4Scheme(group_size=-1))


def test_forward_rejects_bad_inputs(generator: torch.Generator) -> None:
    moe = _module(generator)
    x = torch.randn(4, 128, generator=generator)
    with pytest.raises(
        ShapeError,
        match=r"hidden_states must have last dim hidden_size=128, got shape \(4, 127\)",
    ):
        moe(torch.randn(4, 127), router_logits=torch.randn(4, 8))
    with pytest.raises(
        DTypeError,
        match=r"hidden_states must be float32, float16 or bfloat16, got dtype torch\.float64",
    ):
        moe(x.double(), router_logits=torch.randn(4, 8))
    with pytest.raises(
        ShapeError,
        match=r"router_logits must have shape \(..., num_experts=8\) with 4 tokens, got \(4, 7\)",
    ):
        moe(x, router_logits=torch.randn(4, 7))
    with pytest.raises(ConfigError, match="this module has no gate"):
        moe(x)
    with pytest.raises(ConfigError, match="got both"):
        moe(
            x,
            router_logits=torch.randn(4, 8),
            topk_weights=torch.ones(4, 2),
            topk_ids=torch.zeros(4, 2, dtype=torch.int64),
        )
    with pytest.raises(ConfigError, match="given together"):
        moe(x, topk_ids=torch.zeros(4, 2, dtype=torch.int64))


def test_forward_rejects_bad_topk(generator: torch.Generator) -> None:
    moe = _module(generator)
    x = torch.randn(4, 128, generator=generator)
    ids = torch.tensor([[0, 1], [2, 8], [0, 1], [0, 1]])
    with pytest.raises(
        ShapeError,
        match=r"topk_ids must be in \[0, num_experts=8\), got values in \[0, 8\]",
    ):
        moe(x, topk_weights=torch.ones(4, 2), topk_ids=ids)
    with pytest.raises(
        ShapeError, match=r"topk_ids must have shape \(4, 2\), got \(4, 3\)"
    ):
        moe(
            x,
            topk_weights=torch.ones(4, 3),
            topk_ids=torch.zeros(4, 3, dtype=torch.int64),
        )
    with pytest.raises(
        DTypeError, match=r"topk_ids must be int32 or int64, got dtype torch\.float32"
    ):
        moe(x, topk_weights=torch.ones(4, 2), topk_ids=torch.zeros(4, 2))


def test_routing_must_follow_the_tokens_leading_dims(
    generator: torch.Generator,
) -> None:
    """(S, B, E) logits or (B, K, S) top-k for (B, S, D) tokens would misroute."""
    moe = _module(generator, backend="reference")
    x = torch.randn(2, 3, 128, generator=generator)
    logits = torch.randn(2, 3, 8, generator=generator)
    flat = moe(x, router_logits=logits.reshape(6, 8))
    assert torch.equal(moe(x, router_logits=logits), flat)
    with pytest.raises(ShapeError, match=r"router_logits must have the leading dims"):
        moe(x, router_logits=logits.transpose(0, 1))
    r = route_topk(logits.reshape(6, 8), CFG)
    ids, w = r.topk_ids.reshape(2, 3, 2), r.topk_weights.reshape(2, 3, 2)
    assert torch.equal(moe(x, topk_weights=w, topk_ids=ids), flat)
    with pytest.raises(ShapeError, match="topk_ids"):
        moe(x, topk_weights=w.transpose(1, 2), topk_ids=ids.transpose(1, 2))


def test_device_mismatch_is_reported(generator: torch.Generator) -> None:
    moe = _module(generator)
    with pytest.raises(
        DeviceError, match="hidden_states must be on the module's device cpu, got meta"
    ):
        moe(torch.empty(4, 128, device="meta"), router_logits=torch.randn(4, 8))
    with pytest.raises(
        DeviceError, match="router_logits must be on the device of hidden_states"
    ):
        moe(torch.randn(4, 128), router_logits=torch.empty(4, 8, device="meta"))


def test_from_quantized_checks_tensors(generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    with pytest.raises(
        ShapeError,
        match=r"w13_qdata must have shape \(4, 128, 64\), got \(8, 128, 64\)",
    ):
        Int4MoE.from_quantized(
            q,
            config=MoEConfig(
                num_experts=4, top_k=2, hidden_size=128, intermediate_size=64
            ),
        )
    bad = quantize_expert_weights(w13, w2, INT4_ASYM_G32, scale_dtype=torch.float16)
    mixed = type(q)(
        **{
            **{
                k: getattr(q, k)
                for k in (
                    "w13_qdata",
                    "w13_scale",
                    "w13_zero_point",
                    "w2_qdata",
                    "w2_zero_point",
                    "scheme",
                )
            },
            "w2_scale": bad.w2_scale.to(torch.float32),
        }
    )
    with pytest.raises(DTypeError, match="w2_scale must have the dtype of w13_scale"):
        Int4MoE.from_quantized(mixed, config=CFG)
    emap = torch.tensor([0, 1, 2, 3, 4, 5, 6, 9], dtype=torch.int32)
    with pytest.raises(
        ShapeError, match=r"expert_map values must be -1 or local ids in \[0, 8\)"
    ):
        Int4MoE.from_quantized(q, config=CFG, expert_map=emap)


def test_apply_router_weight_on_input(generator: torch.Generator) -> None:
    cfg = MoEConfig(
        num_experts=4,
        top_k=1,
        hidden_size=128,
        intermediate_size=64,
        apply_router_weight_on_input=True,
    )
    w13, w2 = _float_weights(generator, cfg)
    moe = Int4MoE.from_float(
        w13_weight=w13,
        w2_weight=w2,
        config=cfg,
        dtype=torch.float32,
        backend="reference",  # float32 math: the option is checked at fp32 tolerance
    )
    x = torch.randn(6, 128, generator=generator)
    tw = torch.rand(6, 1, generator=generator)
    ids = torch.randint(0, 4, (6, 1), generator=generator)
    w13q, w2q = _dense(moe)
    expected = dense_moe_f64(x, w13q, w2q, tw, ids, cfg)
    out = moe(x, topk_weights=tw, topk_ids=ids)
    assert rel_l2(expected, out) < 1e-5
    # weighting the output instead gives another answer: the option is what is tested
    on_output = attrs.evolve(cfg, apply_router_weight_on_input=False)
    assert rel_l2(dense_moe_f64(x, w13q, w2q, tw, ids, on_output), out) > 0.05


def test_expert_biases_round_trip_and_forward(generator: torch.Generator) -> None:
    cfg = MoEConfig(
        num_experts=4,
        top_k=2,
        hidden_size=128,
        intermediate_size=64,
        activation="swigluoai",
        expert_bias=True,
    )
    w13, w2 = _float_weights(generator, cfg)
    b13, b2 = (
        torch.randn(4, 128, generator=generator),
        torch.randn(4, 128, generator=generator),
    )
    moe = Int4MoE.from_float(
        w13_weight=w13,
        w2_weight=w2,
        config=cfg,
        dtype=torch.float32,
        w13_bias=b13,
        w2_bias=b2,
        backend="reference",  # float32 math: the biases are checked at fp32 tolerance
    )
    x = torch.randn(6, 128, generator=generator)
    logits = torch.randn(6, 4, generator=generator)
    routing = route_topk(logits, cfg)
    w13q, w2q = _dense(moe)
    expected = dense_moe_f64(
        x,
        w13q,
        w2q,
        routing.topk_weights,
        routing.topk_ids,
        cfg,
        w13_bias=b13,
        w2_bias=b2,
    )
    assert rel_l2(expected, moe(x, router_logits=logits)) < 1e-5
    fresh = Int4MoE(cfg, dtype=torch.float32, backend="reference")
    fresh.load_state_dict(moe.state_dict())
    assert "w13_bias" in moe.state_dict()
    torch.testing.assert_close(
        fresh(x, router_logits=logits), moe(x, router_logits=logits), **EXACT
    )
    with pytest.raises(
        ShapeError, match="w13_bias must be a tensor with expert_bias=True, got None"
    ):
        Int4MoE.from_float(w13_weight=w13, w2_weight=w2, config=cfg)


def test_unknown_backend_is_reported_for_the_weights_device(
    generator: torch.Generator,
) -> None:
    with pytest.raises(
        BackendUnavailableError, match=r"got 'nope'\. On cpu with torch\.bfloat16: "
    ):
        _module(generator, backend="nope")


def test_runs_inside_torch_compile(generator: torch.Generator) -> None:
    gate = torch.randn(8, 128, generator=generator)
    moe = _module(generator, gate_weight=gate, dtype=torch.float32)
    model = nn.Sequential(nn.Linear(128, 128), moe)
    x = torch.randn(2, 5, 128, generator=generator)
    logits = torch.randn(2, 5, 8, generator=generator)
    torch._dynamo.reset()
    compiled_moe = torch.compile(moe, backend="eager")
    torch.testing.assert_close(
        compiled_moe(x, logits), moe(x, router_logits=logits), **EXACT
    )
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, backend="eager")(x)
    torch.testing.assert_close(compiled, eager, **EXACT)


def test_the_router_is_kept_in_float32(generator: torch.Generator) -> None:
    """A float32 router stays exact in a bf16 layer (rounding it moved some tokens to
    other experts); a state dict's bf16 router loads into it exactly."""
    gate = torch.randn(8, 128, generator=generator)
    moe = _module(generator, gate_weight=gate, dtype=torch.bfloat16)
    assert moe.gate_weight is not None
    assert moe.gate_weight.dtype == torch.float32
    torch.testing.assert_close(moe.gate_weight.data, gate, **EXACT)
    empty = Int4MoE(CFG, with_gate=True)
    assert empty.gate_weight is not None
    state = moe.state_dict()
    state["gate_weight"] = gate.to(torch.bfloat16)
    empty.load_state_dict(state)
    torch.testing.assert_close(
        empty.gate_weight.data, gate.to(torch.bfloat16).float(), **EXACT
    )
    x = torch.randn(64, 128, generator=generator).to(torch.bfloat16)
    routed = route_topk(x.float() @ gate.T, CFG)
    expected = moe(x, topk_weights=routed.topk_weights, topk_ids=routed.topk_ids)
    torch.testing.assert_close(moe(x), expected, **EXACT)


def _routed_layer(generator: torch.Generator) -> tuple[Int4MoE, torch.Tensor]:
    """A bf16 layer with a float32 router and correction bias, and an input."""
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13,
        w2_weight=w2,
        config=CFG,
        gate_weight=torch.randn(8, 128, generator=generator),
        e_score_correction_bias=torch.randn(8, generator=generator) * 0.1,
    )
    return moe, torch.randn(16, 128, generator=generator).to(torch.bfloat16)


@pytest.mark.parametrize(
    "convert",
    ["bfloat16", "half", "to_bfloat16", "float"],
)
def test_dtype_casts_keep_the_router_in_float32(
    convert: str, generator: torch.Generator
) -> None:
    """``.half()`` and friends cast the scales, not the router: rounding it moved
    tokens to other experts."""
    moe, x = _routed_layer(generator)
    gate = moe.get_parameter("gate_weight").detach().clone()
    bias = moe.get_buffer("e_score_correction_bias").clone()
    if convert == "to_bfloat16":
        moe.to(torch.bfloat16)
    else:
        getattr(moe, convert)()
    torch.testing.assert_close(moe.get_parameter("gate_weight").data, gate, **EXACT)
    torch.testing.assert_close(moe.get_buffer("e_score_correction_bias"), bias, **EXACT)
    assert moe.get_buffer("w13_scale").dtype != torch.float32 or convert == "float"
    assert moe._prepared is None  # the old prepared form is dropped at once
    routed = route_topk(x.float() @ gate.T, CFG, correction_bias=bias)
    expected = moe(x, topk_weights=routed.topk_weights, topk_ids=routed.topk_ids)
    torch.testing.assert_close(moe(x), expected, **EXACT)


def test_assign_load_keeps_the_router_in_float32(generator: torch.Generator) -> None:
    moe, _ = _routed_layer(generator)
    state = {k: v.clone() for k, v in moe.state_dict().items()}
    state["gate_weight"] = state["gate_weight"].to(torch.bfloat16)
    fresh = Int4MoE(CFG, with_gate=True, with_correction_bias=True, device="meta")
    fresh.load_state_dict(state, assign=True)
    gate = fresh.get_parameter("gate_weight")
    assert gate.dtype == torch.float32
    torch.testing.assert_close(gate.data, state["gate_weight"].float(), **EXACT)


def test_autocast_leaves_the_float32_math_alone(generator: torch.Generator) -> None:
    """Under autocast the router and the reference backend stay float32."""
    moe, x = _routed_layer(generator)
    moe.backend = "reference"
    plain = moe(x.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = moe(x.float())
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, plain, **EXACT)


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


def test_fake_and_default_device_calls_do_not_poison_later_ones(
    generator: torch.Generator,
) -> None:
    """A call traced under a fake mode, or made inside ``with torch.device("meta")``,
    leaves no prepared form that later real calls would read."""
    moe, x = _routed_layer(generator)
    expected = moe(x)
    moe.invalidate_prepared()
    with FakeTensorMode(allow_non_fake_inputs=True), contextlib.suppress(Exception):
        moe(x)
    torch.testing.assert_close(moe(x), expected, **EXACT)
    moe.invalidate_prepared()
    with torch.device("meta"), contextlib.suppress(Exception):
        moe(x)
    torch.testing.assert_close(moe(x), expected, **EXACT)


# ---------------------------------------------------------------- values and types


def test_zero_points_above_15_are_refused(generator: torch.Generator) -> None:
    """A zero point is one int4 code a byte: 200 would shift every weight of its group."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    assert q.w13_zero_point is not None
    zero = q.w13_zero_point.clone()
    zero[3, 5, 1] = 200
    with pytest.raises(
        ShapeError,
        match=r"w13_zero_point must hold int4 codes 0..15 .*got values up to 200",
    ):
        Int4MoE.from_quantized(attrs.evolve(q, w13_zero_point=zero), config=CFG)


@pytest.mark.parametrize(
    "where",
    ["w13_scale", "w2_scale", "gate_weight", "e_score_correction_bias", "w2_bias"],
)
def test_non_finite_weights_are_refused_where_they_enter(
    where: str, generator: torch.Generator
) -> None:
    """One NaN scale or router entry would turn every token it touches into NaN."""
    w13, w2 = _float_weights(generator)
    cfg = attrs.evolve(CFG, expert_bias=True)
    q = attrs.evolve(
        quantize_expert_weights(w13, w2, INT4_SYM_G32),
        w13_bias=torch.zeros(8, 128, dtype=torch.bfloat16),
        w2_bias=torch.zeros(8, 128, dtype=torch.bfloat16),
    )
    gate, bias = torch.randn(8, 128, generator=generator), torch.zeros(8)
    tensors = {
        "w13_scale": q.w13_scale.clone(),
        "w2_scale": q.w2_scale.clone(),
        "w2_bias": torch.zeros(8, 128, dtype=torch.bfloat16),
        "gate_weight": gate,
        "e_score_correction_bias": bias,
    }
    tensors[where].view(-1)[7] = float("nan")
    q = attrs.evolve(
        q,
        w13_scale=tensors["w13_scale"],
        w2_scale=tensors["w2_scale"],
        w2_bias=tensors["w2_bias"],
    )
    with pytest.raises(ShapeError, match=rf"{where} must be finite, got 1 NaN/inf"):
        Int4MoE.from_quantized(
            q, config=cfg, gate_weight=gate, e_score_correction_bias=bias
        )


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


def _shard_after_one_call(
    generator: torch.Generator,
) -> tuple[Int4MoE, torch.Tensor, torch.Tensor]:
    """Experts 2 and 3 of 8 held here (local 0 and 1), after a first call."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13[:2], w2[:2], INT4_SYM_G32)
    emap = torch.tensor([-1, -1, 0, 1, -1, -1, -1, -1], dtype=torch.int32)
    moe = Int4MoE.from_quantized(q, config=CFG, expert_map=emap)
    x = torch.randn(4, 128, generator=generator)
    logits = torch.randn(4, 8, generator=generator)
    moe(x, router_logits=logits)
    return moe, x, logits


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


def test_load_refuses_what_the_copy_into_the_buffers_would_garble(
    generator: torch.Generator,
) -> None:
    """load_state_dict casts into each buffer's dtype: int32 codes would wrap into
    uint8, and fp32 scales past fp16's range would become inf."""
    moe = _module(generator, dtype=torch.float16)
    state = {k: v.clone() for k, v in moe.state_dict().items()}
    codes = dict(state, w13_qdata=state["w13_qdata"].to(torch.int32))
    with pytest.raises(DTypeError, match=r"state_dict w13_qdata must be uint8.*int32"):
        moe.load_state_dict(codes)
    scales = dict(state, w2_scale=state["w2_scale"].float() * 1e8)
    with pytest.raises(
        ShapeError,
        match=r"state_dict w2_scale must fit torch.float16, got \d+ values overflowing",
    ):
        moe.load_state_dict(scales)
    tiny = dict(state, w2_scale=state["w2_scale"].float() * 1e-8)  # below fp16's range
    with pytest.raises(
        ShapeError, match=r"state_dict w2_scale must fit torch.float16, got \d+ nonzero"
    ):
        moe.load_state_dict(tiny)
    same = dict(state, w2_scale=state["w2_scale"].float())  # fits: loads exactly
    moe.load_state_dict(same)
    torch.testing.assert_close(moe.get_buffer("w2_scale"), state["w2_scale"], **EXACT)


def test_a_cast_to_an_unsupported_dtype_is_refused_before_anything_moves(
    generator: torch.Generator,
) -> None:
    moe, x = _routed_layer(generator)
    before = moe(x)
    for cast in (moe.double, lambda: moe.to(torch.float64)):
        with pytest.raises(DTypeError, match=r"cannot be cast to torch\.float64"):
            cast()
        assert moe.get_buffer("w13_scale").dtype == torch.bfloat16
    torch.testing.assert_close(moe(x), before, **EXACT)
    # bf16 scales below fp16's range would round to 0 under .half(): refused too.
    with torch.no_grad():
        moe.get_buffer("w2_scale")[0, 0, 0] = 1e-9
    with pytest.raises(
        ShapeError,
        match=r"w2_scale \(cast to torch.float16; this layer was not cast\) must fit "
        r"torch.float16, got 1 nonzero values rounding to 0",
    ):
        moe.half()
    assert moe.get_buffer("w2_scale").dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32], ids=str)
def test_module_type_is_refused_before_it_converts_the_codes(
    dtype: torch.dtype, generator: torch.Generator
) -> None:
    # Module.type(dtype) converts every buffer, the uint8 codes too; .to(dtype) does not.
    moe, x = _routed_layer(generator)
    before = moe(x)
    dtypes = {name: t.dtype for name, t in moe.state_dict().items()}
    with pytest.raises(
        DTypeError, match=r"turns its torch\.uint8 buffers .* as Module\.type\(dtype\)"
    ):
        moe.type(dtype)
    assert {name: t.dtype for name, t in moe.state_dict().items()} == dtypes
    torch.testing.assert_close(moe(x), before, **EXACT)


@pytest.mark.parametrize("count", [2.0, True, "2"])
def test_num_local_experts_must_be_an_int(count: object) -> None:
    with pytest.raises(
        ConfigTypeError, match="num_local_experts must be an int or None"
    ):
        Int4MoE(CFG, num_local_experts=count)  # type: ignore[arg-type]  # deliberately bad
    import numpy as np

    shard = Int4MoE(CFG, num_local_experts=np.int64(2), device="meta")  # an Integral
    assert shard.get_buffer("w13_qdata").shape[0] == 2


def test_arguments_of_the_wrong_type_are_named(generator: torch.Generator) -> None:
    """What strict mypy catches in users' code is also caught at run time, by name."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    cases: list[tuple[Any, str]] = [
        (lambda: Int4MoE({"num_experts": 8}), "config must be of type MoEConfig, got dict"),  # type: ignore[arg-type]
        (lambda: Int4MoE(CFG, scheme="int4_sym_g32"), "scheme must be of type Int4Scheme, got str"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_quantized(q.tensors(), config=CFG), "weights must be of type QuantizedExpertWeights, got dict"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_quantized(q, config=CFG, expert_map=[0] * 8), "expert_map must be of type Tensor, got list"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_quantized(q, config=CFG, gate_weight=1.0), "gate_weight must be of type Tensor, got float"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_float(w13_weight=w13.numpy(), w2_weight=w2, config=CFG), "w13_weight must be of type Tensor, got ndarray"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_checkpoint(42, prefix="m", config=CFG), "source must be of type str or PathLike or Mapping, got int"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_checkpoint({}, prefix="m", config=CFG, quantization_config="gptq"), "quantization_config must be of type Mapping, got str"),  # type: ignore[arg-type]
    ]  # fmt: skip
    for call, message in cases:
        with pytest.raises(ConfigTypeError, match=message):
            call()


def test_meta_tensors_are_refused_where_values_are_needed(
    generator: torch.Generator,
) -> None:
    w13, w2 = _float_weights(generator)
    with pytest.raises(
        DeviceError, match="w13_weight must hold values, got a tensor on the meta"
    ):
        Int4MoE.from_float(
            w13_weight=w13.to("meta"), w2_weight=w2.to("meta"), config=CFG
        )
    moe = Int4MoE(CFG, device="meta")  # an empty layer, before its weights are loaded
    with pytest.raises(
        DeviceError, match="must hold its weights to run, got buffers on the meta"
    ):
        moe(
            torch.randn(2, 128, device="meta"),
            router_logits=torch.randn(2, 8, device="meta"),
        )


def test_zero_point_16_is_refused_and_15_accepted(generator: torch.Generator) -> None:
    """The range check's edge: 15 is the largest code, 16 one too many."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    assert q.w2_zero_point is not None
    ok = q.w2_zero_point.clone()
    ok[0, 0, 0] = 15
    Int4MoE.from_quantized(attrs.evolve(q, w2_zero_point=ok), config=CFG)
    bad = q.w2_zero_point.clone()
    bad[1, 2, 1] = 16
    with pytest.raises(
        ShapeError,
        match=r"w2_zero_point must hold int4 codes 0..15 .*got values up to 16",
    ):
        Int4MoE.from_quantized(attrs.evolve(q, w2_zero_point=bad), config=CFG)


def test_weights_on_two_devices_are_refused(generator: torch.Generator) -> None:
    """One tensor left on another device (here meta) is named, not run."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    split = attrs.evolve(q, w2_scale=q.w2_scale.to("meta"))
    with pytest.raises(
        DeviceError, match=r"tensors must be on one device, got .*w2_scale on meta"
    ):
        Int4MoE.from_quantized(split, config=CFG)


def test_routers_given_in_bf16_are_held_in_float32(generator: torch.Generator) -> None:
    """The router and its correction bias become float32 buffers, whatever came in."""
    w13, w2 = _float_weights(generator)
    gate = torch.randn(8, 128, generator=generator).bfloat16()
    bias = torch.rand(8, generator=generator).bfloat16()
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, gate_weight=gate,
        e_score_correction_bias=bias,
    )  # fmt: skip
    assert moe.gate_weight is not None
    assert moe.e_score_correction_bias is not None
    assert moe.gate_weight.dtype == moe.e_score_correction_bias.dtype == torch.float32
    assert torch.equal(moe.gate_weight, gate.float())
    assert torch.equal(moe.e_score_correction_bias, bias.float())
    assert moe.state_dict()["gate_weight"].dtype == torch.float32


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


def test_a_cast_frees_the_old_tensors_at_once(generator: torch.Generator) -> None:
    """``.half()`` drops the prepared form, so nothing keeps the bf16 scales alive."""
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, backend="reference"
    )
    moe(torch.randn(4, 128, generator=generator), router_logits=torch.randn(4, 8))
    chosen = moe.backend_name
    assert chosen == "reference"
    old = weakref.ref(moe.w13_scale)
    moe.half()
    gc.collect()
    assert moe.backend_name is None
    assert old() is None


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


@pytest.mark.parametrize("left_out", ["w2_scale", "gate_weight"])
def test_state_loaded_without_a_float_buffer_is_refused(
    left_out: str, generator: torch.Generator
) -> None:
    """``load_state_dict(strict=False)`` missing a scale or the router: the buffer
    keeps its NaN, and the first forward names it (before: garbage, silently)."""
    source = _module(generator)
    source.gate_weight = nn.Parameter(
        torch.randn(8, 128, generator=generator), requires_grad=False
    )
    state = source.state_dict()
    del state[left_out]
    moe = Int4MoE(CFG, with_gate=True)
    moe.load_state_dict(state, strict=False)
    x = torch.randn(3, 128, generator=generator)
    with pytest.raises(NotLoadedError, match=rf"{left_out} was never loaded"):
        moe(x)
    moe.load_state_dict(source.state_dict())  # a full load then runs
    want = source(x)
    torch.testing.assert_close(moe(x), want, rtol=0, atol=0)


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


@pytest.mark.parametrize(
    ("field", "shape"),
    [("hidden_size", "(128, 64)"), ("intermediate_size", "(128, 64)")],
)
def test_a_state_of_other_sizes_names_the_sizes_not_the_scheme(
    field: str, shape: str, generator: torch.Generator
) -> None:
    """A state saved for another hidden or intermediate size is a config mismatch:
    said so, rather than blamed on the group size its scales' width implies."""
    state = _module(generator).state_dict()
    other = attrs.evolve(CFG, **{field: 2 * getattr(CFG, field)})
    for strict in (True, False):
        moe = Int4MoE(other)
        with pytest.raises(
            ConfigError,
            match=rf"state_dict w(13|2)_qdata must have rows x packed columns .* for "
            rf"this Int4MoE \(hidden_size={other.hidden_size}, intermediate_size="
            rf"{other.intermediate_size}\), got {re.escape(shape)}: build the module "
            r"with the config",
        ):
            moe.load_state_dict(state, strict=strict)


@pytest.mark.parametrize(
    ("saved", "built", "message"),
    [
        (
            INT4_ASYM_G32,
            INT4_SYM_G32,
            r"symmetric scheme int4_sym_g32, got a state "
            r"that has zero points",
        ),
        (
            INT4_SYM_G32,
            INT4_ASYM_G32,
            r"asymmetric scheme int4_asym_g32, got a state "
            r"that has no zero points",
        ),
        (
            INT4_SYM,
            INT4_SYM_G32,
            r"w13_scale must have 4 groups a row for this "
            r"Int4MoE's scheme int4_sym_g32 \(group_size 32\), got 1, as group_size -1 "
            r"\(one group per row\) gives",
        ),
    ],
    ids=["asym-into-sym", "sym-into-asym", "per-row-into-g32"],
)
def test_a_state_of_another_scheme_is_refused_by_name(
    saved: Int4Scheme, built: Int4Scheme, message: str, generator: torch.Generator
) -> None:
    """The state does not record its scheme; loading one into a module of another
    says which, strict or not (a zero point left out would be garbage)."""
    state = _module(generator, saved).state_dict()
    for strict in (True, False):
        moe = Int4MoE(CFG, scheme=built)
        with pytest.raises(ConfigError, match=message):
            moe.load_state_dict(state, strict=strict)


def test_check_topk_ids_is_on_by_default_and_survives_pickling(
    generator: torch.Generator,
) -> None:
    moe = _module(generator)
    assert moe.check_topk_ids is True
    moe.check_topk_ids = False
    copied = pickle.loads(pickle.dumps(moe))
    assert copied.check_topk_ids is False
    state = dict(moe.__dict__)  # a layer pickled before the attribute existed
    del state["check_topk_ids"]
    old = Int4MoE.__new__(Int4MoE)
    old.__setstate__(state)
    assert old.check_topk_ids is True


def test_routes_through_the_device_s_fused_router(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On CUDA the module routes logits with route_topk_fused; here it is made to, the
    # kernel interpreted on CPU. Given top-k ids are not routed again.
    cfg = MoEConfig(
        num_experts=8, top_k=2, hidden_size=128, intermediate_size=64,
        scoring_func="sigmoid", num_expert_group=4, topk_group=2,
    )  # fmt: skip
    w13, w2 = _float_weights(generator, cfg)
    gate = torch.randn(8, 128, generator=generator)
    bias = torch.randn(8, generator=generator)
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=cfg, gate_weight=gate,
        e_score_correction_bias=bias, dtype=torch.float32, backend="reference",
    )  # fmt: skip
    calls: list[torch.device] = []

    def fused_router_for(device: torch.device) -> TopkRouter:
        calls.append(device)
        return route_topk_fused

    monkeypatch.setattr(int4_moe, "fused_router_for", fused_router_for)
    x = torch.randn(9, 128, generator=generator)
    logits = x @ gate.T
    routing = route_topk(logits, cfg, correction_bias=bias)
    expected = moe_forward_reference(x, moe.weights, routing, cfg)
    for kwargs in ({}, {"router_logits": logits}):
        with torch.no_grad():
            torch.testing.assert_close(moe(x, **kwargs), expected, rtol=1e-5, atol=1e-6)
    assert calls == [x.device, x.device]
    with torch.no_grad():
        moe(x, topk_weights=routing.topk_weights, topk_ids=routing.topk_ids)
    # A router being trained keeps its gradient: the fused router hands it to
    # route_topk.
    gate_weight = moe.gate_weight
    assert gate_weight is not None
    gate_weight.requires_grad_(True)
    (grad,) = torch.autograd.grad(moe(x).sum(), gate_weight)
    assert grad.abs().sum() > 0


def test_from_float_of_trainable_weights_keeps_no_graph_and_no_alias(
    generator: torch.Generator,
) -> None:
    """Weights, biases, router and correction bias that are a model's parameters:
    the layer's tensors carry no autograd history (its output records nothing for
    inputs that need no gradient, deepcopy works, the float weights can be freed)
    and the router tensors are the layer's own copies."""
    cfg = attrs.evolve(CFG, scoring_func="sigmoid")
    w13, w2 = (nn.Parameter(t) for t in _float_weights(generator))
    gate = nn.Parameter(torch.randn(8, 128, generator=generator))
    bias = nn.Parameter(torch.randn(8, generator=generator))
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=cfg, gate_weight=gate,
        e_score_correction_bias=bias, backend="reference",
    )  # fmt: skip
    for name, tensor in moe.named_buffers():
        assert tensor.grad_fn is None, name
        assert not tensor.requires_grad, name
    assert moe.gate_weight is not None
    assert moe.gate_weight is not gate
    assert moe.gate_weight.data_ptr() != gate.data_ptr()
    assert moe.e_score_correction_bias is not bias
    with torch.no_grad():
        gate.add_(1.0)
    assert not torch.equal(moe.gate_weight, gate)
    out = moe(torch.randn(3, 128, generator=generator))
    assert not out.requires_grad
    copy.deepcopy(moe)
    alive = weakref.ref(w13)
    del w13
    gc.collect()
    assert alive() is None


def test_from_float_of_strided_weights_gives_contiguous_buffers(
    generator: torch.Generator,
) -> None:
    """Transposed views quantize to contiguous codes and scales (savable as-is)."""
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13.transpose(1, 2).contiguous().transpose(1, 2),
        w2_weight=w2.transpose(1, 2).contiguous().transpose(1, 2),
        config=CFG,
    )
    for name, tensor in moe.named_buffers():
        assert tensor.is_contiguous(), name


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


def test_forward_arguments_of_another_type_are_named(
    generator: torch.Generator,
) -> None:
    moe = _module(generator)
    x = torch.randn(2, 128, generator=generator)
    logits = torch.randn(2, 8, generator=generator)
    with pytest.raises(ConfigTypeError, match=r"hidden_states must be of type Tensor"):
        moe(x.tolist(), logits)  # type: ignore[arg-type]  # deliberately bad
    with pytest.raises(ConfigTypeError, match=r"router_logits must be of type Tensor"):
        moe(x, logits.numpy())  # type: ignore[arg-type]  # deliberately bad
    routing = route_topk(logits, CFG)
    with pytest.raises(ConfigTypeError, match=r"topk_ids must be of type Tensor"):
        moe(x, topk_weights=routing.topk_weights, topk_ids=routing.topk_ids.tolist())  # type: ignore[arg-type]  # deliberately bad


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


def test_half_keeps_a_trained_router_s_gradient_in_float32(
    generator: torch.Generator,
) -> None:
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, backend="reference",
        gate_weight=torch.randn(8, 128, generator=generator),
    )  # fmt: skip
    assert moe.gate_weight is not None
    moe.gate_weight.requires_grad_(True)
    torch.autograd.backward(moe(torch.randn(3, 128, generator=generator)).sum())
    assert moe.gate_weight.grad is not None
    moe.gate_weight.grad[0, :3] = torch.tensor([1e-8, 1e5, 0.1000001])  # not fp16's
    before = moe.gate_weight.grad.clone()
    moe.half()
    assert moe.gate_weight.dtype == torch.float32
    assert moe.gate_weight.grad is not None
    assert moe.gate_weight.grad.dtype == torch.float32
    torch.testing.assert_close(moe.gate_weight.grad, before, **EXACT)
