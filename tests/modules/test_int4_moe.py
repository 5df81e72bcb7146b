"""Int4MoE: construction, forward paths, routing sources, backend choice, compile."""

import contextlib
import copy
import gc
import pickle
import weakref

import attrs
import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from backends.triton import route_topk_fused
from core.config import MoEConfig
from core.errors import (
    ShapeError,
)
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import TopkRouter, route_topk
from core.scheme import (
    INT4_ASYM_G32,
    INT4_SYM_G32,
    Int4Scheme,
)
from modules import Int4MoE, int4_moe
from tests.dense import dense_moe_f64
from tests.modules.int4_moe_cases import (
    CFG,
    _dense,
    _float_weights,
    _module,
    _routed_layer,
)
from tests.tolerances import (
    EXACT,
    LAYER_SQNR_FLOOR_DB,
    rel_l2,
    sqnr_db,
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
        x.reshape(15, 128), w13, w2, routing.topk_weights, routing.topk_ids, config=CFG
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
    exact = dense_moe_f64(
        x, w13, w2, routing.topk_weights, routing.topk_ids, config=CFG
    )
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
    expected = dense_moe_f64(x, w13q, w2q, tw, ids, config=cfg)
    out = moe(x, topk_weights=tw, topk_ids=ids)
    assert rel_l2(expected, out) < 1e-5
    # weighting the output instead gives another answer: the option is what is tested
    on_output = attrs.evolve(cfg, apply_router_weight_on_input=False)
    assert rel_l2(dense_moe_f64(x, w13q, w2q, tw, ids, config=on_output), out) > 0.05


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
        config=cfg,
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


def test_expert_biases_fp16_cannot_hold(generator: torch.Generator) -> None:
    cfg = MoEConfig(
        num_experts=4, top_k=2, hidden_size=128, intermediate_size=64,
        activation="swigluoai", expert_bias=True,
    )  # fmt: skip
    w13, w2 = _float_weights(generator, cfg)
    b13, b2 = torch.randn(4, 128, generator=generator), torch.randn(4, 128)
    # a finite bias that fp16 cannot hold is named as such, not as NaN/inf input
    big = torch.full((4, 128), 1e6)
    for name, biases in (("w13_bias", (big, b2)), ("w2_bias", (b13, big))):
        with pytest.raises(ShapeError, match=f"{name} must fit torch.float16.*1e"):
            Int4MoE.from_float(
                w13_weight=w13, w2_weight=w2, config=cfg, dtype=torch.float16,
                w13_bias=biases[0], w2_bias=biases[1],
            )  # fmt: skip
    # a bias value rounding to 0 in fp16 is kept as 0 (it changes nothing), in
    # from_float and under .half() alike; an overflowing one is refused by .half()
    tiny = b13.clone()
    tiny[0, 0] = 1e-9
    half = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=cfg, dtype=torch.float16,
        w13_bias=tiny, w2_bias=b2,
    )  # fmt: skip
    assert half.w13_bias is not None
    assert float(half.w13_bias[0, 0]) == 0.0
    bf16 = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=cfg, dtype=torch.bfloat16,
        w13_bias=tiny, w2_bias=b2,
    )  # fmt: skip
    assert bf16.half().w13_bias is not None
    with torch.no_grad():
        bf16.float()
        assert bf16.w2_bias is not None
        bf16.w2_bias[0, 0] = 1e6
    with pytest.raises(
        ShapeError, match=r"w2_bias \(cast to torch.float16.*overflowing"
    ):
        bf16.half()


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


def test_autocast_leaves_the_float32_math_alone(generator: torch.Generator) -> None:
    """Under autocast the router and the reference backend stay float32."""
    moe, x = _routed_layer(generator)
    moe.backend = "reference"
    plain = moe(x.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = moe(x.float())
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, plain, **EXACT)


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
