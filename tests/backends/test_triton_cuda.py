"""Triton backends on a CUDA GPU (marker ``cuda``): schemes, dtypes, activations,
routing options, sizes up to real model layers, CUDA graphs and no host sync.

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k.
"""

import pytest
import torch

from backends.base import PreparedExperts
from backends.triton import (
    EmulationMemoryWarning,
    TritonEmulationBackend,
    TritonW4A16Backend,
    compute_dtype,
)
from backends.triton._configs import choose_tiles
from backends.triton._fused import use_gemv
from backends.triton._launch import ExpertMatrix, ptx_target
from core.config import Activation, MoEConfig
from core.reference import moe_forward_reference
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.backends.alignment_cases import check_alignment
from tests.backends.triton_cuda_cases import (
    SCHEMES,
    check_fused,
    check_graph_replays,
    gpu_routing,
    int4_weights,
    run_without_host_sync,
    with_biases,
)
from tests.backends.weight_views import strided_weights
from tests.tolerances import REL_L2_VS_ORACLE, rel_l2

pytestmark = pytest.mark.cuda

BACKENDS = ("triton-w4a16", "triton-emulation")


def _backend(name: str) -> TritonW4A16Backend | TritonEmulationBackend:
    return TritonW4A16Backend() if name == "triton-w4a16" else TritonEmulationBackend()


def _prepare(
    name: str, weights: QuantizedExpertWeights, config: MoEConfig, dtype: torch.dtype
) -> tuple[TritonW4A16Backend | TritonEmulationBackend, PreparedExperts]:
    backend = _backend(name)
    if name == "triton-w4a16":
        return backend, backend.prepare(weights, config, dtype=dtype)
    with pytest.warns(EmulationMemoryWarning, match="16-bit weights"):
        return backend, backend.prepare(weights, config, dtype=dtype)


def _check(
    name: str,
    config: MoEConfig,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    tokens: int,
    *,
    drop: bool = False,
    strided: bool = False,
) -> None:
    generator = torch.Generator().manual_seed(tokens * 7919 + config.num_experts)
    weights = int4_weights(config, scheme, compute_dtype(dtype), generator)
    if config.expert_bias:
        weights = with_biases(weights, generator)
    if strided:  # the same values in transposed-copy views (not contiguous)
        weights = strided_weights(weights)
        assert not weights.w13_qdata.is_contiguous()
    backend, prepared = _prepare(name, weights, config, dtype)
    hidden_TD = torch.randn(tokens, config.hidden_size, device="cuda").to(dtype)
    routing = gpu_routing(config, tokens, drop=drop)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    out = backend.apply(hidden_TD, prepared, routing)
    assert out.shape == (tokens, config.hidden_size)
    assert out.dtype == dtype
    assert bool(torch.isfinite(out).all())
    if tokens:  # fp32 inputs run in bf16 (compute_dtype)
        assert rel_l2(expected, out) < REL_L2_VS_ORACLE[compute_dtype(dtype)]


def _config(
    e: int = 8, k: int = 2, d: int = 512, f: int = 384, activation: Activation = "silu"
) -> MoEConfig:
    return MoEConfig(
        num_experts=e,
        top_k=k,
        hidden_size=d,
        intermediate_size=f,
        activation=activation,
    )


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str
)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("name", BACKENDS)
def test_schemes_and_dtypes(name: str, scheme: Int4Scheme, dtype: torch.dtype) -> None:
    _check(name, _config(f=512), scheme, dtype, 37)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh", "swigluoai"])
@pytest.mark.parametrize("name", BACKENDS)
def test_activations(name: str, activation: Activation, dtype: torch.dtype) -> None:
    _check(name, _config(activation=activation), SCHEMES[2], dtype, 21)


@pytest.mark.parametrize("tokens", [0, 1, 3, 200])
@pytest.mark.parametrize("name", BACKENDS)
def test_ids_of_minus_one(name: str, tokens: int) -> None:
    _check(name, _config(), SCHEMES[7], torch.bfloat16, tokens, drop=True)


