"""The float32 oracle: dequantize one expert at a time, then matmul. Pure.

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``H`` = 2F, ``E`` experts,
``K`` top_k, ``N`` = T*K routed pairs. Imports only torch and core.
"""

import torch

from core.activation import apply_activation
from core.config import MoEConfig
from core.quantize import dequantize_expert
from core.routing import Routing, sort_tokens_by_expert
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
    """
    t, k = routing.topk_ids.shape
    out_TD = torch.zeros(
        t, hidden_TD.shape[1], dtype=torch.float32, device=hidden_TD.device
    )
    order_N, counts_E = sort_tokens_by_expert(routing.topk_ids, weights.num_experts)
    weights_N = routing.topk_weights.flatten().float()
    x_TD = hidden_TD.float()
    start = 0
    for expert, count in enumerate(counts_E.tolist()):
        if count == 0:
            continue
        pairs = order_N[start : start + count]
        start += count
        tokens = pairs // k
        w13_HD, w2_DF = dequantize_expert(weights, expert)
        x_ND = x_TD[tokens]
        if config.apply_router_weight_on_input:
            x_ND = x_ND * weights_N[pairs, None]
        h_NH = x_ND @ w13_HD.T
        if weights.w13_bias is not None:
            h_NH = h_NH + weights.w13_bias[expert].float()
        y_ND = apply_activation(h_NH, config) @ w2_DF.T
        if weights.w2_bias is not None:
            y_ND = y_ND + weights.w2_bias[expert].float()
        if not config.apply_router_weight_on_input:
            y_ND = y_ND * weights_N[pairs, None]
        out_TD.index_add_(0, tokens, y_ND)
    return out_TD.to(hidden_TD.dtype)
