"""Shared cases of the Triton CUDA tests: schemes, random int4 weights and routing on the
GPU, one fused forward against the oracle, CUDA-graph replay, the no-host-sync check.

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k.
"""

import math
import warnings
from collections.abc import Callable

import attrs
import torch

from backends.triton import TritonW4A16Backend
from backends.triton._fused import Path, fused_moe
from backends.triton._tiles import GemvTiles, MoETiles
from core.config import MoEConfig
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.tolerances import REL_L2_VS_ORACLE, rel_l2

SCHEMES = [
    Int4Scheme(mapping=m, group_size=g)
    for m in (Int4Mapping.SYMMETRIC, Int4Mapping.ASYMMETRIC)
    for g in (32, 64, 128, 256, -1)
]


def int4_weights(
    config: MoEConfig,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    generator: torch.Generator,
) -> QuantizedExpertWeights:
    """Random codes, scales and zero points on the GPU (quantizing big layers is slow)."""
    e, d, f = config.num_experts, config.hidden_size, config.intermediate_size

    def codes(*shape: int) -> torch.Tensor:
        return torch.randint(
            0, 256, shape, generator=generator, dtype=torch.uint8
        ).cuda()

    def scales(n: int, k: int) -> torch.Tensor:
        groups = scheme.num_groups(k)
        s = torch.rand(e, n, groups, generator=generator) * 0.5 + 0.75
        return (s / (4 * math.sqrt(k))).to(dtype).cuda()

    def zeros(n: int, k: int) -> torch.Tensor | None:
        if not scheme.has_zero_point:
            return None
        shape = (e, n, scheme.num_groups(k))
        return torch.randint(
            4, 12, shape, generator=generator, dtype=torch.uint8
        ).cuda()

    return QuantizedExpertWeights(
        w13_qdata=codes(e, 2 * f, d // 2),
        w13_scale=scales(2 * f, d),
        w13_zero_point=zeros(2 * f, d),
        w2_qdata=codes(e, d, f // 2),
        w2_scale=scales(d, f),
        w2_zero_point=zeros(d, f),
        scheme=scheme,
    )


def with_biases(
    weights: QuantizedExpertWeights, generator: torch.Generator
) -> QuantizedExpertWeights:
    """``weights`` with random gpt-oss expert biases on the GPU, in the scale dtype."""
    e, f, d = weights.num_experts, weights.intermediate_size, weights.hidden_size

    def bias(n: int, scale: float) -> torch.Tensor:
        b = torch.randn(e, n, generator=generator) * scale
        return b.to(weights.scale_dtype).cuda()

    return attrs.evolve(weights, w13_bias=bias(2 * f, 1.0), w2_bias=bias(d, 0.1))


def gpu_routing(config: MoEConfig, tokens: int, *, drop: bool = False) -> Routing:
    """Softmax top-k of random logits on the GPU; ``drop``: every id % 3 == 0 is -1."""
    logits = torch.randn(tokens, config.num_experts, device="cuda")
    routing = route_topk(logits, config)
    if drop and tokens:
        ids = routing.topk_ids.clone()
        ids[ids % 3 == 0] = -1
        routing = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    return routing


def check_fused(
    config: MoEConfig,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    tokens: int,
    *,
    seed: int,
    path: Path = "auto",
    drop: bool = False,
    tiles: MoETiles | None = None,
    gemv_tiles: GemvTiles | None = None,
    shape_hidden: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One ``fused_moe`` forward of triton-w4a16's weights against the oracle.

    With ``config.expert_bias`` the weights carry random gpt-oss biases;
    ``shape_hidden`` maps the float32 N(0, 1) hidden states before their cast.
    Returns the oracle's output.
    """
    generator = torch.Generator().manual_seed(seed)
    weights = int4_weights(config, scheme, dtype, generator)
    if config.expert_bias:
        weights = with_biases(weights, generator)
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=dtype)
    hidden_TD = torch.randn(tokens, config.hidden_size, device="cuda")
    if shape_hidden is not None:
        hidden_TD = shape_hidden(hidden_TD)
    hidden_TD = hidden_TD.to(dtype)
    routing = gpu_routing(config, tokens, drop=drop)
    out = fused_moe(
        hidden_TD, prepared.w13, prepared.w2, routing, config, tiles=tiles,
        path=path, gemv_tiles=gemv_tiles,
    )  # fmt: skip
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert out.dtype == dtype
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[dtype]
    return expected


def check_graph_replays(
    forward: Callable[[], torch.Tensor],
    hidden_TD: torch.Tensor,
    routing: Routing,
    weights: QuantizedExpertWeights,
    config: MoEConfig,
    *,
    reroute: bool = True,
    replays: int = 3,
) -> None:
    """Capture ``forward`` in a CUDA graph, then replay it on fresh inputs in place.

    Each replay gets new hidden states (and, with ``reroute``, new routing written into
    the captured tensors) and must match the oracle on them.
    """
    forward()  # compile first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_TD = forward()
    for _ in range(replays):
        hidden_TD.copy_(torch.randn_like(hidden_TD))
        if reroute:
            fresh = gpu_routing(config, int(hidden_TD.shape[0]))
            routing.topk_ids.copy_(fresh.topk_ids)
            routing.topk_weights.copy_(fresh.topk_weights)
        graph.replay()
        expected = moe_forward_reference(hidden_TD, weights, routing, config)
        assert rel_l2(expected, out_TD) < REL_L2_VS_ORACLE[hidden_TD.dtype]


def run_without_host_sync(forward: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``forward()`` (after one compiling call) with any synchronizing call raising."""
    forward()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    try:
        with warnings.catch_warnings():
            # torch warns that the sync debug mode is a prototype (filterwarnings=error)
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        out = forward()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode(previous)
    return out


def assert_same_outputs(
    size: tuple[int, int, int, int, int],
    scheme: Int4Scheme,
    tiles: GemvTiles | MoETiles,
    reference: GemvTiles | MoETiles,
    *,
    seed: int,
    forwards: int,
    drop: bool,
) -> None:
    """Eager and graph-replayed outputs on ``tiles`` must equal, bit for bit, those on
    ``reference`` over ``forwards`` fresh inputs and routings (the graph captured once,
    before them); ``drop``: the first routing sends a pair to an expert held elsewhere.
    ``GemvTiles`` run the ``gemv`` path, ``MoETiles`` the ``gemm`` path. ``size``:
    ``(E, K, D, F, T)``."""
    e, k, d, f, t = size
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    weights = int4_weights(
        config, scheme, torch.bfloat16, torch.Generator().manual_seed(seed)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)
    hidden_TD = torch.randn(t, d, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, t)

    def forward(chosen: GemvTiles | MoETiles) -> torch.Tensor:
        if isinstance(chosen, GemvTiles):
            return fused_moe(
                hidden_TD, prepared.w13, prepared.w2, routing, config, path="gemv",
                gemv_tiles=chosen,
            )  # fmt: skip
        return fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, path="gemm",
            tiles=chosen,
        )  # fmt: skip

    forward(tiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = forward(tiles)
    for i in range(forwards):
        hidden_TD.copy_(torch.randn_like(hidden_TD))
        fresh = gpu_routing(config, t)
        routing.topk_ids.copy_(fresh.topk_ids)
        if drop and i == 0:
            routing.topk_ids[0, 0] = -1  # an expert held elsewhere
        routing.topk_weights.copy_(fresh.topk_weights)
        expected = forward(reference)
        assert torch.equal(forward(tiles), expected)
        graph.replay()
        assert torch.equal(replayed, expected)
