"""XPUFusedBackend: fused W4A16 MoE on Intel XPU (vLLM's XPUExpertsWNA16 equivalent).

Providers, in order: vllm-xpu-kernels ``XpuFusedMoe``; IPEX ``GatedMLPMOE`` int4 (only if
it imports); then the ``triton-w4a16`` backend through the registry (Intel's Triton).
Not yet validated on Intel hardware. Shape legend: ``T`` tokens, ``D`` hidden size,
``F`` intermediate size, ``E`` experts, ``K`` top_k. Heavy imports live in backends/xpu/.
"""

import logging
from collections.abc import Sequence
from typing import Final, final

import attrs
import torch

from backends.base import (
    DeviceInfo,
    MoEBackend,
    PreparedExperts,
    Support,
    check_prepared,
)
from backends.registry import create_backend
from backends.xpu.ipex import IPEXGatedMLPMOEProvider
from backends.xpu.providers import FusedExperts, ProviderWeights, XPUProvider
from backends.xpu.vllm_kernels import VllmXpuKernelsProvider
from core.config import MoEConfig
from core.errors import BackendUnavailableError
from core.layout import CANONICAL_LAYOUT, WeightLayout
from core.routing import Routing
from core.scheme import Int4Scheme
from core.validate import check_cast_fits
from core.weights import QuantizedExpertWeights

logger = logging.getLogger(__name__)

XPU_GROUP_SIZES: Final = (32, 64, 128, 256)
XPU_DTYPES: Final = (torch.bfloat16, torch.float16)
TRITON_DELEGATE: Final = "triton-w4a16"


@final
@attrs.frozen(kw_only=True, eq=False)
class XPUFusedPrepared(PreparedExperts):
    """The layer as one provider holds it, or as the Triton delegate prepared it.

    Attributes:
        provider: name of the provider (or delegate backend) that runs the layer.
        experts: the built provider kernel (``None`` when delegated).
        delegate: the delegate backend and its prepared form (``None`` otherwise).
    """

    provider: str
    experts: FusedExperts | None = None
    delegate: tuple[MoEBackend, PreparedExperts] | None = None

    def serves(self, dtype: torch.dtype) -> bool:
        """The delegate's answer, else ``self.dtype`` only (the provider's scales)."""
        if self.delegate is not None:
            return self.delegate[1].serves(dtype)
        return dtype == self.dtype


def _request_refusal(
    config: MoEConfig,
    scheme: Int4Scheme,
    layout: WeightLayout,
    device: DeviceInfo,
    dtype: torch.dtype,
) -> str | None:
    """Why no XPU int4 path can run this request, or ``None``."""
    if device.type != "xpu":
        return f"device must be `xpu`, got `{device.type}`"
    return _content_refusal(config, scheme, layout, dtype)


def _content_refusal(
    config: MoEConfig, scheme: Int4Scheme, layout: WeightLayout, dtype: torch.dtype
) -> str | None:
    """``_request_refusal`` less the device (``prepare`` checks it on the weights)."""
    if scheme.has_zero_point:
        return f"scheme must be symmetric (no zero points), got {scheme.name}"
    if config.expert_bias:
        return (
            "expert biases (config.expert_bias, gpt-oss) are not passed to the XPU "
            "kernels yet (triton-w4a16 runs them)"
        )
    if scheme.group_size not in XPU_GROUP_SIZES:
        return f"group_size must be one of {XPU_GROUP_SIZES}, got {scheme.group_size}"
    if dtype not in XPU_DTYPES:
        return f"dtype must be torch.bfloat16 or torch.float16, got {dtype}"
    if layout != CANONICAL_LAYOUT:
        return f"layout must be the canonical layout, got {layout}"
    sizes = {
        "2*intermediate_size": 2 * config.intermediate_size,
        "hidden_size": config.hidden_size,
    }
    for what, n in sizes.items():
        if n % 8:
            return f"{what} (a GEMM N) must be a multiple of 8, got {n}"
    for what, k in (
        ("hidden_size", config.hidden_size),
        ("intermediate_size", config.intermediate_size),
    ):
        if k % scheme.group_size:
            return f"{what}={k} must be divisible by group_size={scheme.group_size}"
    return None


def _private_copies(
    weights: QuantizedExpertWeights, dtype: torch.dtype
) -> ProviderWeights:
    """Contiguous clones for a provider that rewrites them in place; scales in ``dtype``.

    Symmetric weights only: ``prepare`` refuses zero points before this.
    """
    if weights.scale_dtype != dtype:
        logger.info(
            "xpu-fused: converting scales from %s to the activation dtype %s (the kernels "
            "read scales in the activation dtype)",
            weights.scale_dtype,
            dtype,
        )

    def qdata(t: torch.Tensor) -> torch.Tensor:
        return t.clone(memory_format=torch.contiguous_format)

    def scale(t: torch.Tensor) -> torch.Tensor:
        check_cast_fits("scales (in the activation dtype the kernels read)", t, dtype)
        return t.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)

    return ProviderWeights(
        w13_qdata=qdata(weights.w13_qdata),
        w13_scale=scale(weights.w13_scale),
        w2_qdata=qdata(weights.w2_qdata),
        w2_scale=scale(weights.w2_scale),
    )