# gemv at 1 (and 5 at top-k 1), gemm words at 5 and 64, at 2048 dequant (top-k 4)
# or gemm halves (top-k 1)
@pytest.mark.parametrize("tokens", [1, 5, 64, 2048])
@pytest.mark.parametrize("on_input", [False, True], ids=["weighted-out", "weighted-in"])
@pytest.mark.parametrize("name", BACKENDS)
def test_expert_biases(name: str, on_input: bool, tokens: int) -> None:
    """gpt-oss: swigluoai with biases; gpt-oss-20b sizes (D = F = 2880, group 32)."""
    config = MoEConfig(
        num_experts=32,
        top_k=1 if on_input else 4,
        hidden_size=2880,
        intermediate_size=2880,
        renormalize=not on_input,  # top-1 renormalized weighs 1
        activation="swigluoai",
        apply_router_weight_on_input=on_input,
        expert_bias=True,
    )
    _check(name, config, SCHEMES[0], torch.bfloat16, tokens, drop=True)


@pytest.mark.parametrize("tokens", [1, 300])
@pytest.mark.parametrize("name", BACKENDS)
def test_router_weight_on_input(name: str, tokens: int) -> None:
    config = MoEConfig(
        num_experts=16,
        top_k=1,
        hidden_size=256,
        intermediate_size=512,
        renormalize=False,
        scoring_func="sigmoid",
        apply_router_weight_on_input=True,
    )
    _check(name, config, SCHEMES[0], torch.bfloat16, tokens)


SIZES = [  # (E, K, D, F, T): F=320/704 leave K tails in the w2 GEMM; real models last
    (8, 1, 256, 320, 1),
    (8, 8, 384, 256, 5),
    (64, 6, 1024, 704, 333),
    (64, 8, 800, 320, 100),  # 13 pairs per expert: 32-row blocks of the 16-bit table
    (256, 8, 1024, 512, 8192),
    (128, 8, 2048, 768, 4096),  # Qwen3-30B-A3B
    (8, 2, 4096, 14336, 64),  # Mixtral-8x7B
    (128, 8, 4096, 1536, 16),  # Qwen3-235B-A22B
    (256, 8, 7168, 2048, 256),  # DeepSeek-V3
]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "E{}_K{}_D{}_F{}_T{}".format(*s))
@pytest.mark.parametrize("name", BACKENDS)
def test_sizes(name: str, size: tuple[int, int, int, int, int]) -> None:
    e, k, d, f, t = size
    scheme = SCHEMES[2] if f % 128 == 0 else SCHEMES[0]  # group 128, else 32
    _check(name, _config(e, k, d, f), scheme, torch.bfloat16, t)


@pytest.mark.parametrize(
    "size",
    [(8, 2, 4096, 14336, 4), (256, 8, 7168, 2048, 16), (128, 8, 4096, 1536, 4)],
    ids=["mixtral-T4", "deepseek-v3-T16", "qwen3-235b-T4"],
)
def test_w4a16_table_splits_w13_at_model_shapes(
    size: tuple[int, int, int, int, int],
) -> None:
    """Where the table splits w13's K in two (``mma_w13_split``), the gemm path as the
    table runs it, against the oracle, with a pair held elsewhere."""
    e, k, d, f, t = size
    tiles = choose_tiles(
        num_pairs=t * k, num_experts=e, hidden_size=d, intermediate_size=f, mma=True
    )
    assert tiles.w13.split_k == 2
    check_fused(
        _config(e, k, d, f), SCHEMES[2], torch.bfloat16, t, seed=7, path="gemm",
        drop=True,
    )  # fmt: skip


# (E, T, K): one launch (<= ALIGN_ONE_LAUNCH_MAX_PAIRS pairs: 1, 2 and 2 chunks of
# 1024 ids), then the count launch first (4096 and 32768 pairs)
@pytest.mark.parametrize(
    "shape", [(8, 1, 2), (256, 150, 8), (128, 256, 8), (8, 2048, 2), (256, 4096, 8)]
)
@pytest.mark.parametrize("block_m", [8, 16, 64])
def test_alignment_groups_pairs_stably_by_expert(
    shape: tuple[int, int, int], block_m: int
) -> None:
    e, t, k = shape
    generator = torch.Generator(device="cuda").manual_seed(e * t + block_m)
    ids_TK = torch.randint(-1, e, (t, k), device="cuda", generator=generator)
    check_alignment(ids_TK, e, block_m)


@pytest.mark.parametrize("name", BACKENDS)
def test_cuda_graph_capture_and_replay(name: str) -> None:
    config, dtype = _config(e=32, k=4), torch.bfloat16
    generator = torch.Generator().manual_seed(5)
    weights = int4_weights(config, SCHEMES[6], dtype, generator)
    backend, prepared = _prepare(name, weights, config, dtype)
    hidden_TD = torch.randn(48, config.hidden_size, device="cuda").to(dtype)
    routing = gpu_routing(config, 48)
    check_graph_replays(
        lambda: backend.apply(hidden_TD, prepared, routing),
        hidden_TD, routing, weights, config,
    )  # fmt: skip


