"""Shared pieces of the Triton interpreter tests (test_triton_interpreter.py,
test_triton_paths.py, test_triton_gemm_paths.py): the tiny layer, its weights and the
path runner.

``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` where no CUDA device exists.
"""

import pytest
import torch

from backends.triton import TritonW4A16Backend, TritonW4A16Prepared
from backends.triton._fused import Path, fused_moe
from backends.triton._tiles import GemvTiles, MoETiles
from core.config import Activation, MoEConfig
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.tolerances import INTERPRETER_INT4_REL_L2, INTERPRETER_INT4_VS_ORACLE, rel_l2

INTERPRETER_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA device is present: the kernels are compiled for it and tested in "
    "tests/backends/test_triton_cuda.py, not in the interpreter",
)
"""The interpreter test files' ``pytestmark``."""

SCHEMES = (
    Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=32),
    Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=32),
    Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=-1),
)
E, D, F = 4, 96, 64  # D is not a multiple of the interpreter BLOCK_K (64): tails masked


def weights_for(
    scheme: Int4Scheme, dtype: torch.dtype, generator: torch.Generator
) -> QuantizedExpertWeights:
    w13 = torch.randn(E, 2 * F, D, generator=generator) * 0.2
    w2 = torch.randn(E, D, F, generator=generator) * 0.2
    return quantize_expert_weights(w13, w2, scheme, scale_dtype=dtype)


def tiny_config(
    activation: Activation = "silu", *, top_k: int = 2, on_input: bool = False
) -> MoEConfig:
    """The tiny layer's config: ``E`` experts, ``D`` hidden, ``F`` intermediate;
    ``on_input``: ``apply_router_weight_on_input``."""
    return MoEConfig(
        num_experts=E,
        top_k=top_k,
        hidden_size=D,
        intermediate_size=F,
        activation=activation,
        apply_router_weight_on_input=on_input,
    )


GEMV_CASES = [  # (scheme, activation, dtype, top_k, apply_router_weight_on_input)
    (SCHEMES[0], "silu", torch.bfloat16, 2, False),
    (SCHEMES[1], "gelu", torch.float16, 2, False),
    (SCHEMES[2], "swigluoai", torch.bfloat16, 2, False),
    (
        Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=-1),
        "gelu_tanh",
        torch.float16,
        2,
        False,
    ),
    (SCHEMES[1], "silu", torch.bfloat16, 1, True),
]


PathCase = tuple[Int4Scheme, Activation, torch.dtype, int, bool]


def path_config(case: PathCase) -> MoEConfig:
    """The tiny layer's config with ``case``'s activation, top_k and router-weight flag."""
    _, activation, _, top_k, on_input = case
    return tiny_config(activation, top_k=top_k, on_input=on_input)


def run_path(
    path: Path,
    case: PathCase,
    tokens: int,
    generator: torch.Generator,
    *,
    drop: bool = True,
    gemv_tiles: GemvTiles | None = None,
    tiles: MoETiles | None = None,
    rel_l2_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, TritonW4A16Prepared, Routing, MoEConfig]:
    """Run ``path`` on a tiny layer, checked against the oracle; returns (out, hidden
    states, prepared, routing, config).

    With ``drop``, token ``tokens // 2``'s first choice is an expert held elsewhere.
    ``rel_l2_bound``: as ``check_w4a16``.
    """
    scheme, _, dtype, _, _ = case
    config = path_config(case)
    weights = weights_for(scheme, dtype, generator)
    hidden_TD = torch.randn(tokens, D, generator=generator).to(dtype)
    routing = route_topk(torch.randn(tokens, E, generator=generator), config)
    if drop:
        ids = routing.topk_ids.clone()
        ids[tokens // 2, 0] = -1
        routing = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    out, prepared = check_w4a16(
        weights, config, hidden_TD, routing, path=path, gemv_tiles=gemv_tiles,
        tiles=tiles, rel_l2_bound=rel_l2_bound,
    )  # fmt: skip
    return out, hidden_TD, prepared, routing, config


def check_w4a16(
    weights: QuantizedExpertWeights,
    config: MoEConfig,
    hidden_TD: torch.Tensor,
    routing: Routing,
    *,
    path: Path,
    gemv_tiles: GemvTiles | None = None,
    tiles: MoETiles | None = None,
    rel_l2_bound: float | None = None,
) -> tuple[torch.Tensor, TritonW4A16Prepared]:
    """triton-w4a16 prepared for ``hidden_TD``'s dtype, one ``fused_moe`` on ``path``
    checked against the oracle (relative L2 below ``rel_l2_bound``, by default
    ``INTERPRETER_INT4_REL_L2``); returns (out, prepared)."""
    dtype = hidden_TD.dtype
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=dtype)
    out = fused_moe(
        hidden_TD, prepared.w13, prepared.w2, routing, config,
        path=path, gemv_tiles=gemv_tiles, tiles=tiles,
    )  # fmt: skip
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert out.dtype == dtype
    bound = INTERPRETER_INT4_REL_L2[dtype] if rel_l2_bound is None else rel_l2_bound
    assert rel_l2(expected, out) < bound
    return out, prepared


def assert_matches_gemm(
    out: torch.Tensor,
    hidden_TD: torch.Tensor,
    prepared: TritonW4A16Prepared,
    routing: Routing,
    config: MoEConfig,
) -> None:
    gemm = fused_moe(hidden_TD, prepared.w13, prepared.w2, routing, config, path="gemm")
    tol = INTERPRETER_INT4_VS_ORACLE[out.dtype]  # both int4, float32 in the interpreter
    torch.testing.assert_close(out, gemm, rtol=tol["rtol"], atol=tol["atol"])
