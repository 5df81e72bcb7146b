"""gpt-oss expert biases in the Triton kernels (interpreter, tiny shapes), vs the oracle.

Every path (byte and word GEMVs, GEMM with each dequantization scheme and a K-split w2
or w13, dequant) and both router-weight placements; the bias is added once, after the input's
router weight, before the activation (w13) and before the output's router weight (w2).
int4 weights (triton-w4a16) are held to ``INTERPRETER_INT4_REL_L2`` (float32 in the
interpreter, like the oracle); triton-emulation's 16-bit weights to ``REL_L2_VS_ORACLE``.
"""

import attrs
import pytest
import torch

from backends.triton import (
    EmulationMemoryWarning,
    TritonEmulationBackend,
    TritonW4A16Backend,
)
from backends.triton._fused import fused_moe
from backends.triton._tiles import GemmTiles, GemvTiles, MoETiles
from core.config import Activation, MoEConfig
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.tolerances import INTERPRETER_INT4_REL_L2, REL_L2_VS_ORACLE, rel_l2

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA device is present: the kernels are compiled for it and tested in "
    "tests/backends/test_triton_cuda.py, not in the interpreter",
)

E, D, F = 4, 96, 64
SYM = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=32)
ASYM = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=32)


def _tiles(*, swap: bool, halves: bool = False, words: bool = False) -> MoETiles:
    w13 = GemmTiles(
        block_n=32, block_k=64, swap_ab=swap, nibble_halves=halves, int4_words=words
    )
    return MoETiles(block_m=16, w13=w13, w2=attrs.evolve(w13, block_k=32, split_k=2))


PATHS: dict[str, tuple[str, MoETiles | None, GemvTiles | None]] = {
    "gemv": ("gemv", None, None),
    "gemv-w2-split-2": ("gemv", None, GemvTiles(block_n=16, block_k=32, w2_split=2)),
    "gemv-words-split-2": (
        "gemv",
        None,
        GemvTiles(block_n=16, block_k=32, w2_split=2, words=True),
    ),
    "gemm": ("gemm", None, None),
    "gemm-split-2": ("gemm", _tiles(swap=False), None),
    "gemm-halves-split-2": ("gemm", _tiles(swap=True, halves=True), None),
    "gemm-words-split-2": ("gemm", _tiles(swap=True, words=True), None),
    "gemm-w13-split-2": (
        "gemm",
        attrs.evolve(
            _tiles(swap=True, words=True),
            w13=GemmTiles(
                block_n=32, block_k=32, swap_ab=True, int4_words=True, split_k=2
            ),
        ),
        None,
    ),
    "dequant": ("dequant", None, None),
}


def _config(*, on_input: bool, activation: Activation = "swigluoai") -> MoEConfig:
    return MoEConfig(
        num_experts=E,
        top_k=1 if on_input else 2,
        hidden_size=D,
        intermediate_size=F,
        activation=activation,
        renormalize=not on_input,  # top-1 renormalized weighs 1: the order is untested
        apply_router_weight_on_input=on_input,
        expert_bias=True,
    )


def _biased_weights(
    scheme: Int4Scheme, dtype: torch.dtype, generator: torch.Generator
) -> QuantizedExpertWeights:
    w13 = torch.randn(E, 2 * F, D, generator=generator) * 0.2
    w2 = torch.randn(E, D, F, generator=generator) * 0.2
    weights = quantize_expert_weights(w13, w2, scheme, scale_dtype=dtype)
    return attrs.evolve(
        weights,
        w13_bias=torch.randn(E, 2 * F, generator=generator).to(dtype),
        w2_bias=(torch.randn(E, D, generator=generator) * 0.5).to(dtype),
    )


def _routing(tokens: int, config: MoEConfig, generator: torch.Generator) -> Routing:
    """Top-k routing with token ``tokens // 2``'s first choice held elsewhere (-1)."""
    routing = route_topk(torch.randn(tokens, E, generator=generator), config)
    ids = routing.topk_ids.clone()
    ids[tokens // 2, 0] = -1
    return Routing(topk_weights=routing.topk_weights, topk_ids=ids)


def _assert_biases_matter(
    weights: QuantizedExpertWeights,
    hidden_TD: torch.Tensor,
    routing: Routing,
    config: MoEConfig,
    expected: torch.Tensor,
) -> None:
    """The oracle without biases is far off, so a kernel that drops them fails."""
    unbiased = attrs.evolve(weights, w13_bias=None, w2_bias=None)
    plain = attrs.evolve(config, expert_bias=False)
    without = moe_forward_reference(hidden_TD, unbiased, routing, plain)
    assert rel_l2(expected, without) > 20 * REL_L2_VS_ORACLE[hidden_TD.dtype]


@pytest.mark.parametrize("on_input", [False, True], ids=["weighted-out", "weighted-in"])
@pytest.mark.parametrize("scheme", [SYM, ASYM], ids=lambda s: s.name)
@pytest.mark.parametrize("path_id", PATHS.keys())
def test_w4a16_biases_on_every_path(
    path_id: str, scheme: Int4Scheme, on_input: bool, generator: torch.Generator
) -> None:
    path, tiles, gemv_tiles = PATHS[path_id]
    config = _config(on_input=on_input)
    dtype = torch.bfloat16
    weights = _biased_weights(scheme, dtype, generator)
    tokens = 3 if path == "gemv" else 6
    hidden_TD = torch.randn(tokens, D, generator=generator).to(dtype)
    routing = _routing(tokens, config, generator)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    _assert_biases_matter(weights, hidden_TD, routing, config, expected)
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=dtype)
    assert prepared.w13.bias is not None
    assert prepared.w2.bias is not None
    out = fused_moe(
        hidden_TD, prepared.w13, prepared.w2, routing, config,
        path=path, tiles=tiles, gemv_tiles=gemv_tiles,  # type: ignore[arg-type]
    )  # fmt: skip
    assert rel_l2(expected, out) < INTERPRETER_INT4_REL_L2[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("name", ["triton-w4a16", "triton-emulation"])
def test_backends_take_biased_layers(
    name: str, activation: Activation, dtype: torch.dtype, generator: torch.Generator
) -> None:
    """Both backends accept ``expert_bias`` and match the oracle through ``apply``."""
    config = _config(on_input=False, activation=activation)
    weights = _biased_weights(SYM, dtype, generator)
    hidden_TD = torch.randn(5, D, generator=generator).to(dtype)
    routing = _routing(5, config, generator)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    _assert_biases_matter(weights, hidden_TD, routing, config, expected)
    if name == "triton-w4a16":
        backend = TritonW4A16Backend()
        out = backend.apply(
            hidden_TD, backend.prepare(weights, config, dtype=dtype), routing
        )
        bound = INTERPRETER_INT4_REL_L2[dtype]
    else:
        emulation = TritonEmulationBackend()
        with pytest.warns(EmulationMemoryWarning):
            prepared = emulation.prepare(weights, config, dtype=dtype)
        out = emulation.apply(hidden_TD, prepared, routing)
        bound = REL_L2_VS_ORACLE[dtype]
    assert rel_l2(expected, out) < bound
