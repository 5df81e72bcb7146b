"""The layer's backward pass: gradients for the input and the router weights.

The int4 expert weights are constants (buffers); what trains through the layer is the
input (adapters, layers before it) and the router (its logits reach the routed weights).
The fused kernels compute forward only, so ``run_experts`` wraps them in an autograd
function whose backward is ``core.moe_backward_reference``: the float32 gradient of the
reference math on the same int4 weights, one dequantized expert at a time. Shape
legend: ``T`` tokens, ``D`` hidden, ``K`` top_k.
"""

from typing import Any

import torch

from backends.base import MoEBackend, PreparedExperts
from core.config import MoEConfig
from core.errors import UnsupportedError
from core.reference import moe_backward_reference
from core.routing import Routing
from core.weights import QuantizedExpertWeights


def run_experts(
    backend: MoEBackend,
    prepared: PreparedExperts,
    hidden_TD: torch.Tensor,
    routing: Routing,
) -> torch.Tensor:
    """``backend.apply``, differentiable where autograd asks for a gradient.

    Where grad mode is on and ``hidden_TD`` or ``routing.topk_weights`` requires a
    gradient, the output carries ``_ExpertsFunction``'s backward, on every backend
    (the reference backend too: autograd through it would keep every routed expert's
    float32 weights until the backward). Elsewhere (inference, no grad mode) this is
    ``backend.apply`` alone.
    """
    if not wants_grad(hidden_TD, routing.topk_weights):
        return backend.apply(hidden_TD, prepared, routing)
    out: torch.Tensor = _ExpertsFunction.apply(  # type: ignore[no-untyped-call]  # torch leaves Function.apply unannotated
        hidden_TD, routing.topk_weights, routing.topk_ids, backend, prepared
    )
    return out


def wants_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record the layer: grad mode on, an input requiring it."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors
    )


class _ExpertsFunction(torch.autograd.Function):
    """Forward: the backend's kernels. Backward: ``moe_backward_reference``."""

    @staticmethod
    def forward(  # positional: Function.apply passes its arguments so
        ctx: Any,
        hidden_TD: torch.Tensor,
        topk_weights_TK: torch.Tensor,
        topk_ids_TK: torch.Tensor,
        backend: MoEBackend,
        prepared: PreparedExperts,
    ) -> torch.Tensor:
        ctx.save_for_backward(hidden_TD, topk_weights_TK, topk_ids_TK)
        ctx.weights = prepared.weights  # canonical int4, shared with the module
        ctx.config = prepared.config
        routing = Routing(topk_weights=topk_weights_TK, topk_ids=topk_ids_TK)
        return backend.apply(hidden_TD, prepared, routing)

    @staticmethod
    def backward(ctx: Any, grad_TD: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden_TD, topk_weights_TK, topk_ids_TK = ctx.saved_tensors
        weights: QuantizedExpertWeights = ctx.weights
        config: MoEConfig = ctx.config
        routing = Routing(topk_weights=topk_weights_TK, topk_ids=topk_ids_TK)
        with torch.no_grad():
            grad_x_TD, grad_w_TK = moe_backward_reference(
                hidden_TD, weights, routing, config, grad_TD
            )
        if torch.is_grad_enabled():  # create_graph=True
            grad_x_TD, grad_w_TK = _NoSecondDerivative.apply_to(
                (grad_x_TD, grad_w_TK), hidden_TD, topk_weights_TK, grad_TD
            )
        need_x, need_w = ctx.needs_input_grad[:2]
        return (
            grad_x_TD if need_x else None,
            grad_w_TK if need_w else None,
            None,
            None,
            None,
        )


class _NoSecondDerivative(torch.autograd.Function):
    """The layer's gradients under ``create_graph=True``: differentiating them raises.

    The backward is not differentiable (reference math under ``no_grad``). Without
    this, a second derivative would silently lack the layer's terms; with it, the
    first derivative works and a second one through the layer raises. The layer's
    inputs and the incoming gradient are inputs here too, so that the gradients stay
    connected to them (a loss whose gradient at the layer's output depends on a
    parameter after the layer, differentiated twice, reaches this backward too).
    """

    @staticmethod
    def forward(
        ctx: Any,
        grad_x_TD: torch.Tensor,
        grad_w_TK: torch.Tensor,
        *inputs: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        del ctx, inputs
        return grad_x_TD.view_as(grad_x_TD), grad_w_TK.view_as(grad_w_TK)

    @staticmethod
    def apply_to(
        grads: tuple[torch.Tensor, torch.Tensor], *inputs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``grads``, as outputs of this function of ``grads`` and ``inputs``."""
        out: tuple[torch.Tensor, torch.Tensor] = _NoSecondDerivative.apply(
            *grads, *inputs
        )  # type: ignore[no-untyped-call]  # torch leaves Function.apply unannotated
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        del ctx, grads
        raise UnsupportedError(
            "Int4MoE has no second derivative: its backward (the reference math on "
            "int4 weights) is not differentiable; a double backward through the "
            "layer (create_graph=True, then a gradient of the gradient) is unsupported"
        )