def _provider_inputs(
    hidden_TD: torch.Tensor, routing: Routing, config: MoEConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states, float32 weights and valid int64 ids, as the providers want them.

    The providers always weight the expert outputs and ignore
    ``apply_router_weight_on_input``; with that flag (top_k is 1) the input is scaled
    here and the weights become ones, so nothing is weighted twice. Ids ``-1`` (expert
    held elsewhere) get weight 0 and the id of the token's first held choice, which runs
    on that token anyway; a token with no held choice gets expert 0 and a zero input
    row. This relies only on the weighted sum, not on how a given release treats a
    negative id, and a weight of 0 never meets an overflowed (inf) expert output: 0 * inf
    would be NaN.
    """
    ids_TK = routing.topk_ids.long()
    weights_TK = routing.topk_weights.float()
    x_TD = hidden_TD
    if config.apply_router_weight_on_input:
        # Scale in float32, as the reference does, then round once to the input dtype.
        x_TD = (hidden_TD.float() * weights_TK[:, :1]).to(hidden_TD.dtype)
        weights_TK = torch.ones_like(weights_TK)
    held_TK = ids_TK >= 0
    any_T1 = held_TK.any(dim=1, keepdim=True)
    first_T1 = ids_TK.gather(1, held_TK.int().argmax(dim=1, keepdim=True))  # first True
    stand_in_T1 = torch.where(any_T1, first_T1, torch.zeros_like(first_T1))
    weights_TK = torch.where(held_TK, weights_TK, torch.zeros_like(weights_TK))
    ids_TK = torch.where(held_TK, ids_TK, stand_in_T1)
    x_TD = torch.where(any_T1, x_TD, torch.zeros_like(x_TD))
    return x_TD.contiguous(), weights_TK.contiguous(), ids_TK.contiguous()


@final
class XPUFusedBackend:
    """Fused int4 MoE on Intel XPU through the first provider that can run the layer.

    Args:
        providers: kernel providers in priority order (default: vllm-xpu-kernels, then
            IPEX); tests inject fakes here.
        delegate: registry name of the last-resort backend (``None``: no delegation).
    """

    def __init__(
        self,
        *,
        providers: Sequence[XPUProvider] | None = None,
        delegate: str | None = TRITON_DELEGATE,
    ) -> None:
        if providers is None:
            providers = (VllmXpuKernelsProvider(), IPEXGatedMLPMOEProvider())
        self._providers = tuple(providers)
        self._delegate = delegate

    @property
    def name(self) -> str:
        """``xpu-fused``."""
        return "xpu-fused"

    def supports(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        layout: WeightLayout,
        device: DeviceInfo,
        *,
        dtype: torch.dtype,
    ) -> Support:
        """Supported if the request fits and one provider (or the delegate) can run it."""
        reason = _request_refusal(config, scheme, layout, device, dtype)
        if reason is not None:
            return Support.no(reason)
        reasons: list[str] = []
        for provider in self._providers:
            refusal = provider.refusal(config, dtype=dtype, device=device)
            if refusal is None:
                return Support.yes()
            reasons.append(f"{provider.name}: {refusal}")
        backend, refusal = self._delegate_backend()
        if backend is not None:
            support = backend.supports(config, scheme, layout, device, dtype=dtype)
            if support.ok:
                return support
            refusal = support.reason
        reasons.append(f"{self._delegate or 'delegate'}: {refusal}")
        return Support.no("no provider can run it: " + "; ".join(reasons))

    def _delegate_backend(self) -> tuple[MoEBackend | None, str]:
        if self._delegate is None:
            return None, "no delegate configured"
        if self._delegate == self.name:
            return None, "a backend cannot delegate to itself"
        try:
            return create_backend(self._delegate), ""
        except BackendUnavailableError:
            return None, "not registered"

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> XPUFusedPrepared:
        """Give the first willing provider private copies; else prepare the delegate.

        The module's tensors are never handed to a provider (they rewrite in place).

        Raises:
            BackendUnavailableError: for what ``supports`` refuses whatever the device
                (asymmetric schemes, expert biases, other group sizes or dtypes), and
                if no provider and no delegate is available.
        """
        refusal = _content_refusal(config, weights.scheme, CANONICAL_LAYOUT, dtype)
        if refusal is None and (
            weights.w13_bias is not None or weights.w2_bias is not None
        ):
            refusal = "expert biases are not passed to the XPU kernels yet, got weights with them"
        if refusal is not None:  # supports() says so too; a direct call must not run it
            raise BackendUnavailableError(f"xpu-fused cannot prepare this: {refusal}")
        reasons: list[str] = []
        device = DeviceInfo.of(weights.device)
        for provider in self._providers:
            refusal = provider.refusal(config, dtype=dtype, device=device)
            if refusal is None:
                experts = provider.build(_private_copies(weights, dtype), config)
                return XPUFusedPrepared(
                    weights=weights,
                    config=config,
                    dtype=dtype,
                    provider=provider.name,
                    experts=experts,
                )
            reasons.append(f"{provider.name}: {refusal}")
        backend, refusal = self._delegate_backend()
        if backend is None:
            reasons.append(f"{self._delegate or 'delegate'}: {refusal}")
            raise BackendUnavailableError(
                "xpu-fused has no provider: " + "; ".join(reasons)
            )
        inner = backend.prepare(weights, config, dtype=dtype)
        return XPUFusedPrepared(
            weights=weights,
            config=config,
            dtype=dtype,
            provider=backend.name,
            delegate=(backend, inner),
        )

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        """``(T, D)`` in the dtype of ``hidden_TD``, through the prepared provider."""
        ready = check_prepared(prepared, XPUFusedPrepared, self.name)
        if ready.delegate is not None:
            backend, inner = ready.delegate
            return backend.apply(hidden_TD, inner, routing)
        assert ready.experts is not None  # a prepared form holds one of the two
        x_TD, weights_TK, ids_TK = _provider_inputs(hidden_TD, routing, ready.config)
        return ready.experts(x_TD.to(ready.dtype), weights_TK, ids_TK).to(
            hidden_TD.dtype
        )
