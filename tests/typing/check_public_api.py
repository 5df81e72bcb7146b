"""Type-checked only (mypy --strict), never collected by pytest: the public API's types."""

import torch
from typing_extensions import assert_type

from backends import DeviceInfo, MoEBackend, Support, available_backends, select_backend
from core import (
    CANONICAL_LAYOUT,
    INT4_ASYM_G32,
    INT4_SYM_G32,
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
from modules import Int4MoE


def check() -> None:
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=256, intermediate_size=512)
    w13 = torch.randn(8, 1024, 256)
    w2 = torch.randn(8, 256, 512)
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
    assert_type(moe.backend_name, str | None)
