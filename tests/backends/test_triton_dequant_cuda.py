"""The int4 prefill path of triton-w4a16 on a CUDA GPU (marker ``cuda``): chunks of
experts dequantized to 16 bits, then the 16-bit grouped GEMM.

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k.
"""

import pytest
import torch

import backends.triton._configs as configs
from backends.triton import TritonW4A16Backend
from backends.triton._fused import Path, fused_moe, use_dequant
from core.config import Activation, MoEConfig
from core.scheme import Int4Scheme
from tests.backends.triton_cuda_cases import (
    SCHEMES,
    check_fused,
    check_graph_replays,
    gpu_routing,
    int4_weights,
    run_without_host_sync,
)

pytestmark = pytest.mark.cuda


def _three_experts_per_chunk(
    monkeypatch: pytest.MonkeyPatch, config: MoEConfig
) -> None:
    """Scratch for 3 experts of 16 bits: chunks 3, 3, ... and a shorter last one."""
    largest = 2 * config.intermediate_size * config.hidden_size
    monkeypatch.setattr(configs, "DEQUANT_SCRATCH_BYTES", 3 * largest * 2)


def _check(
    config: MoEConfig,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    tokens: int,
    *,
    path: Path = "dequant",
) -> None:
    check_fused(config, scheme, dtype, tokens, seed=tokens + 17, path=path, drop=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
def test_dequant_schemes(
    scheme: Int4Scheme, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = MoEConfig(num_experts=16, top_k=4, hidden_size=1024, intermediate_size=512)
    _three_experts_per_chunk(monkeypatch, config)
    _check(config, scheme, dtype, 300)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "swigluoai"])
def test_dequant_activations(activation: Activation) -> None:
    config = MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=2880,
        intermediate_size=2880,
        activation=activation,
    )  # gpt-oss sizes: 2880 is not a multiple of the 128-column tiles
    _check(config, SCHEMES[0], torch.bfloat16, 200)


def test_dequant_router_weight_on_input() -> None:
    config = MoEConfig(
        num_experts=16,
        top_k=1,
        hidden_size=512,
        intermediate_size=256,
        renormalize=False,  # top-1 renormalized weighs 1: weighting twice would pass
        apply_router_weight_on_input=True,
    )
    _check(config, SCHEMES[5], torch.bfloat16, 500)


def test_dequant_is_auto_at_prefill() -> None:
    config = MoEConfig(
        num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768
    )
    weights = int4_weights(
        config, SCHEMES[2], torch.bfloat16, torch.Generator().manual_seed(2)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)
    assert use_dequant(4096 * 8, prepared.w13)  # Qwen3-30B-A3B, M = 4096
    _check(config, SCHEMES[2], torch.bfloat16, 4096, path="auto")


def test_dequant_cuda_graph_and_no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=1024, intermediate_size=512)
    _three_experts_per_chunk(monkeypatch, config)
    weights = int4_weights(
        config, SCHEMES[6], torch.bfloat16, torch.Generator().manual_seed(3)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)
    hidden_TD = torch.randn(64, 1024, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, 64)

    def forward() -> torch.Tensor:
        return fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, path="dequant"
        )

    run_without_host_sync(forward)
    check_graph_replays(forward, hidden_TD, routing, weights, config)
