"""CPU doubles of vllm-xpu-kernels' ``XpuFusedMoe`` and IPEX's ``GatedMLPMOE``.

Written from the documented upstream contracts (backends/xpu/vllm_kernels.py and
backends/xpu/ipex.py docstrings), not from our backend: they detect int4 from the
dtype, rewrite the weights they are handed in place, and compute from the rewritten
bytes, so a backend that passes shared tensors or the wrong layout gives wrong answers.
Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``H`` = 2F, ``E`` experts,
``K`` top_k, ``P`` packed reduction dim.
"""

import functools
from collections.abc import Callable

import attrs
import torch
import torch.nn.functional as F

from backends.xpu.ipex import GatedMLPMOEFactory
from backends.xpu.vllm_kernels import XpuFusedMoeFactory


def to_twos_complement(qdata: torch.Tensor) -> torch.Tensor:
    """Upstream ``implement_zp``: nibble ``q`` (offset 8) becomes ``(q - 8) & 0xF``; int8."""
    low = (qdata & 0x0F).to(torch.int16) - 8
    high = (qdata >> 4).to(torch.int16) - 8
    return (((high & 0xF) << 4) | (low & 0xF)).to(torch.uint8).view(torch.int8)


def decode_twos_complement(q_int8: torch.Tensor) -> torch.Tensor:
    """``(..., P)`` int8 of signed nibbles, low first, to float32 ``(..., 2P)``."""
    b = q_int8.view(torch.uint8).to(torch.int16)
    low, high = b & 0xF, b >> 4
    low = torch.where(low >= 8, low - 16, low)
    high = torch.where(high >= 8, high - 16, high)
    return torch.stack([low, high], dim=-1).flatten(-2).float()


