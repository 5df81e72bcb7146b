"""An independent float64 MoE: dense over all experts, written apart from core.

Used as the outside reference for ``moe_forward_reference`` and the module. It shares
no code with ``core`` (its own unpacking, dequantization and activations).
"""

import math

import torch

from core.config import MoEConfig


def unpack_f64(qdata: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., K/2)`` to float64 codes ``(..., K)``: low nibble first."""
    codes = torch.empty(*qdata.shape[:-1], qdata.shape[-1] * 2, dtype=torch.float64)
    as_int = qdata.to(torch.int64)
    codes[..., 0::2] = (as_int % 16).double()
    codes[..., 1::2] = (as_int // 16).double()
    return codes


def dequant_f64(
    qdata: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None
) -> torch.Tensor:
    """float64 ``(q - z) * scale`` with ``z = 8`` when no zero point is stored."""
    codes = unpack_f64(qdata)
    group = codes.shape[-1] // scale.shape[-1]
    s = scale.double().repeat_interleave(group, dim=-1)
    z = (
        8.0
        if zero_point is None
        else zero_point.double().repeat_interleave(group, dim=-1)
    )
    return (codes - z) * s


def _act(gate: torch.Tensor, up: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    if config.activation == "silu":
        return gate / (1 + torch.exp(-gate)) * up
    if config.activation == "gelu":
        return 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2))) * up
    if config.activation == "gelu_tanh":
        inner = math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)
        return 0.5 * gate * (1 + torch.tanh(inner)) * up
    lim, alpha = config.swiglu_limit, config.swiglu_alpha
    g = torch.minimum(gate, torch.tensor(lim, dtype=gate.dtype))
    u = up.clamp(-lim, lim)
    return (u + 1) * g / (1 + torch.exp(-alpha * g))


def dense_moe_f64(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    config: MoEConfig,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every token through every expert in float64, then masked by the routing.

    Differentiable in ``x`` and ``topk_weights`` (torch autograd): the independent
    reference of the layer's gradients too.

    Args:
        x: ``(T, D)``; w13 ``(E, 2F, D)``; w2 ``(E, D, F)``, all converted to float64.
        topk_weights, topk_ids: ``(T, K)``; ids of ``-1`` contribute nothing.
        w13_bias, w2_bias: optional ``(E, 2F)`` and ``(E, D)`` expert biases.
    """
    x64 = x.double()
    f = w13.shape[1] // 2
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    # combine[t, e]: token t's router weight on expert e (differentiable in the weights)
    valid = topk_ids >= 0
    combine = torch.zeros(x.shape[0], w13.shape[0], dtype=torch.float64).scatter_add(
        1, topk_ids.long().clamp(min=0), topk_weights.double() * valid
    )
    for e in range(w13.shape[0]):
        if not bool((combine[:, e] != 0).any()):
            continue
        scale_in = combine[:, e : e + 1] if config.apply_router_weight_on_input else 1.0
        h = (x64 * scale_in) @ w13[e].double().T
        if w13_bias is not None:
            h = h + w13_bias[e].double()
        y = _act(h[:, :f], h[:, f:], config) @ w2[e].double().T
        if w2_bias is not None:
            y = y + w2_bias[e].double()
        if config.apply_router_weight_on_input:
            out += y * (combine[:, e : e + 1] != 0)
        else:
            out += y * combine[:, e : e + 1]
    return out
