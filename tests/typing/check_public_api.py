"""Type-checked only (mypy --strict), never collected by pytest: the public API's types."""

import torch
from typing_extensions import assert_type

from backends import (
    DeviceInfo,
    MoEBackend,
    Support,
    available_backends,
    check_prepared,
    create_backend,
    select_backend,
)
from backends.reference import ReferencePrepared
from core import (
    ACTIVATIONS,
    CANONICAL_LAYOUT,
    INT4_ASYM_G32,
    INT4_SYM_G32,
    Activation,
    MoEConfig,
    QuantizedExpertWeights,
    Routing,
    dequantize_expert_weights,
    moe_forward_reference,
    pack_int4,
    quantize_expert_weights,
    route_topk,
    unpack_int4,
)
from modules import Int4MoE, Int4SparseMoeBlock, RoutingMode, Source, from_checkpoint


class ScaledMoE(Int4MoE):
    """A user's subclass: the named constructors keep its type."""


CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=256, intermediate_size=512)


def check() -> None:
    """The layer's calls, core's functions and the backends' (one function each)."""
    w13 = torch.randn(8, 1024, 256)
    w2 = torch.randn(8, 256, 512)
    cfg = CFG
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=cfg, scheme=INT4_SYM_G32
    )
    x = torch.randn(4, 256)
    assert_type(moe(x, router_logits=torch.randn(4, 8)), torch.Tensor)
    assert_type(moe.forward(x, router_logits=torch.randn(4, 8)), torch.Tensor)
    assert_type(Int4MoE(cfg)(x, topk_weights=x, topk_ids=x), torch.Tensor)
    assert_type(INT4_SYM_G32.group_size, int)
    assert_type(INT4_ASYM_G32.has_zero_point, bool)
    q = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    assert_type(q, QuantizedExpertWeights)
    assert_type(Int4MoE.from_quantized(q, config=cfg), Int4MoE)
    assert_type(dequantize_expert_weights(q), tuple[torch.Tensor, torch.Tensor])
    assert_type(pack_int4(unpack_int4(q.w13_qdata)), torch.Tensor)
    routing = route_topk(torch.randn(4, 8), cfg)
    assert_type(routing, Routing)
    assert_type(moe_forward_reference(x, q, routing, cfg), torch.Tensor)
    check_backends(q)
    check_layer(moe, q, w13, w2)


def check_backends(q: QuantizedExpertWeights) -> None:
    cfg = CFG
    backend = select_backend(
        cfg, INT4_SYM_G32, CANONICAL_LAYOUT, DeviceInfo.of("cpu"), dtype=torch.bfloat16
    )
    assert_type(backend, MoEBackend)
    assert_type(
        backend.supports(
            cfg,
            INT4_SYM_G32,
            CANONICAL_LAYOUT,
            DeviceInfo.of("cpu"),
            dtype=torch.float16,
        ),
        Support,
    )
    assert_type(available_backends(), tuple[str, ...])
    reference = create_backend("reference")
    assert isinstance(reference, MoEBackend)  # a runtime-checkable Protocol
    prepared = reference.prepare(q, cfg, dtype=torch.float32)
    assert_type(prepared.extra_bytes(), int)
    assert_type(
        check_prepared(prepared, ReferencePrepared, "reference"), ReferencePrepared
    )


def check_layer(
    moe: Int4MoE, q: QuantizedExpertWeights, w13: torch.Tensor, w2: torch.Tensor
) -> None:
    cfg = CFG
    assert_type(moe.backend_name, str | None)

    assert_type(moe.w13_qdata, torch.Tensor)
    assert_type(moe.w2_scale, torch.Tensor)
    assert_type(moe.expert_map, torch.Tensor | None)
    assert_type(moe.gate_weight, torch.nn.Parameter | None)
    assert_type(moe.w13_zero_point, torch.Tensor | None)
    assert_type(moe.w2_zero_point, torch.Tensor | None)
    assert_type(moe.w13_bias, torch.Tensor | None)
    assert_type(moe.w2_bias, torch.Tensor | None)
    scaled = ScaledMoE.from_float(w13_weight=w13, w2_weight=w2, config=cfg)
    assert_type(scaled, ScaledMoE)
    assert_type(ScaledMoE.from_quantized(q, config=cfg), ScaledMoE)
    fmt: str = "Compressed_Tensors"  # any spelling; checked at run time
    assert_type(
        ScaledMoE.from_checkpoint({}, prefix="p", config=cfg, format=fmt), ScaledMoE
    )
    assert_type(from_checkpoint({}, prefix="p", config=cfg, format=fmt), Int4MoE)
    source: Source = "path/to/checkpoint"  # what a user's wrapper types its argument
    assert_type(from_checkpoint(source, prefix="p", config=cfg), Int4MoE)
    assert_type(
        from_checkpoint({}, prefix="p", config=cfg, module_cls=ScaledMoE), ScaledMoE
    )
    activation: Activation = ACTIVATIONS[0]
    assert_type(
        MoEConfig(
            num_experts=8,
            top_k=2,
            hidden_size=64,
            intermediate_size=32,
            activation=activation,
        ),
        MoEConfig,
    )


def check_hf_block(block: Int4SparseMoeBlock, mode: RoutingMode) -> None:
    assert_type(
        block(torch.randn(2, 3, 64)), torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    )
    assert_type(mode, RoutingMode)