def dequantize_signed(q_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Signed codes times one scale per group, float32 ``(E, N, K)``."""
    codes = decode_twos_complement(q_int8)
    group = codes.shape[-1] // scale.shape[-1]
    return codes * scale.float().repeat_interleave(group, dim=-1)


def _activate(h_NH: torch.Tensor, activation: str) -> torch.Tensor:
    half = h_NH.shape[-1] // 2
    if activation == "swigluoai":
        # Upstream swigluoai_and_mul: interleaved rows, alpha 1.702, limit 7.0.
        gate = h_NH[..., ::2].clamp(max=7.0)
        up = h_NH[..., 1::2].clamp(min=-7.0, max=7.0)
        return (up + 1) * gate * torch.sigmoid(1.702 * gate)
    gate, up = h_NH[..., :half], h_NH[..., half:]
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu":
        return F.gelu(gate) * up
    assert activation == "gelu_tanh", activation
    return F.gelu(gate, approximate="tanh") * up


def fused_moe(
    hidden_TD: torch.Tensor,
    w13_EHD: torch.Tensor,
    w2_EDF: torch.Tensor,
    routing: tuple[torch.Tensor, torch.Tensor],
    activation: str,
) -> torch.Tensor:
    """``sum_k w * expert(x)`` with kernel-like roundings to the hidden dtype; id -1 skipped."""
    weights_TK, ids_TK = routing
    dtype = hidden_TD.dtype
    out_TD = torch.zeros(hidden_TD.shape, dtype=torch.float32)
    for t in range(ids_TK.shape[0]):
        for k in range(ids_TK.shape[1]):
            e = int(ids_TK[t, k])
            if e < 0:
                continue
            h_H = (w13_EHD[e] @ hidden_TD[t].float()).to(dtype).float()
            a_F = _activate(h_H, activation).to(dtype).float()
            y_D = (w2_EDF[e] @ a_F).to(dtype).float()
            out_TD[t] += float(weights_TK[t, k]) * y_D
    return out_TD.to(dtype)


@attrs.frozen(kw_only=True)
class Received:
    """What a fake saw of one tensor before touching it."""

    tensor: torch.Tensor
    bytes: torch.Tensor
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @classmethod
    def of(cls, t: torch.Tensor) -> "Received":
        return cls(
            tensor=t,
            bytes=t.clone(),
            dtype=t.dtype,
            shape=tuple(t.shape),
            stride=t.stride(),
        )


class FakeXpuFusedMoe:
    """``XpuFusedMoe`` from its contract; keyword-only, with the upstream names."""

    def __init__(
        self,
        built: list["FakeXpuFusedMoe"],
        *,
        w13: torch.Tensor,
        w13_scales: torch.Tensor | None,
        w13_bias: torch.Tensor | None,
        w2: torch.Tensor,
        w2_scales: torch.Tensor | None,
        w2_bias: torch.Tensor | None,
        n_experts_per_token: int,
        activation: str,
        num_experts: int,
        ep_rank: int = 0,
        ep_size: int = 1,
        expert_map: torch.Tensor | None = None,
        gemm1_clamp_limit: float | None = None,
    ) -> None:
        assert w13.is_contiguous()
        assert w2.is_contiguous()
        assert w13_scales is not None
        assert w2_scales is not None
        assert (w13_bias, w2_bias, expert_map, gemm1_clamp_limit) == (None,) * 4
        assert (ep_rank, ep_size) == (0, 1)
        self.received = {
            name: Received.of(t)
            for name, t in (
                ("w13", w13),
                ("w13_scales", w13_scales),
                ("w2", w2),
                ("w2_scales", w2_scales),
            )
        }
        self.is_int4 = w13.dtype == torch.uint8
        for q, sc in ((w13, w13_scales), (w2, w2_scales)):  # the documented contract
            assert q.shape[1] % 8 == 0, f"N % 8 != 0: {tuple(q.shape)}"
            assert 2 * q.shape[2] // sc.shape[2] in (32, 64, 128, 256), sc.shape
            assert sc.dtype in (torch.bfloat16, torch.float16), sc.dtype
        if self.is_int4 and not hasattr(w13, "xpu_fused_moe"):
            w13.data = to_twos_complement(w13)
            w2.data = to_twos_complement(w2)
            w13.xpu_fused_moe = True  # type: ignore[attr-defined]  # upstream's marker attribute
        self.w13, self.w2 = w13, w2
        self.w13_scales, self.w2_scales = w13_scales, w2_scales
        self.top_k, self.activation, self.num_experts = (
            n_experts_per_token,
            activation,
            num_experts,
        )
        self.applied: list[tuple[torch.Tensor, torch.Tensor]] = []
        built.append(self)

    def apply(
        self,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        expert_map: torch.Tensor | None = None,
        a1q_scale: torch.Tensor | None = None,
    ) -> None:
        assert self.is_int4
        assert expert_map is None
        assert a1q_scale is None
        assert topk_weights.dtype == torch.float32  # moe_gather's TORCH_CHECK
        assert topk_ids.dtype in (torch.int32, torch.int64)
        assert topk_ids.shape[1] == self.top_k
        assert hidden_states.dtype in (torch.bfloat16, torch.float16)
        assert (
            self.w13_scales.dtype == hidden_states.dtype
        )  # scales in activation dtype
        assert not topk_ids.numel() or int(topk_ids.min()) >= 0, (
            "ids of -1 are outside the contract"
        )
        self.applied.append((topk_weights.clone(), topk_ids.clone()))
        w13 = dequantize_signed(self.w13, self.w13_scales)
        w2 = dequantize_signed(self.w2, self.w2_scales)
        routing = (topk_weights, topk_ids)
        output.copy_(fused_moe(hidden_states, w13, w2, routing, self.activation))


@attrs.define
class FakeXpuKernels:
    """Loader of ``FakeXpuFusedMoe``; ``error`` makes the import fail."""

    error: str | None = None
    built: list[FakeXpuFusedMoe] = attrs.field(factory=list)
    xe2_or_xe3: bool = True
    """What the GPU-architecture check answers (the int4 kernel needs Xe2 / Xe3)."""

    def load(self) -> XpuFusedMoeFactory:
        if self.error is not None:
            raise ImportError(self.error)
        return functools.partial(FakeXpuFusedMoe, self.built)

    def int4_arch(self, index: int | None) -> bool:
        del index
        return self.xe2_or_xe3


def decode_int32_offset8(q_EN_: torch.Tensor) -> torch.Tensor:
    """int32 words, element ``i`` at bits ``4i..4i+3`` (LSB first), codes minus 8."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    codes = (q_EN_.unsqueeze(-1) >> shifts) & 0xF
    return codes.flatten(-2).float() - 8


class FakeGatedMLPMOE:
    """IPEX XPU ``GatedMLPMOE(is_int4=True)`` from its contract."""

    def __init__(
        self,
        built: list["FakeGatedMLPMOE"],
        W13: torch.Tensor,
        W2: torch.Tensor,
        *,
        w1_scale_inv: torch.Tensor,
        w2_scale_inv: torch.Tensor,
        is_int4: bool,
    ) -> None:
        assert is_int4
        assert W13.dtype == torch.int32
        assert W2.dtype == torch.int32
        self.received = {"W13": Received.of(W13), "W2": Received.of(W2)}
        g13 = W13.shape[-1] * 8 // w1_scale_inv.shape[-1]
        g2 = W2.shape[-1] * 8 // w2_scale_inv.shape[-1]
        self.w13 = decode_int32_offset8(W13) * w1_scale_inv.float().repeat_interleave(
            g13, -1
        )
        self.w2 = decode_int32_offset8(W2) * w2_scale_inv.float().repeat_interleave(
            g2, -1
        )
        # Upstream repacks and frees the originals: the tensors it was given change.
        W13.data = W13.transpose(1, 2).contiguous()
        W2.data = W2.transpose(1, 2).contiguous()
        w1_scale_inv.data = w1_scale_inv.transpose(1, 2).contiguous()
        w2_scale_inv.data = w2_scale_inv.transpose(1, 2).contiguous()
        built.append(self)

    def __call__(
        self,
        *,
        hidden_states: torch.Tensor,
        use_grouped_topk: bool,
        top_k: int,
        router_logits: torch.Tensor,
        renormalize: bool,
        custom_routing_function: Callable[..., tuple[torch.Tensor, torch.Tensor]],
        activation: str,
    ) -> torch.Tensor:
        assert not use_grouped_topk
        assert not renormalize
        weights_TK, ids_TK = custom_routing_function(
            hidden_states=hidden_states,
            gating_output=router_logits,
            topk=top_k,
            renormalize=False,
        )
        assert ids_TK.dtype == torch.int32
        assert weights_TK.dtype == torch.float32
        assert ids_TK.shape[1] == top_k  # upstream sizes its buffers by top_k
        return fused_moe(
            hidden_states, self.w13, self.w2, (weights_TK, ids_TK), activation
        )


@attrs.define
class FakeIPEX:
    """Loader of ``FakeGatedMLPMOE``; ``error`` makes the import fail."""

    error: str | None = None
    built: list[FakeGatedMLPMOE] = attrs.field(factory=list)

    def load(self) -> GatedMLPMOEFactory:
        if self.error is not None:
            raise ImportError(self.error)
        return functools.partial(FakeGatedMLPMOE, self.built)
