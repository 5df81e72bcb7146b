"""The int4 prefill path of triton-w4a16 on a CUDA GPU (marker ``cuda``): chunks of
experts dequantized to 16 bits, then the 16-bit grouped GEMM.

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k.
"""

import pytest
import torch

import backends.triton._configs as configs
from backends.triton import TritonW4A16Backend
from backends.triton._fused import Path, fused_moe, use_dequant
from backends.triton._launch_dequant import dequantize_experts
from core.config import Activation, MoEConfig
from core.quantize import dequantize_expert
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


@pytest.mark.parametrize("tiles", [(64, 128, 4), (16, 512, 4), (8, 1024, 8)], ids=str)
@pytest.mark.parametrize("words", [False, True], ids=["bytes", "words"])
@pytest.mark.parametrize(
    "scale_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str
)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[7], SCHEMES[9]], ids=str)
def test_dequant_kernel_is_exact_for_every_scale_and_output_dtype(
    scheme: Int4Scheme,
    out_dtype: torch.dtype,
    scale_dtype: torch.dtype,
    words: bool,
    tiles: tuple[int, int, int],
) -> None:
    """The kernel compiled: words by inline PTX in the output's dtype where the scales
    have it, else in float32, and bytes; each bit-exact against core's float32
    dequant rounded once to the output dtype, on w13 and w2 of a chunk past expert 0
    (K = 384 and 256: tails of the 512- and 1024-column tiles, groups of 32 to a row)."""
    config = MoEConfig(num_experts=4, top_k=1, hidden_size=384, intermediate_size=256)
    weights = int4_weights(
        config, scheme, scale_dtype, torch.Generator().manual_seed(5)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=out_dtype)
    block_r, block_k, warps = tiles
    for index, b in enumerate((prepared.w13, prepared.w2)):
        assert b.scale is not None
        assert b.scale.dtype == scale_dtype
        assert b.words_fit
        shape = (3, int(b.data.shape[1]), 2 * int(b.data.shape[2]))
        out = torch.full(shape, float("nan"), dtype=out_dtype, device="cuda")
        dequantize_experts(
            b, 1, 4, out, block_r=block_r, block_k=block_k, num_warps=warps,
            words=words,
        )  # fmt: skip
        for e in range(1, 4):
            want = dequantize_expert(weights, e, dtype=torch.float32)[index]
            torch.testing.assert_close(
                out[e - 1], want.to(out_dtype), rtol=0.0, atol=0.0
            )
