"""Provider: ``vllm_xpu_kernels.fused_moe_interface.XpuFusedMoe`` (vllm-xpu-kernels 0.1.16.2).

Contract read from vllm-project/vllm-xpu-kernels: ``vllm_xpu_kernels/fused_moe_interface.py``,
``csrc/moe/{remap_hidden_states,moe_gather}.cpp`` and the ``swigluoai_and_mul`` kernel:

* int4 is detected from ``w13.dtype == torch.uint8``; weights ``(E, N, K/2)`` in the
  canonical layout, scales ``(E, N, K/G)`` in the activation dtype, symmetric only.
* The constructor rewrites ``w13``/``w2`` in place (``tensor.data = ...``): each nibble
  goes from offset binary (``q``) to two's complement (``q - 8``), i.e. ``byte ^ 0x88``.
* ``apply(output, hidden_states, topk_weights, topk_ids)`` writes
  ``sum_k topk_weights * expert_out`` into ``output``; no renormalization; it never
  scales the input by the router weight. ``topk_weights`` must be float32.
* ``swigluoai`` reads gate/up *interleaved* (``gate = h[..., ::2]``) with alpha 1.702 and
  limit 7.0 hard-coded; ``silu``/``gelu``/``gelu_tanh`` read the halves ``[:F]``/``[F:]``.
* ``moe_gather`` is compiled for top_k in {1, 2, 4, 6, 7, 8, 10, 12, 16} only (the
  0.1.16.2 binaries; older sources list {1, 2, 4, 6, 8, 10}), and at most 1024 experts.
* The int4 grouped GEMM runs only on Xe2 / Xe3 GPUs (``is_xe2_arch()`` /
  ``is_xe3_arch()`` in ``grouped_gemm_interface.cpp``); on other Intel GPUs the call
  falls to a kernel that ignores the scales and reads the packed bytes as bf16, with no
  error. ``torch.ops._xpu_C.is_xe2_arch(index)`` / ``is_xe3_arch`` tell them apart.
* ``VLLM_XPU_FUSED_MOE_USE_REF=1`` sends calls to a reference path that asserts the
  weights are not int4.

Shape legend: ``T`` tokens, ``D`` hidden, ``H`` = 2F, ``E`` experts, ``K`` top_k,
``P`` packed reduction dim, ``G`` groups. vllm_xpu_kernels is imported inside functions.
"""

import os
from collections.abc import Callable
from typing import Final, Protocol, final

import torch

from backends.base import DeviceInfo
from backends.xpu.providers import FusedExperts, ProviderWeights, import_refusal
from core.config import MoEConfig

SWIGLUOAI_ALPHA: Final = 1.702
SWIGLUOAI_LIMIT: Final = 7.0
SUPPORTED_TOP_K: Final = (1, 2, 4, 6, 7, 8, 10, 12, 16)
MAX_EXPERTS: Final = 1024
REFERENCE_ENV: Final = "VLLM_XPU_FUSED_MOE_USE_REF"
REFERENCE_ENV_ON: Final = frozenset({"1", "ON", "TRUE", "YES", "Y"})
"""Values (stripped, upper-cased) that turn the kernel's reference path on, as
vllm-xpu-kernels 0.1.16.2 reads ``REFERENCE_ENV``; anything else leaves the int4 kernel."""


