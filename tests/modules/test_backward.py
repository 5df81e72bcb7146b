"""The layer's backward pass (``modules/backward.py``) on the CPU backends, and the
Triton ones in Triton's interpreter, against torch autograd through the float64 dense
MoE; and no autograd work where no gradient is asked for."""

import pytest
import torch

from modules import Int4MoE
from tests.backends.triton_interpreter_cases import INTERPRETER_ONLY
from tests.modules.backward_cases import CONFIG, check_gradients

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
