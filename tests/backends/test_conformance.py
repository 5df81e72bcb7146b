"""One case matrix run against every registered backend, vs the float64 dense MoE.

Ids read like ``cpu-int4-int4_asym_g32-T7_D128_F128_E8_K2-bf16-silu``. Every backend,
``reference`` included, is compared with ``tests.dense.dense_moe_f64`` on the
dequantized weights (written apart from ``core``), never with ``moe_forward_reference``,
so the reference rows check the oracle instead of comparing it with itself.
``CPU_REFUSALS`` records which cases each backend must refuse on CPU: an expected
refusal is skipped with the backend's own reason (STYLE.md), any other refusal fails.
"""

import os
import re
import warnings
from typing import Any, Final

import attrs
import pytest
import torch

from backends import BackendWarning, DeviceInfo, available_backends, create_backend
from core.config import Activation, MoEConfig
from core.layout import CANONICAL_LAYOUT
from core.quantize import quantize_expert_weights
from core.routing import Routing, route_topk
from core.scheme import (
    INT4_ASYM_G32,
    INT4_ASYM_G128,
    INT4_SYM,
    INT4_SYM_G32,
    Int4Scheme,
)
from core.weights import QuantizedExpertWeights
from tests.dense import dense_moe_f64, dequant_f64
from tests.tolerances import EXACT, REL_L2_VS_ORACLE, rel_l2

SCHEMES = [INT4_SYM_G32, INT4_ASYM_G32, INT4_SYM, INT4_ASYM_G128]
SHAPES = [  # (T, D, F, E, K)
    (7, 128, 128, 8, 2),
    (1, 256, 128, 4, 1),
    (33, 128, 256, 16, 4),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ACTIVATIONS: list[Activation] = ["silu", "gelu", "gelu_tanh", "swigluoai"]

# conftest.py turns the interpreter on wherever no CUDA device exists; with CUDA the
# Triton backends compile for the GPU and refuse a CPU device.
_TRITON_ON_CPU: Final = os.environ.get("TRITON_INTERPRET") == "1"
_TRITON_REFUSALS: Final[dict[torch.dtype, str]] = (
    {} if _TRITON_ON_CPU else dict.fromkeys(DTYPES, r"device must be `cuda` or `xpu`")
)
CPU_REFUSALS: Final[dict[str, dict[torch.dtype, str]]] = {
    "reference": {},  # every scheme, dtype and option on any device
    "cpu-int4": {},  # every scheme of SCHEMES fits the kernel at every shape of SHAPES
    "triton-w4a16": _TRITON_REFUSALS,
    "triton-emulation": _TRITON_REFUSALS,
    "xpu-fused": dict.fromkeys(DTYPES, r"device must be `xpu`, got `cpu`"),
}
"""Backend -> {dtype: pattern of the refusal it must give on CPU} for every case here.

No backend may refuse a scheme of ``SCHEMES``, a shape of ``SHAPES`` or an option of
``ROUTING``: a dtype missing from a backend's entry must run, whatever the case."""

COMPUTES_IN: Final[dict[str, dict[torch.dtype, torch.dtype]]] = {
    "cpu-int4": dict.fromkeys(DTYPES, torch.bfloat16),  # cpu_int4.KERNEL_DTYPE
    "triton-w4a16": {torch.float32: torch.bfloat16},  # triton.compute_dtype
    "triton-emulation": {torch.float32: torch.bfloat16},
}
"""Backend -> {input dtype: the dtype its GEMMs run in}, where the two differ: the
error bound (``REL_L2_VS_ORACLE``) is that of the dtype the math runs in."""


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


def _dense_f64(
    x: torch.Tensor,
    weights: QuantizedExpertWeights,
    routing: Routing,
    config: MoEConfig,
) -> torch.Tensor:
    """The float64 dense MoE on ``weights`` dequantized in float64 (``tests/dense.py``)."""
    w = weights
    return dense_moe_f64(
        x,
        dequant_f64(w.w13_qdata, w.w13_scale, w.w13_zero_point),
        dequant_f64(w.w2_qdata, w.w2_scale, w.w2_zero_point),
        routing.topk_weights,
        routing.topk_ids,
        config=config,
        w13_bias=w.w13_bias,
        w2_bias=w.w2_bias,
    )


def _run_case(
    backend_name: str,
    scheme: Int4Scheme,
    config: MoEConfig,
    tokens: int,
    dtype: torch.dtype,
    *,
    gen: torch.Generator,
    drop_experts: bool = False,
) -> None:
    backend = create_backend(backend_name)
    support = backend.supports(
        config, scheme, CANONICAL_LAYOUT, DeviceInfo.of("cpu"), dtype=dtype
    )
    refusal = CPU_REFUSALS[backend_name].get(dtype)
    if refusal is not None:
        assert not support.ok, f"{backend_name} now runs {dtype}: update CPU_REFUSALS"
        assert re.search(refusal, support.reason), support.reason
        pytest.skip(support.reason)
    assert support.ok, f"{backend_name} must run this case: {support.reason}"
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
    expected = _dense_f64(x, weights, routing, config)
    assert out.dtype == dtype
    assert out.shape == (tokens, d)
    assert bool(torch.isfinite(out).all())
    computes_in = COMPUTES_IN.get(backend_name, {}).get(dtype, dtype)
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[computes_in]
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
    _run_case(backend_name, scheme, config, t, dtype, gen=generator)


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
    _run_case(backend_name, INT4_SYM_G32, config, 9, torch.bfloat16, gen=generator)


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
        gen=generator,
        drop_experts=True,
    )


def test_refusal_table_names_every_registered_backend() -> None:
    """A new backend gets an explicit row: what it must run on CPU is written down."""
    assert set(CPU_REFUSALS) == set(available_backends())
