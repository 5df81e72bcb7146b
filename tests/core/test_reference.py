"""moe_forward_reference against the independent float64 dense MoE (tests/dense.py)."""

from typing import Any

import attrs
import pytest
import torch

from core.config import Activation, MoEConfig
from core.errors import DTypeError, ShapeError
from core.quantize import (
    quantize_expert_weights,
)
from core.reference import moe_backward_reference, moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, INT4_SYM_G128, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.dense import dense_moe_f64, dequant_f64
from tests.tolerances import REL_L2_VS_ORACLE, rel_l2


def _weights(
    e: int,
    f: int,
    d: int,
    scheme: Int4Scheme,
    gen: torch.Generator,
    *,
    dtype: torch.dtype,
) -> QuantizedExpertWeights:
    w13 = torch.randn(e, 2 * f, d, generator=gen) / d**0.5
    w2 = torch.randn(e, d, f, generator=gen) / f**0.5
    return quantize_expert_weights(w13, w2, scheme, scale_dtype=dtype)


def _dense(weights: QuantizedExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        dequant_f64(weights.w13_qdata, weights.w13_scale, weights.w13_zero_point),
        dequant_f64(weights.w2_qdata, weights.w2_scale, weights.w2_zero_point),
    )


def _check(
    config: MoEConfig,
    scheme: Int4Scheme,
    tokens: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    weights = _weights(
        config.num_experts,
        config.intermediate_size,
        config.hidden_size,
        scheme,
        gen,
        dtype=dtype,
    )
    x = torch.randn(tokens, config.hidden_size, generator=gen).to(dtype)
    routing = route_topk(torch.randn(tokens, config.num_experts, generator=gen), config)
    out = moe_forward_reference(x, weights, routing, config)
    assert out.dtype == dtype
    assert out.shape == (tokens, config.hidden_size)
    w13, w2 = _dense(weights)
    expected = dense_moe_f64(
        x, w13, w2, routing.topk_weights, routing.topk_ids, config=config
    )
    if tokens == 0:
        return
    # The oracle computes in float32 and rounds once to the output dtype.
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert rel_l2(expected, out) < tol


SHAPES = [  # (E, top_k, D, F, tokens)
    (1, 1, 64, 32, 7),
    (8, 2, 128, 64, 1),
    (8, 8, 64, 64, 7),
    (16, 4, 64, 96, 300),
    (64, 6, 64, 32, 300),
    (32, 8, 128, 32, 0),
]


@pytest.mark.parametrize(("e", "k", "d", "f", "t"), SHAPES)
@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_reference_matches_dense_float64(
    e: int,
    k: int,
    d: int,
    f: int,
    t: int,
    scheme: Int4Scheme,
    generator: torch.Generator,
) -> None:
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    _check(config, scheme, t, torch.float32, generator)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh", "swigluoai"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_reference_activations_and_dtypes(
    activation: Activation, dtype: torch.dtype, generator: torch.Generator
) -> None:
    config = MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=128,
        intermediate_size=128,
        activation=activation,
    )
    _check(config, INT4_SYM_G128, 7, dtype, generator)


def _assert_swiglu_clamps_bite(
    x: torch.Tensor,
    w13: torch.Tensor,
    routing: Routing,
    config: MoEConfig,
    w13_bias: torch.Tensor | None = None,
) -> None:
    """Some routed gate pre-activation is above the limit, some up one outside +-limit.

    float64 from the dequantized weights, so the case keeps exercising both clamps.
    """
    ids = routing.topk_ids.flatten()
    tokens = torch.arange(x.shape[0]).repeat_interleave(routing.topk_ids.shape[1])
    h = torch.einsum("nd,nhd->nh", x.double()[tokens], w13[ids])
    if w13_bias is not None:
        h = h + w13_bias.double()[ids]
    gate, up = h.chunk(2, dim=-1)
    limit = config.swiglu_limit
    assert bool((gate > limit).any())
    assert bool((up > limit).any())
    assert bool((up < -limit).any())


