"""The layer's backward pass (``modules/backward.py``) on the CPU backends, the Triton
ones in Triton's interpreter and xpu-fused on a CPU fake, against torch autograd
through the float64 dense MoE; and no autograd work where no gradient is asked for."""

import pytest
import torch

from core.errors import UnsupportedError
from core.reference import moe_backward_reference
from core.routing import Routing
from core.scheme import INT4_SYM_G32
from modules import Int4MoE
from modules.backward import run_experts
from tests.backends.fake_xpu_provider import FakeXpuKernels
from tests.backends.triton_interpreter_cases import INTERPRETER_ONLY
from tests.backends.xpu_cases import (
    D,
    T,
    fake_backend,
    make_config,
    make_routing,
    make_weights,
)
from tests.modules.backward_cases import CONFIG, check_gradients
from tests.tolerances import EXACT

CASES = [
    ("reference", torch.float32),
    ("reference", torch.bfloat16),
    ("cpu-int4", torch.bfloat16),  # torch's int4 kernel has no derivative of its own
    ("cpu-int4", torch.float32),
    pytest.param("triton-w4a16", torch.bfloat16, marks=INTERPRETER_ONLY),
    pytest.param("triton-w4a16", torch.float16, marks=INTERPRETER_ONLY),
    pytest.param("triton-emulation", torch.bfloat16, marks=INTERPRETER_ONLY),
]


@pytest.mark.parametrize(("backend", "dtype"), CASES, ids=lambda v: str(v))
def test_gradients_match_dense_float64(
    backend: str, dtype: torch.dtype, generator: torch.Generator
) -> None:
    check_gradients(backend, dtype, "cpu", generator)


def _layer(generator: torch.Generator) -> Int4MoE:
    e, d, f = CONFIG.num_experts, CONFIG.hidden_size, CONFIG.intermediate_size
    return Int4MoE.from_float(
        w13_weight=torch.randn(e, 2 * f, d, generator=generator),
        w2_weight=torch.randn(e, d, f, generator=generator),
        config=CONFIG,
    )


@pytest.mark.parametrize(
    "backend", ["cpu-int4", pytest.param("triton-w4a16", marks=INTERPRETER_ONLY)]
)
def test_no_graph_where_no_gradient_is_asked_for(
    backend: str, generator: torch.Generator
) -> None:
    """Inference records nothing: without grad mode, or with nothing requiring grad."""
    moe = _layer(generator)
    moe.backend = backend
    x = torch.randn(3, CONFIG.hidden_size, generator=generator).to(torch.bfloat16)
    logits = torch.randn(3, CONFIG.num_experts, generator=generator)
    assert moe(x, router_logits=logits).grad_fn is None
    with torch.no_grad():
        out = moe(x.requires_grad_(), router_logits=logits.requires_grad_())
    assert out.grad_fn is None
    with torch.inference_mode():
        assert moe(x, router_logits=logits).grad_fn is None


def test_gradient_reaches_the_router_weights_passed_in(
    generator: torch.Generator,
) -> None:
    """Routing computed elsewhere: ``topk_weights`` get their gradient, ids none."""
    moe = _layer(generator)
    x = torch.randn(4, CONFIG.hidden_size, generator=generator).to(torch.bfloat16)
    weights = torch.rand(4, 2, generator=generator).requires_grad_()
    ids = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0]])
    torch.autograd.backward(moe(x, topk_weights=weights, topk_ids=ids).float().sum())
    assert weights.grad is not None
    assert bool((weights.grad != 0).all())


def test_run_experts_on_a_backend_with_private_weights(
    generator: torch.Generator,
) -> None:
    """xpu-fused (a CPU fake of vllm-xpu-kernels) rewrites private copies of the
    weights: the backward reads the canonical ones (``prepared.weights``), and its
    gradients equal those of the reference backward on the same inputs."""
    config = make_config()
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    backend = fake_backend(FakeXpuKernels())
    prepared = backend.prepare(weights, config, dtype=torch.bfloat16)
    x = torch.randn(T, D, generator=generator).to(torch.bfloat16).requires_grad_()
    routing = make_routing(generator)
    w = routing.topk_weights.clone().requires_grad_()
    out = run_experts(
        backend, prepared, x, Routing(topk_weights=w, topk_ids=routing.topk_ids)
    )
    grad = torch.randn(T, D, generator=generator).to(torch.bfloat16)
    torch.autograd.backward(out, grad)
    expected_x, expected_w = moe_backward_reference(x, weights, routing, config, grad)
    assert x.grad is not None
    assert w.grad is not None
    torch.testing.assert_close(x.grad, expected_x, **EXACT)
    torch.testing.assert_close(w.grad, expected_w, **EXACT)


def test_a_second_derivative_raises(generator: torch.Generator) -> None:
    """The backward is not itself differentiable: asking for that raises, rather than
    returning a first derivative that silently has no graph."""
    moe = _layer(generator)
    x = torch.randn(3, CONFIG.hidden_size, generator=generator).requires_grad_()
    logits = torch.randn(3, CONFIG.num_experts, generator=generator)
    out = moe(x, router_logits=logits)
    (grad_x,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(UnsupportedError, match="Int4MoE has no second derivative"):
        torch.autograd.grad(grad_x.sum(), x)


def test_a_second_derivative_through_the_incoming_gradient_raises(
    generator: torch.Generator,
) -> None:
    """A parameter after the layer scales its output: the gradient at the input then
    depends on it through the layer's backward, and differentiating that raises (it
    silently left the layer's term out before)."""
    moe = _layer(generator)
    x = torch.randn(3, CONFIG.hidden_size, generator=generator).requires_grad_()
    s = torch.randn(CONFIG.hidden_size, generator=generator).requires_grad_()
    logits = torch.randn(3, CONFIG.num_experts, generator=generator)
    loss = ((x + moe(x, router_logits=logits)) * s).sum()
    (grad_x,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(UnsupportedError, match="Int4MoE has no second derivative"):
        torch.autograd.grad(grad_x.sum(), s)


@pytest.mark.parametrize(
    "backend", ["cpu-int4", pytest.param("triton-w4a16", marks=INTERPRETER_ONLY)]
)
def test_zero_tokens_keep_the_graph(backend: str, generator: torch.Generator) -> None:
    """An empty batch is still part of the graph, as in ``nn.Linear``: its backward
    runs and gives empty input gradients and a zero router gradient."""
    e, d, f = CONFIG.num_experts, CONFIG.hidden_size, CONFIG.intermediate_size
    moe = Int4MoE.from_float(
        w13_weight=torch.randn(e, 2 * f, d, generator=generator),
        w2_weight=torch.randn(e, d, f, generator=generator),
        config=CONFIG,
        gate_weight=torch.randn(e, d, generator=generator),
        backend=backend,
    )
    gate = moe.gate_weight
    assert gate is not None
    gate.requires_grad_()
    x = torch.randn(2, 0, d, generator=generator).to(torch.bfloat16).requires_grad_()
    out = moe(x)
    assert out.shape == x.shape
    assert out.grad_fn is not None
    torch.autograd.backward(out.float().sum())
    assert x.grad is not None
    assert x.grad.shape == x.shape
    assert gate.grad is not None
    torch.testing.assert_close(gate.grad, torch.zeros_like(gate), **EXACT)
