"""Gated activations applied to the w13 output. Pure functions.

Shape legend: ``N`` rows (routed pairs), ``H`` = 2F (gate rows then up rows), ``F``.
Imports only torch and core.
"""

import torch
import torch.nn.functional as F

from core.config import MoEConfig
from core.errors import ShapeError


def apply_activation(h_NH: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """``act(gate) * up`` for the configured activation, in the input dtype.

    ``h_NH[:, :F]`` is the gate half and ``h_NH[:, F:]`` the up half. `swigluoai`
    (gpt-oss) clamps gate to ``<= limit`` and up to ``[-limit, limit]``, then returns
    ``(up + 1) * gate * sigmoid(alpha * gate)``.

    Raises:
        ShapeError: when the last dimension is not even (two halves).
    """
    if h_NH.ndim == 0 or h_NH.shape[-1] % 2:
        raise ShapeError(
            "h_NH must have an even last dim (gate half, then up half), got shape "
            f"{tuple(h_NH.shape)}"
        )
    half = h_NH.shape[-1] // 2
    gate, up = h_NH[..., :half], h_NH[..., half:]
    if config.activation == "silu":
        return F.silu(gate) * up
    if config.activation == "gelu":
        return F.gelu(gate) * up
    if config.activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    limit = config.swiglu_limit
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(config.swiglu_alpha * gate)