@pytest.mark.parametrize(
    ("limit", "x_scale"), [(1.0, 1.0), (7.0, 8.0)], ids=["limit1", "default-limit"]
)
def test_reference_swigluoai_clamp(
    limit: float, x_scale: float, generator: torch.Generator
) -> None:
    """The gpt-oss clamp against tests/dense.py's, on inputs that reach the limit."""
    config = MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=64,
        intermediate_size=64,
        activation="swigluoai",
        swiglu_limit=limit,
    )
    weights = _weights(8, 64, 64, INT4_ASYM_G32, generator, dtype=torch.float32)
    x = torch.randn(16, 64, generator=generator) * x_scale
    routing = route_topk(torch.randn(16, 8, generator=generator), config)
    w13, w2 = _dense(weights)
    _assert_swiglu_clamps_bite(x, w13, routing, config)
    out = moe_forward_reference(x, weights, routing, config)
    expected = dense_moe_f64(
        x, w13, w2, routing.topk_weights, routing.topk_ids, config=config
    )
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[torch.float32]
    unclamped = attrs.evolve(config, swiglu_limit=1e30)
    no_clamp = dense_moe_f64(
        x, w13, w2, routing.topk_weights, routing.topk_ids, config=unclamped
    )
    assert rel_l2(expected, no_clamp) > 0.05  # the clamps matter in this case


ROUTING_OPTIONS = [
    {"renormalize": False},
    {"scoring_func": "sigmoid"},
    {"num_expert_group": 4, "topk_group": 2},
    {"routed_scaling_factor": 2.5},
    {"top_k": 1, "apply_router_weight_on_input": True},
]


@pytest.mark.parametrize("options", ROUTING_OPTIONS, ids=lambda o: "-".join(o))
def test_reference_routing_options(
    options: dict[str, Any], generator: torch.Generator
) -> None:
    base = MoEConfig(num_experts=16, top_k=4, hidden_size=64, intermediate_size=64)
    config = attrs.evolve(base, **options)
    _check(config, INT4_ASYM_G32, 7, torch.float32, generator)


def test_reference_ids_of_minus_one_contribute_zero(generator: torch.Generator) -> None:
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    weights = _weights(4, 32, 64, INT4_SYM_G32, generator, dtype=torch.float32)
    x = torch.randn(5, 64, generator=generator)
    ids = torch.tensor([[0, -1], [-1, -1], [3, 2], [1, -1], [2, 0]])
    tw = torch.rand(5, 2, generator=generator)
    out = moe_forward_reference(
        x, weights, Routing(topk_weights=tw, topk_ids=ids), config
    )
    w13, w2 = _dense(weights)
    expected = dense_moe_f64(x, w13, w2, tw, ids, config=config)
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[torch.float32] * 10
    torch.testing.assert_close(out[1], torch.zeros(64), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        (
            torch.tensor([[0, 4], [1, 2]]),
            ShapeError,
            r"topk_ids must be -1 or local expert ids in \[0, 4\), got values in \[0, 4\]",
        ),
        (
            torch.tensor([[0, -2], [1, 2]]),
            ShapeError,
            r"got values in \[-2, 2\]",
        ),
        (
            torch.tensor([[0.0, 1.0], [1.0, 2.0]]),
            DTypeError,
            r"topk_ids must be int32 or int64, got dtype torch\.float32",
        ),
    ],
)
def test_reference_refuses_ids_it_cannot_hold(
    ids: torch.Tensor, error: type[Exception], message: str, generator: torch.Generator
) -> None:
    """Global ids handed to one rank's weights, or float ids, raise (they gave zeros)."""
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    weights = _weights(4, 32, 64, INT4_SYM_G32, generator, dtype=torch.float32)
    routing = Routing(topk_weights=torch.rand(2, 2, generator=generator), topk_ids=ids)
    x = torch.randn(2, 64, generator=generator)
    with pytest.raises(error, match=message):
        moe_forward_reference(x, weights, routing, config)
    with pytest.raises(error, match=message):
        moe_backward_reference(x, weights, routing, config, torch.ones_like(x))


@pytest.mark.parametrize(
    ("x_shape", "ids_shape", "message"),
    [
        (
            (3, 64),
            (5, 2),
            r"routing\.topk_ids must have shape \(T=3, K\) like hidden_TD \(3, 64\), "
            r"got \(5, 2\)$",
        ),
        (
            (5, 64),
            (3, 2),
            r"routing\.topk_ids must have shape \(T=5, K\) like hidden_TD \(5, 64\), "
            r"got \(3, 2\)$",
        ),
        (
            (5, 48),
            (5, 2),
            r"hidden_TD must have shape \(T, D=64\) like the weights' hidden size, "
            r"got \(5, 48\)$",
        ),
        (
            (5, 128),
            (5, 2),
            r"hidden_TD must have shape \(T, D=64\) .* got \(5, 128\)$",
        ),
        ((1, 5, 64), (5, 2), r"hidden_TD must have shape .* got \(1, 5, 64\)$"),
        ((64,), (5, 2), r"hidden_TD must have shape .* got \(64,\)$"),
    ],
    ids=["fewer-hidden-rows", "fewer-routed-tokens", "D-short", "D-long", "3-D", "1-D"],
)
def test_reference_refuses_inputs_of_other_shapes(
    x_shape: tuple[int, ...],
    ids_shape: tuple[int, ...],
    message: str,
    generator: torch.Generator,
) -> None:
    """Before any work (raw IndexError / matmul RuntimeError before)."""
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    weights = _weights(4, 32, 64, INT4_SYM_G32, generator, dtype=torch.float32)
    ids = torch.randint(0, 4, ids_shape, generator=generator)
    routing = Routing(
        topk_weights=torch.rand(ids_shape, generator=generator), topk_ids=ids
    )
    x = torch.randn(x_shape, generator=generator)
    with pytest.raises(ShapeError, match=message):
        moe_forward_reference(x, weights, routing, config)
    with pytest.raises(ShapeError, match=message):
        moe_backward_reference(x, weights, routing, config, torch.ones_like(x))


