"""QuantizedExpertWeights: the container's own methods."""

import pytest
import torch

from core.quantize import quantize_expert_weights
from core.scheme import INT4_ASYM_G32
from core.weights import QuantizedExpertWeights


def test_from_tensors_inverts_tensors(generator: torch.Generator) -> None:
    w13 = torch.randn(2, 64, 64, generator=generator)
    w2 = torch.randn(2, 64, 32, generator=generator)
    weights = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    named = weights.tensors() | {"gate_weight": torch.zeros(2, 64)}  # others ignored
    back = QuantizedExpertWeights.from_tensors(named, INT4_ASYM_G32)
    assert back.scheme == INT4_ASYM_G32
    assert back.tensors().keys() == weights.tensors().keys()
    assert all(back.tensors()[k] is v for k, v in weights.tensors().items())
    with pytest.raises(KeyError, match="w2_scale must be given"):
        QuantizedExpertWeights.from_tensors(
            {k: v for k, v in named.items() if k != "w2_scale"}, INT4_ASYM_G32
        )
