"""One case matrix run against every registered backend that supports the case.

Ids read like ``cpu-int4-int4_asym_g32-T7_D128_F128_E8_K2-bf16-silu``. A backend that
refuses a case is skipped with its own reason (STYLE.md: tests skip with that reason).
"""

import warnings
from typing import Any

import attrs
import pytest
import torch

from backends import BackendWarning, DeviceInfo, available_backends, create_backend
from core.config import Activation, MoEConfig
from core.layout import CANONICAL_LAYOUT
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import (
    INT4_ASYM_G32,
    INT4_ASYM_G128,
    INT4_SYM,
    INT4_SYM_G32,
    Int4Scheme,
)
from core.weights import QuantizedExpertWeights
from tests.tolerances import EXACT, REL_L2_VS_ORACLE, rel_l2

SCHEMES = [INT4_SYM_G32, INT4_ASYM_G32, INT4_SYM, INT4_ASYM_G128]
SHAPES = [  # (T, D, F, E, K)
    (7, 128, 128, 8, 2),
    (1, 256, 128, 4, 1),
    (33, 128, 256, 16, 4),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ACTIVATIONS: list[Activation] = ["silu", "gelu", "gelu_tanh", "swigluoai"]


def _shape_id(shape: tuple[int, int, int, int, int]) -> str:
    t, d, f, e, k = shape
    return f"T{t}_D{d}_F{f}_E{e}_K{k}"


def _with_biases(
    config: MoEConfig, gen: torch.Generator, weights: QuantizedExpertWeights
) -> QuantizedExpertWeights:
    """Attach random expert biases when the config asks for them (gpt-oss)."""
    if not config.expert_bias:
        return weights
    e, f, d = config.num_experts, config.intermediate_size, config.hidden_size
    return attrs.evolve(
        weights,
        w13_bias=torch.randn(e, 2 * f, generator=gen).to(weights.scale_dtype),
        w2_bias=torch.randn(e, d, generator=gen).to(weights.scale_dtype) * 0.1,
    )


def _run_case(
    backend_name: str,
    scheme: Int4Scheme,
    config: MoEConfig,
    tokens: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    drop_experts: bool = False,
) -> None:
    backend = create_backend(backend_name)
    support = backend.supports(
        config, scheme, CANONICAL_LAYOUT, DeviceInfo.of("cpu"), dtype=dtype
    )
    if not support.ok:
        pytest.skip(support.reason)
    e, f, d = config.num_experts, config.intermediate_size, config.hidden_size
    w13 = torch.randn(e, 2 * f, d, generator=gen) / d**0.5
    w2 = torch.randn(e, d, f, generator=gen) / f**0.5
    weights = _with_biases(
        config,
        gen,
        quantize_expert_weights(
            w13,
            w2,
            scheme,
            scale_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
        ),
    )
    before = {n: t.clone() for n, t in weights.tensors().items()}
    x = torch.randn(tokens, d, generator=gen).to(dtype)
    routing = route_topk(torch.randn(tokens, e, generator=gen), config)
    if drop_experts:  # expert parallelism: experts held elsewhere arrive as -1
        ids = torch.where(routing.topk_ids % 3 == 0, -1, routing.topk_ids)
        routing = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    with warnings.catch_warnings():
        # Documented trade-offs (triton-emulation's 16-bit memory) are not failures here;
        # each backend's own tests check that its warning is given.
        warnings.simplefilter("ignore", BackendWarning)
        prepared = backend.prepare(weights, config, dtype=dtype)
    out = backend.apply(x, prepared, routing)
    expected = moe_forward_reference(x, weights, routing, config)
    assert out.dtype == dtype
    assert out.shape == (tokens, d)
    assert bool(torch.isfinite(out).all())
    assert rel_l2(expected.double(), out) < REL_L2_VS_ORACLE[dtype]
    for name, tensor in weights.tensors().items():
        torch.testing.assert_close(tensor, before[name], **EXACT)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("backend_name", available_backends())
def test_backend_matches_oracle(
    backend_name: str,
    scheme: Int4Scheme,
    shape: tuple[int, int, int, int, int],
    dtype: torch.dtype,
    generator: torch.Generator,
) -> None:
    t, d, f, e, k = shape
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    _run_case(backend_name, scheme, config, t, dtype, generator)


ROUTING = [
    {"activation": "gelu"},
    {"activation": "gelu_tanh"},
    {"activation": "swigluoai"},
    {"top_k": 1, "apply_router_weight_on_input": True},
    {"renormalize": False, "routed_scaling_factor": 2.0},
    {"activation": "swigluoai", "expert_bias": True},
]


@pytest.mark.parametrize(
    "options", ROUTING, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())
)
@pytest.mark.parametrize("backend_name", available_backends())
def test_backend_options(
    backend_name: str, options: dict[str, Any], generator: torch.Generator
) -> None:
    base = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=128)
    config = attrs.evolve(base, **options)
    _run_case(backend_name, INT4_SYM_G32, config, 9, torch.bfloat16, generator)


@pytest.mark.parametrize("backend_name", available_backends())
def test_backend_experts_held_elsewhere(
    backend_name: str, generator: torch.Generator
) -> None:
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=128)
    _run_case(
        backend_name,
        INT4_ASYM_G32,
        config,
        9,
        torch.float16,
        generator,
        drop_experts=True,
    )
