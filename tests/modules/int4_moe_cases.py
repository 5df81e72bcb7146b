"""Layers and weights the Int4MoE test files share (not a test file)."""

from typing import Any

import torch

from core.config import MoEConfig
from core.quantize import quantize_expert_weights
from core.scheme import (
    INT4_SYM_G32,
    Int4Scheme,
)
from modules import Int4MoE
from tests.dense import dequant_f64

CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)


def _float_weights(
    gen: torch.Generator, cfg: MoEConfig = CFG
) -> tuple[torch.Tensor, torch.Tensor]:
    e, f, d = cfg.num_experts, cfg.intermediate_size, cfg.hidden_size
    return torch.randn(e, 2 * f, d, generator=gen) * 0.05, torch.randn(
        e, d, f, generator=gen
    ) * 0.05


def _dense(moe: Int4MoE) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's w13 and w2 buffers dequantized by tests/dense.py, in float64."""
    q = moe.weights  # the buffers themselves, not copies
    return (
        dequant_f64(q.w13_qdata, q.w13_scale, q.w13_zero_point),
        dequant_f64(q.w2_qdata, q.w2_scale, q.w2_zero_point),
    )


def _module(
    gen: torch.Generator, scheme: Int4Scheme = INT4_SYM_G32, **kw: Any
) -> Int4MoE:
    w13, w2 = _float_weights(gen)
    return Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, scheme=scheme, **kw
    )


def _routed_layer(generator: torch.Generator) -> tuple[Int4MoE, torch.Tensor]:
    """A bf16 layer with a float32 router and correction bias, and an input."""
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13,
        w2_weight=w2,
        config=CFG,
        gate_weight=torch.randn(8, 128, generator=generator),
        e_score_correction_bias=torch.randn(8, generator=generator) * 0.1,
    )
    return moe, torch.randn(16, 128, generator=generator).to(torch.bfloat16)


def _shard_after_one_call(
    generator: torch.Generator,
) -> tuple[Int4MoE, torch.Tensor, torch.Tensor]:
    """Experts 2 and 3 of 8 held here (local 0 and 1), after a first call."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13[:2], w2[:2], INT4_SYM_G32)
    emap = torch.tensor([-1, -1, 0, 1, -1, -1, -1, -1], dtype=torch.int32)
    moe = Int4MoE.from_quantized(q, config=CFG, expert_map=emap)
    x = torch.randn(4, 128, generator=generator)
    logits = torch.randn(4, 8, generator=generator)
    moe(x, router_logits=logits)
    return moe, x, logits