def test_reference_refuses_topk_weights_and_grad_of_other_shapes(
    generator: torch.Generator,
) -> None:
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    weights = _weights(4, 32, 64, INT4_SYM_G32, generator, dtype=torch.float32)
    ids = torch.randint(0, 4, (5, 2), generator=generator)
    x = torch.randn(5, 64, generator=generator)
    short = Routing(topk_weights=torch.rand(5, 1, generator=generator), topk_ids=ids)
    message = r"routing\.topk_weights must have shape \(5, 2\), got \(5, 1\)$"
    with pytest.raises(ShapeError, match=message):
        moe_forward_reference(x, weights, short, config)
    with pytest.raises(ShapeError, match=message):
        moe_backward_reference(x, weights, short, config, torch.ones_like(x))
    routing = Routing(topk_weights=torch.rand(5, 2, generator=generator), topk_ids=ids)
    with pytest.raises(
        ShapeError, match=r"grad_TD must have shape \(5, 64\), got \(3, 64\)$"
    ):
        moe_backward_reference(x, weights, routing, config, torch.ones(3, 64))


def test_reference_expert_biases(generator: torch.Generator) -> None:
    config = MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=64,
        intermediate_size=64,
        activation="swigluoai",
        swiglu_limit=1.0,  # so the clamp bites with the biases added
        expert_bias=True,
    )
    weights = attrs.evolve(
        _weights(8, 64, 64, INT4_ASYM_G32, generator, dtype=torch.float32),
        w13_bias=torch.randn(8, 128, generator=generator),
        w2_bias=torch.randn(8, 64, generator=generator),
    )
    x = torch.randn(9, 64, generator=generator)
    routing = route_topk(torch.randn(9, 8, generator=generator), config)
    out = moe_forward_reference(x, weights, routing, config)
    w13, w2 = _dense(weights)
    _assert_swiglu_clamps_bite(x, w13, routing, config, weights.w13_bias)
    expected = dense_moe_f64(
        x,
        w13,
        w2,
        routing.topk_weights,
        routing.topk_ids,
        config=config,
        w13_bias=weights.w13_bias,
        w2_bias=weights.w2_bias,
    )
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[torch.float32]
    no_bias = moe_forward_reference(
        x, attrs.evolve(weights, w13_bias=None, w2_bias=None), routing, config
    )
    assert rel_l2(expected, no_bias) > 0.05  # the biases matter in this case


GRAD_CASES = {
    "silu": {},
    "swigluoai-biases": {
        "activation": "swigluoai", "swiglu_limit": 1.0, "expert_bias": True,
    },
    "gelu_tanh-weight-on-input": {"top_k": 1, "apply_router_weight_on_input": True},
}  # fmt: skip


