"""Shared cases of the XPU fused backend tests: sizes, weights, routing, fake backend."""

import torch

from backends.base import DeviceInfo
from backends.xpu.vllm_kernels import VllmXpuKernelsProvider
from backends.xpu_fused import XPUFusedBackend
from core.config import MoEConfig
from core.quantize import quantize_expert_weights
from core.routing import Routing
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.backends.fake_xpu_provider import FakeXpuKernels
from tests.tolerances import EXACT

XPU = DeviceInfo(type="xpu", index=0, name="xpu")
T, D, F, E, K = 7, 64, 64, 4, 2


def make_config(**overrides: object) -> MoEConfig:
    fields: dict[str, object] = {
        "num_experts": E,
        "top_k": K,
        "hidden_size": D,
        "intermediate_size": F,
    }
    fields.update(overrides)
    return MoEConfig(**fields)  # type: ignore[arg-type]  # test-only keyword bag


def make_weights(
    generator: torch.Generator,
    scheme: Int4Scheme,
    *,
    scale_dtype: torch.dtype,
    d: int = D,
) -> QuantizedExpertWeights:
    w13 = torch.randn(E, 2 * F, d, generator=generator) * 0.1
    w2 = torch.randn(E, d, F, generator=generator) * 0.1
    return quantize_expert_weights(w13, w2, scheme, scale_dtype=scale_dtype)


def make_routing(generator: torch.Generator, *, top_k: int = K) -> Routing:
    ids = torch.stack(
        [torch.randperm(E, generator=generator)[:top_k] for _ in range(T)]
    )
    # Weights that do not sum to one: a kernel that renormalized would be caught.
    weights = torch.rand(T, top_k, generator=generator) * 0.8 + 0.1
    return Routing(topk_weights=weights, topk_ids=ids)


def snapshot(weights: QuantizedExpertWeights) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in weights.tensors().items()}


def assert_untouched(
    weights: QuantizedExpertWeights, before: dict[str, torch.Tensor]
) -> None:
    for name, tensor in weights.tensors().items():
        assert tensor.dtype == before[name].dtype, name
        torch.testing.assert_close(tensor, before[name], **EXACT)


def fake_backend(kernels: FakeXpuKernels) -> XPUFusedBackend:
    return XPUFusedBackend(
        providers=(
            VllmXpuKernelsProvider(load=kernels.load, int4_arch=kernels.int4_arch),
        ),
        delegate=None,
    )
