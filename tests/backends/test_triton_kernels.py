"""The Triton kernels' shared activation (``_kernels._activate``), element by element.

Every path (GEMV, GEMM, the split w13's ``launch_activate``) calls this one function;
here it runs alone on gates from -30 to 30, in Triton's interpreter off CUDA and
compiled on a GPU, against float64 math.
"""

import math

import numpy as np
import pytest
import torch

from backends.triton._launch import ACTIVATION_CODE
from core.activation import apply_activation
from core.config import Activation, MoEConfig
from tests.backends.triton_kernel_harness import activate_kernel

_ALPHA, _LIMIT = 1.702, 7.0


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _activated(activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    assert gate.numel() <= 1024  # the harness kernel's one block
    out = torch.empty_like(gate)
    # exp overflowing to inf in the tails is the intended float32 result; the
    # interpreter's numpy would warn of it (an error under this suite's filters)
    with np.errstate(over="ignore"):
        activate_kernel[(1,)](
            gate, up, out, gate.numel(), _ALPHA, _LIMIT, ACT=ACTIVATION_CODE[activation]
        )
    return out


def _exact(activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """float64 ``act(gate) * up``, the tails without cancellation (erfc, sigmoid)."""
    g, u = gate.double(), up.double()
    if activation == "silu":
        return g * torch.sigmoid(g) * u
    if activation == "gelu":
        return 0.5 * g * torch.erfc(-g / math.sqrt(2)) * u
    if activation == "gelu_tanh":
        inner = math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)
        return g * torch.sigmoid(2 * inner) * u
    clamped = g.clamp(max=_LIMIT)
    return (u.clamp(-_LIMIT, _LIMIT) + 1) * clamped * torch.sigmoid(_ALPHA * clamped)


@pytest.mark.parametrize("activation", list(ACTIVATION_CODE))
def test_the_float64_forms_are_the_library_activations(activation: Activation) -> None:
    """``_exact`` (erfc, sigmoid) against ``core.apply_activation`` in float64, from
    -5 up: below that float64's own ``1 + tanh`` starts to cancel."""
    gate = torch.linspace(-5.0, 30.0, 701, dtype=torch.float64)
    up = torch.linspace(0.5, 2.0, 701, dtype=torch.float64)
    config = MoEConfig(
        num_experts=2, top_k=1, hidden_size=8, intermediate_size=701,
        activation=activation, swiglu_alpha=_ALPHA, swiglu_limit=_LIMIT,
    )  # fmt: skip
    library = apply_activation(torch.cat([gate, up]), config)
    torch.testing.assert_close(_exact(activation, gate, up), library, rtol=1e-9, atol=0)


@pytest.mark.parametrize("activation", list(ACTIVATION_CODE))
def test_activation_matches_float64_across_the_range(activation: str) -> None:
    """Within 1e-5 of each value, or 4 x float32's smallest normal where the value
    falls out of float32's range; gelu's ``1 + erf`` (torch's own formula too) also
    within float32's rounding of that 1, ``2e-7 |gate * up|``, which below about -3
    is more than the value itself."""
    gate = torch.linspace(-30.0, 30.0, 1001, device=_device())
    up = torch.linspace(0.5, 2.0, 1001, device=_device()).flip(0)
    got = _activated(activation, gate, up).double()
    want = _exact(activation, gate, up)
    cancels = 2e-7 * (gate * up).abs().double() if activation == "gelu" else 0.0
    tiny = 4 * torch.finfo(torch.float32).tiny
    excess = (got - want).abs() - 1e-5 * want.abs() - cancels - tiny
    assert float(excess.max()) <= 0.0, float(gate[excess.argmax()])


def test_gelu_tanh_tail_keeps_its_relative_precision() -> None:
    """``0.5 * (1 + tanh)`` lost the tail in float32 (30% off at -5, 0 from about
    -5.2 down); the sigmoid form keeps float32's relative precision."""
    gate = torch.tensor([-5.0, -5.5, -7.0, -9.0], device=_device())
    up = torch.ones_like(gate)
    got = _activated("gelu_tanh", gate, up).double()
    want = _exact("gelu_tanh", gate, up)
    assert bool((got < 0).all())
    assert float(((got - want) / want).abs().max()) < 1e-5


@pytest.mark.parametrize("activation", list(ACTIVATION_CODE))
def test_activation_keeps_nan(activation: str) -> None:
    nan = float("nan")
    gate = torch.tensor([nan, 1.0, nan, -2.0], device=_device())
    up = torch.tensor([1.0, nan, nan, 3.0], device=_device())
    got = _activated(activation, gate, up)
    assert got[:3].isnan().tolist() == [True, True, True]
    assert bool(torch.isfinite(got[3]))