@pytest.mark.parametrize("options", GRAD_CASES.values(), ids=GRAD_CASES.keys())
@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_backward_reference_matches_dense_float64_autograd(
    options: dict[str, Any], scheme: Int4Scheme, generator: torch.Generator
) -> None:
    """Gradients for the input and the router weights equal torch autograd through the
    independent float64 dense MoE; ids of -1 get none and give none."""
    base = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32)
    config = attrs.evolve(base, **options)
    weights = _weights(8, 32, 64, scheme, generator, dtype=torch.float32)
    if config.expert_bias:
        weights = attrs.evolve(
            weights,
            w13_bias=torch.randn(8, 64, generator=generator),
            w2_bias=torch.randn(8, 64, generator=generator),
        )
    x = torch.randn(7, 64, generator=generator)
    routing = route_topk(torch.randn(7, 8, generator=generator), config)
    ids = routing.topk_ids.clone()
    ids[2, 0] = -1  # a pair routed to an expert held elsewhere
    routing = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    grad = torch.randn(7, 64, generator=generator)
    grad_x, grad_w = moe_backward_reference(x, weights, routing, config, grad)
    assert grad_x.dtype == x.dtype
    assert grad_w.dtype == routing.topk_weights.dtype
    x64 = x.double().requires_grad_()
    w64 = routing.topk_weights.double().requires_grad_()
    w13, w2 = _dense(weights)
    out = dense_moe_f64(
        x64, w13, w2, w64, ids, config=config, w13_bias=weights.w13_bias,
        w2_bias=weights.w2_bias,
    )  # fmt: skip
    expected_x, expected_w = torch.autograd.grad(out, (x64, w64), grad.double())
    assert rel_l2(expected_x, grad_x) < REL_L2_VS_ORACLE[torch.float32]
    assert rel_l2(expected_w, grad_w) < REL_L2_VS_ORACLE[torch.float32]
    assert float(grad_w[2, 0]) == 0.0
    assert float(grad_x.norm()) > 0
    assert float(grad_w.norm()) > 0


def test_backward_reference_leaves_its_inputs_alone(generator: torch.Generator) -> None:
    """Pure: no gradient recorded on the inputs, none of them changed."""
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    weights = _weights(4, 32, 64, INT4_SYM_G32, generator, dtype=torch.bfloat16)
    x = torch.randn(3, 64, generator=generator).to(torch.bfloat16).requires_grad_()
    routing = route_topk(torch.randn(3, 4, generator=generator), config)
    before = (x.detach().clone(), routing.topk_weights.clone())
    grad_x, grad_w = moe_backward_reference(
        x, weights, routing, config, torch.ones(3, 64, dtype=torch.bfloat16)
    )
    assert x.grad is None
    assert grad_x.dtype == torch.bfloat16
    assert not grad_x.requires_grad
    assert not grad_w.requires_grad
    torch.testing.assert_close(x.detach(), before[0], rtol=0, atol=0)
    torch.testing.assert_close(routing.topk_weights, before[1], rtol=0, atol=0)


def test_backward_reference_router_gradient_in_the_weights_dtype(
    generator: torch.Generator,
) -> None:
    """grad_topk_weights comes back in the dtype of routing.topk_weights (bf16 here)."""
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    q = quantize_expert_weights(
        torch.randn(4, 64, 64, generator=generator) / 8,
        torch.randn(4, 64, 32, generator=generator) / 32**0.5,
        INT4_SYM_G32,
        scale_dtype=torch.float32,
    )
    x = torch.randn(5, 64, generator=generator)
    base = route_topk(torch.randn(5, 4, generator=generator), config)
    routing = Routing(
        topk_weights=base.topk_weights.to(torch.bfloat16), topk_ids=base.topk_ids
    )
    grad = torch.randn(5, 64, generator=generator)
    _, grad_w = moe_backward_reference(x, q, routing, config, grad)
    assert grad_w.dtype == torch.bfloat16
    w64 = routing.topk_weights.double().requires_grad_()
    out = dense_moe_f64(
        x,
        dequant_f64(q.w13_qdata, q.w13_scale, q.w13_zero_point),
        dequant_f64(q.w2_qdata, q.w2_scale, q.w2_zero_point),
        w64,
        routing.topk_ids,
        config=config,
    )
    (expected,) = torch.autograd.grad(out, w64, grad.double())
    assert rel_l2(expected, grad_w) < REL_L2_VS_ORACLE[torch.bfloat16]


def test_reference_refuses_integer_activations(generator: torch.Generator) -> None:
    """They would be truncated on the way out (an int64 output came back before)."""
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    weights = _weights(4, 32, 64, INT4_SYM_G32, generator, dtype=torch.float32)
    ids = torch.randint(0, 4, (3, 2), generator=generator)
    routing = Routing(topk_weights=torch.rand(3, 2, generator=generator), topk_ids=ids)
    x = torch.randint(-3, 3, (3, 64), generator=generator)
    with pytest.raises(DTypeError, match="hidden_TD must have a floating dtype, got"):
        moe_forward_reference(x, weights, routing, config)
    with pytest.raises(DTypeError, match="hidden_TD must have a floating dtype, got"):
        moe_backward_reference(x, weights, routing, config, torch.ones(3, 64))


def test_activation_refuses_an_odd_last_dim() -> None:
    from core.activation import apply_activation

    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)
    assert apply_activation(torch.randn(3, 8), config).shape == (3, 4)
    with pytest.raises(ShapeError, match=r"h_NH must have an even last dim.*\(3, 7\)"):
        apply_activation(torch.randn(3, 7), config)