class XpuFusedMoeLike(Protocol):
    """What the backend calls on a built ``XpuFusedMoe``."""

    def apply(
        self,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> object:
        """Write the MoE output into ``output``."""
        ...


XpuFusedMoeFactory = Callable[..., XpuFusedMoeLike]
"""``XpuFusedMoe`` itself, or a test double with the same keyword arguments."""


def load_xpu_fused_moe() -> XpuFusedMoeFactory:
    """Import ``XpuFusedMoe`` (lazily).

    Raises:
        ImportError: if the package, its SYCL libraries or its MoE ops are missing.
    """
    from vllm_xpu_kernels import fused_moe_interface

    # Some releases import their compiled ops in a try block and record the failure
    # here instead of raising; treat that as an import failure too.
    if not getattr(fused_moe_interface, "FUSEDMOE_AVAILABLE", True):
        reason = getattr(fused_moe_interface, "FUSEDMOE_UNAVAILABLE_REASON", "")
        raise ImportError(f"vllm_xpu_kernels MoE ops are unavailable: {reason}")
    return fused_moe_interface.XpuFusedMoe


Int4Arch = Callable[[int | None], bool]
"""Whether the XPU of this index (``None``: the current one) runs the int4 kernel."""


def xe2_or_xe3(index: int | None) -> bool:
    """Whether the XPU at ``index`` is Xe2 or Xe3 (vllm-xpu-kernels' own ops).

    ``False`` where the ops are missing (the package not loaded, or an older build):
    the int4 path is then not known to be safe.
    """
    try:
        is_xe2, is_xe3 = torch.ops._xpu_C.is_xe2_arch, torch.ops._xpu_C.is_xe3_arch
    except (AttributeError, RuntimeError):
        return False
    device = torch.xpu.current_device() if index is None else index
    return bool(is_xe2(device)) or bool(is_xe3(device))


def interleave_gate_up(w_EH_: torch.Tensor) -> torch.Tensor:
    """Rows ``[g0..g(F-1), u0..u(F-1)]`` to ``[g0, u0, g1, u1, ...]`` along dim 1."""
    e, h = w_EH_.shape[0], w_EH_.shape[1]
    halves = w_EH_.reshape(e, 2, h // 2, *w_EH_.shape[2:])
    return halves.transpose(1, 2).reshape(w_EH_.shape).contiguous()


@final
class _VllmFusedExperts:
    """A built ``XpuFusedMoe`` called with the backend's routing."""

    def __init__(self, moe: XpuFusedMoeLike) -> None:
        self._moe = moe

    def __call__(
        self,
        hidden_TD: torch.Tensor,
        topk_weights_TK: torch.Tensor,
        topk_ids_TK: torch.Tensor,
    ) -> torch.Tensor:
        out_TD = torch.empty_like(hidden_TD)
        self._moe.apply(
            output=out_TD,
            hidden_states=hidden_TD,
            topk_weights=topk_weights_TK,
            topk_ids=topk_ids_TK,
        )
        return out_TD


@final
class VllmXpuKernelsProvider:
    """vllm-xpu-kernels' ``XpuFusedMoe`` (W4A16 symmetric, groups 32..256).

    Args:
        load: returns the ``XpuFusedMoe`` class; the seam through which tests inject a
            fake written from the contract above.
        int4_arch: whether an XPU index runs the int4 kernel (Xe2 / Xe3); asked after
            the import, which registers the ops it reads.
    """

    def __init__(
        self,
        *,
        load: Callable[[], XpuFusedMoeFactory] = load_xpu_fused_moe,
        int4_arch: Int4Arch = xe2_or_xe3,
    ) -> None:
        self._load = load
        self._int4_arch = int4_arch

    @property
    def name(self) -> str:
        """``vllm_xpu_kernels.XpuFusedMoe``."""
        return "vllm_xpu_kernels.XpuFusedMoe"

    def refusal(
        self, config: MoEConfig, *, dtype: torch.dtype, device: DeviceInfo
    ) -> str | None:
        """Top-k, experts, swigluoai constants, the reference path, import, GPU."""
        del dtype
        if config.top_k not in SUPPORTED_TOP_K:
            return f"top_k must be one of {SUPPORTED_TOP_K}, got {config.top_k}"
        if config.num_experts > MAX_EXPERTS:
            return f"num_experts must be <= {MAX_EXPERTS}, got {config.num_experts}"
        value = os.environ.get(REFERENCE_ENV, "")
        if value.strip().upper() in REFERENCE_ENV_ON:
            return f"{REFERENCE_ENV}={value!r} turns on its reference path, which has no int4"
        fixed = (SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT)
        if (
            config.activation == "swigluoai"
            and (
                config.swiglu_alpha,
                config.swiglu_limit,
            )
            != fixed
        ):
            return (
                f"swigluoai needs (swiglu_alpha, swiglu_limit)={fixed} (hard-coded in the "
                f"kernel), got ({config.swiglu_alpha}, {config.swiglu_limit})"
            )
        reason = import_refusal(self._load, "vllm_xpu_kernels")
        if reason is not None:
            return reason
        if not self._int4_arch(device.index):
            return (
                "the int4 kernel runs only on Xe2 / Xe3 GPUs (elsewhere it would read "
                "int4 as bf16 without an error), and "
                f"{device.name or 'this XPU'} is not one"
            )
        return None

    def build(self, weights: ProviderWeights, config: MoEConfig) -> FusedExperts:
        """Construct ``XpuFusedMoe`` (it rewrites ``weights``' qdata in place)."""
        w13_qdata, w13_scale = weights.w13_qdata, weights.w13_scale
        if config.activation == "swigluoai":
            # The kernel's swigluoai reads gate/up interleaved; ours are halves. The
            # copies are private, so reorder rows here, once (scales move with them).
            w13_qdata = interleave_gate_up(w13_qdata)
            w13_scale = interleave_gate_up(w13_scale)
        moe = self._load()(
            w13=w13_qdata,
            w13_scales=w13_scale,
            w13_bias=None,
            w2=weights.w2_qdata,
            w2_scales=weights.w2_scale,
            w2_bias=None,
            n_experts_per_token=config.top_k,
            activation=config.activation,
            num_experts=weights.num_experts,
        )
        return _VllmFusedExperts(moe)
