"""One small MoE layer's known int4 weights as checkpoint states, in each format.

Shared by test_checkpoint.py, test_checkpoint_source.py and test_checkpoint_layout.py.
"""

import torch

from core.config import MoEConfig
from core.formats import export_expert_weights
from core.packing import unpack_int4
from core.quantize import quantize_expert_weights
from core.scheme import INT4_ASYM_G32, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.core.formats.packers import awq_pack, gptq_pack
from tests.tolerances import EXACT

CFG = MoEConfig(num_experts=3, top_k=2, hidden_size=64, intermediate_size=32)
PREFIX = "model.layers.1.mlp"


def quantized_weights(
    gen: torch.Generator, scheme: Int4Scheme
) -> QuantizedExpertWeights:
    w13 = torch.randn(3, 64, 64, generator=gen)
    w2 = torch.randn(3, 64, 32, generator=gen)
    return quantize_expert_weights(w13, w2, scheme, scale_dtype=torch.float16)


def assert_same(a: QuantizedExpertWeights, b: QuantizedExpertWeights) -> None:
    assert a.scheme == b.scheme
    assert a.tensors().keys() == b.tensors().keys()
    for name, tensor in a.tensors().items():
        torch.testing.assert_close(b.tensors()[name], tensor, **EXACT)


def _projections(
    w: QuantizedExpertWeights, e: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(codes (N, K), scale (N, G), zero (N, G)) of gate, up and down of expert e."""
    f = w.intermediate_size
    codes13, codes2 = unpack_int4(w.w13_qdata[e]), unpack_int4(w.w2_qdata[e])
    z13 = (
        w.w13_zero_point[e]
        if w.w13_zero_point is not None
        else torch.full_like(w.w13_scale[e], 8, dtype=torch.uint8)
    )
    z2 = (
        w.w2_zero_point[e]
        if w.w2_zero_point is not None
        else torch.full_like(w.w2_scale[e], 8, dtype=torch.uint8)
    )
    return {
        "gate_proj": (codes13[:f], w.w13_scale[e, :f], z13[:f]),
        "up_proj": (codes13[f:], w.w13_scale[e, f:], z13[f:]),
        "down_proj": (codes2, w.w2_scale[e], z2),
    }


def gptq_state(
    w: QuantizedExpertWeights, *, v1: bool = True
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for e in range(w.num_experts):
        for proj, (codes, scale, zero) in _projections(w, e).items():
            qweight, qzeros = gptq_pack(codes.T.long(), zero.T.long(), v1=v1)
            k = codes.shape[1]
            name = f"{PREFIX}.experts.{e}.{proj}"
            out |= {
                f"{name}.qweight": qweight,
                f"{name}.qzeros": qzeros,
                f"{name}.scales": scale.T.contiguous(),
                f"{name}.g_idx": torch.arange(k, dtype=torch.int32) // 32,
            }
    return out


def awq_state(w: QuantizedExpertWeights) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for e in range(w.num_experts):
        for proj, (codes, scale, zero) in _projections(w, e).items():
            qweight, qzeros = awq_pack(codes.T.long(), zero.T.long())
            name = f"{PREFIX}.experts.{e}.{proj}"
            out |= {
                f"{name}.qweight": qweight,
                f"{name}.qzeros": qzeros,
                f"{name}.scales": scale.T.contiguous(),
            }
    return out


def ct_state(
    w: QuantizedExpertWeights,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> dict[str, torch.Tensor]:
    return export_expert_weights(w, prefix=f"{PREFIX}.experts", names=names)


def asymmetric_export(gen: torch.Generator) -> dict[str, torch.Tensor]:
    w = quantize_expert_weights(
        torch.randn(3, 64, 64, generator=gen),
        torch.randn(3, 64, 32, generator=gen),
        INT4_ASYM_G32,
        scale_dtype=torch.float16,
    )
    return export_expert_weights(w, prefix=f"{PREFIX}.experts")
