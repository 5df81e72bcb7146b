"""Expert weights in other memory layouts, for the backends' layout tests."""

import attrs
import torch

from core.weights import QuantizedExpertWeights


def strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values with a non-contiguous last dimension (a transposed copy's view)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def strided_weights(weights: QuantizedExpertWeights) -> QuantizedExpertWeights:
    """``weights`` with every code, scale and zero-point tensor a ``strided`` view."""
    w13_zero, w2_zero = weights.w13_zero_point, weights.w2_zero_point
    return attrs.evolve(
        weights,
        w13_qdata=strided(weights.w13_qdata),
        w13_scale=strided(weights.w13_scale),
        w2_qdata=strided(weights.w2_qdata),
        w2_scale=strided(weights.w2_scale),
        w13_zero_point=None if w13_zero is None else strided(w13_zero),
        w2_zero_point=None if w2_zero is None else strided(w2_zero),
    )