@pytest.mark.parametrize("tokens", [1, 64, 1024, 2048])  # 2048: the dequant path
@pytest.mark.parametrize("name", BACKENDS)
def test_forward_makes_no_host_sync(name: str, tokens: int) -> None:
    config, dtype = _config(e=64, k=8), torch.bfloat16
    weights = int4_weights(config, SCHEMES[0], dtype, torch.Generator().manual_seed(1))
    backend, prepared = _prepare(name, weights, config, dtype)
    hidden_TD = torch.randn(tokens, config.hidden_size, device="cuda").to(dtype)
    routing = gpu_routing(config, tokens)
    out = run_without_host_sync(lambda: backend.apply(hidden_TD, prepared, routing))
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[dtype]


@pytest.mark.parametrize("tokens", [1, 16, 2048])  # the gemv, gemm and dequant paths
def test_w4a16_strided_weights(tokens: int) -> None:
    """Transposed-copy views are copied contiguous at prepare (the kernels read rows)."""
    _check("triton-w4a16", _config(), SCHEMES[6], torch.bfloat16, tokens, strided=True)


@pytest.mark.parametrize("tokens", [1, 5, 40, 2048])
@pytest.mark.parametrize("dims", [(48, 24), (100, 64)], ids=["D48_F24", "D100_F64"])
def test_w4a16_group_per_row_with_small_k(dims: tuple[int, int], tokens: int) -> None:
    """Group -1 with K below the GPU tiles' BLOCK_K, not a power of 2 (D = 100: bytes)."""
    d, f = dims
    _check("triton-w4a16", _config(d=d, f=f), SCHEMES[9], torch.bfloat16, tokens)


def test_w4a16_inline_ptx_targets_cuda_tensors() -> None:
    assert ptx_target(torch.empty(1, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "swigluoai"])
def test_emulation_decode_gemv(activation: Activation, dtype: torch.dtype) -> None:
    """6 pairs over 16 experts: emulation's 16-bit GEMV (``_moe_gemv16_kernel``)."""
    config = _config(e=16, k=2, activation=activation)
    dense = ExpertMatrix(data=torch.empty(16, 2, 2, dtype=dtype))
    assert use_gemv(6, dense)
    _check("triton-emulation", config, SCHEMES[0], dtype, 3, drop=True)


@pytest.mark.parametrize(
    ("size", "tokens", "gemv"),
    [((128, 8, 2048, 768), 1, True), ((128, 8, 2048, 768), 2, True),
     ((128, 8, 4096, 1536), 1, True), ((128, 8, 4096, 1536), 2, False),
     ((8, 2, 4096, 14336), 1, False)],
    ids=["qwen3-30b", "qwen3-30b-2-tokens", "qwen3-235b", "qwen3-235b-2-tokens-gemm",
         "mixtral-gemm"],
)  # fmt: skip
def test_emulation_decode_model_shapes(
    size: tuple[int, int, int, int], tokens: int, gemv: bool
) -> None:
    """The 16-bit GEMV for the Qwen3 shapes at one token and Qwen3-30B-A3B's tiny
    experts at two (16 pairs), the GEMM for Mixtral's and Qwen3-235B at two."""
    e, k, d, f = size
    dense = ExpertMatrix(data=torch.empty(e, 2 * f, d, device="meta"))
    assert use_gemv(k * tokens, dense) is gemv
    config = _config(e, k, d, f)
    _check("triton-emulation", config, SCHEMES[2], torch.bfloat16, tokens)


def test_emulation_decode_gemv_graph_replay() -> None:
    config, dtype = _config(e=32, k=4), torch.bfloat16
    weights = int4_weights(config, SCHEMES[0], dtype, torch.Generator().manual_seed(9))
    backend, prepared = _prepare("triton-emulation", weights, config, dtype)
    hidden_TD = torch.randn(2, config.hidden_size, device="cuda").to(dtype)
    routing = gpu_routing(config, 2)  # 8 pairs over 32 experts: the GEMV
    check_graph_replays(
        lambda: backend.apply(hidden_TD, prepared, routing),
        hidden_TD, routing, weights, config,
    )  # fmt: skip
