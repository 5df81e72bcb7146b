"""The float32 oracle and its gradient, one dequantized expert at a time. Pure.

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``H`` = 2F, ``E`` experts,
``K`` top_k, ``N`` = T*K routed pairs. Imports only torch and core.
"""

import torch

from core.activation import apply_activation
from core.config import MoEConfig
from core.errors import DTypeError, ShapeError
from core.quantize import dequantize_expert
from core.routing import Routing, sort_tokens_by_expert
from core.validate import check_local_ids, check_shape
from core.weights import QuantizedExpertWeights


def moe_forward_reference(
    hidden_TD: torch.Tensor,
    weights: QuantizedExpertWeights,
    routing: Routing,
    config: MoEConfig,
) -> torch.Tensor:
    """Float32 MoE forward on the dequantized int4 weights.

    Only experts that received tokens are dequantized, one at a time, so peak memory
    is one expert in float32 beyond the int4 weights.

    Args:
        hidden_TD: ``(T, D)`` activations.
        weights: canonical int4 experts (``E`` local experts).
        routing: ``(T, K)`` weights and local ids (``-1`` contributes zero).
        config: activation and ``apply_router_weight_on_input``.

    Returns:
        ``(T, D)`` in the dtype of ``hidden_TD``.

    Raises:
        DTypeError / ShapeError: for ids that are not integers in ``[-1, E)``.
        ShapeError: when ``hidden_TD`` is not ``(T, D)`` with the weights' ``D`` and
            the routing's ``T``, or ``routing.topk_weights`` not ``(T, K)``.
        DTypeError: when ``hidden_TD`` is not floating.
    """
    _check_shapes(hidden_TD, weights, routing)
    t, k = routing.topk_ids.shape
    out_TD = torch.zeros(
        t, hidden_TD.shape[1], dtype=torch.float32, device=hidden_TD.device
    )
    weights_N = routing.topk_weights.flatten().float()
    x_TD = hidden_TD.float()
    for expert, pairs in _routed_pairs(routing, weights.num_experts):
        tokens = pairs // k
        y_ND = _expert_forward(x_TD[tokens], weights_N[pairs], weights, expert, config)
        out_TD.index_add_(0, tokens, y_ND)
    return out_TD.to(hidden_TD.dtype)


def moe_backward_reference(
    hidden_TD: torch.Tensor,
    weights: QuantizedExpertWeights,
    routing: Routing,
    config: MoEConfig,
    grad_TD: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``moe_forward_reference``'s output, in float32, one expert at a time.

    The int4 weights are constants; what has a gradient is the input and the router
    weights. Each expert that received tokens is dequantized, its part of the forward
    recomputed and differentiated, then freed, so peak memory is one expert in float32
    and its pairs' activations (autograd over ``moe_forward_reference`` itself would
    keep every routed expert's float32 weights alive until the backward pass).

    Args:
        hidden_TD: ``(T, D)`` activations of the forward.
        weights: canonical int4 experts (``E`` local experts).
        routing: ``(T, K)`` weights and local ids of the forward (``-1``: no gradient).
        config: activation and ``apply_router_weight_on_input``.
        grad_TD: ``(T, D)`` gradient of the loss with respect to the output.

    Returns:
        ``(grad_hidden_TD, grad_topk_weights_TK)`` in the dtypes of ``hidden_TD`` and
        ``routing.topk_weights``.

    Raises:
        ShapeError: as :func:`moe_forward_reference`, or when ``grad_TD`` does not
            have the shape of ``hidden_TD``.
    """
    _check_shapes(hidden_TD, weights, routing)
    check_shape("grad_TD", grad_TD, tuple(hidden_TD.shape))
    t, k = routing.topk_ids.shape
    grad_x_TD = torch.zeros(
        t, hidden_TD.shape[1], dtype=torch.float32, device=hidden_TD.device
    )
    grad_w_N = torch.zeros(t * k, dtype=torch.float32, device=hidden_TD.device)
    weights_N = routing.topk_weights.detach().flatten().float()
    x_TD = hidden_TD.detach().float()
    g_TD = grad_TD.float()
    for expert, pairs in _routed_pairs(routing, weights.num_experts):
        tokens = pairs // k
        with torch.enable_grad():
            x_ND = x_TD[tokens].requires_grad_()
            w_N = weights_N[pairs].requires_grad_()
            y_ND = _expert_forward(x_ND, w_N, weights, expert, config)
            gx_ND, gw_N = torch.autograd.grad(y_ND, (x_ND, w_N), g_TD[tokens])
        grad_x_TD.index_add_(0, tokens, gx_ND)
        grad_w_N[pairs] = gw_N
    grad_w_TK = grad_w_N.view(t, k).to(routing.topk_weights.dtype)
    return grad_x_TD.to(hidden_TD.dtype), grad_w_TK


def _check_shapes(
    hidden_TD: torch.Tensor, weights: QuantizedExpertWeights, routing: Routing
) -> None:
    """Shapes and dtype, before any work.

    The oracle is also called with hand-made inputs (integer activations would be
    truncated on the way out).
    """
    if not hidden_TD.dtype.is_floating_point:
        raise DTypeError(
            f"hidden_TD must have a floating dtype, got dtype {hidden_TD.dtype}"
        )
    d = weights.hidden_size
    if hidden_TD.ndim != 2 or hidden_TD.shape[1] != d:
        raise ShapeError(
            f"hidden_TD must have shape (T, D={d}) like the weights' hidden size, "
            f"got {tuple(hidden_TD.shape)}"
        )
    t, ids = int(hidden_TD.shape[0]), routing.topk_ids
    if ids.ndim != 2 or ids.shape[0] != t:
        raise ShapeError(
            f"routing.topk_ids must have shape (T={t}, K) like hidden_TD "
            f"{tuple(hidden_TD.shape)}, got {tuple(ids.shape)}"
        )
    check_shape("routing.topk_weights", routing.topk_weights, tuple(ids.shape))


def _routed_pairs(routing: Routing, num_experts: int) -> list[tuple[int, torch.Tensor]]:
    """``(expert, pairs)`` for each expert that received pairs, ``pairs`` flat ids.

    Raises:
        DTypeError / ShapeError: for ids that are not integers in ``[-1, E)``.
    """
    check_local_ids(routing.topk_ids, num_experts)
    order_N, counts_E = sort_tokens_by_expert(routing.topk_ids, num_experts)
    out: list[tuple[int, torch.Tensor]] = []
    start = 0
    for expert, count in enumerate(counts_E.tolist()):
        if count:
            out.append((expert, order_N[start : start + count]))
            start += count
    return out


def _expert_forward(
    x_ND: torch.Tensor,
    w_N: torch.Tensor,
    weights: QuantizedExpertWeights,
    expert: int,
    config: MoEConfig,
) -> torch.Tensor:
    """One expert on its ``N`` pairs in float32: ``(N, D)`` weighted outputs.

    ``x_ND`` the pairs' inputs, ``w_N`` their router weights (on the input with
    ``apply_router_weight_on_input``, else on the output).
    """
    w13_HD, w2_DF = dequantize_expert(weights, expert)
    if config.apply_router_weight_on_input:
        x_ND = x_ND * w_N[:, None]
    h_NH = x_ND @ w13_HD.T
    if weights.w13_bias is not None:
        h_NH = h_NH + weights.w13_bias[expert].float()
    y_ND = apply_activation(h_NH, config) @ w2_DF.T
    if weights.w2_bias is not None:
        y_ND = y_ND + weights.w2_bias[expert].float()
    if not config.apply_router_weight_on_input:
        y_ND = y_ND * w_N[:, None]
    return y_ND
