"""Provider: IPEX's XPU ``GatedMLPMOE`` int4 path (archived; legacy torch 2.8 + IPEX users).

Contract read from intel/intel-extension-for-pytorch (``_IPEXGatedMLPMOEXPU``) and
vLLM's IPEX int4 MoE method: ``GatedMLPMOE(W13, W2, w1_scale_inv=, w2_scale_inv=,
is_int4=True)`` takes the canonical bytes viewed as int32 ``(E, N, K/8)`` and scales
``(E, N, K/G)``, symmetric only; it overwrites ``W13.data``/``W2.data`` and the scale
tensors' ``.data``. Its forward routes by itself unless given
``custom_routing_function``, which we use to pass our routing; its arguments are passed
by keyword (the CPU and XPU variants order them differently). Only `silu` is used here.

Shape legend: ``T`` tokens, ``E`` experts, ``K`` top_k. IPEX is imported inside functions.
"""

from collections.abc import Callable
from typing import Protocol, final

import torch

from backends.base import DeviceInfo
from backends.xpu.providers import FusedExperts, ProviderWeights, import_refusal
from core.config import MoEConfig


class GatedMLPMOELike(Protocol):
    """What the backend calls on a built ``GatedMLPMOE``."""

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
        """The MoE output ``(T, D)``."""
        ...


GatedMLPMOEFactory = Callable[..., GatedMLPMOELike]
"""``ipex.llm.modules.GatedMLPMOE`` itself, or a test double."""


def load_gated_mlp_moe() -> GatedMLPMOEFactory:
    """Import ``GatedMLPMOE`` (lazily; IPEX demands torch 2.8.x at import).

    Raises:
        ImportError: if IPEX is missing or built for another torch (checked from its
            package metadata first: IPEX's own check exits the process).
    """
    _check_ipex_torch()
    from intel_extension_for_pytorch.llm.modules import GatedMLPMOE

    return GatedMLPMOE


def _check_ipex_torch() -> None:
    """Raise ``ImportError`` if the installed IPEX wants another torch major.minor."""
    from importlib import metadata

    try:
        version = metadata.version("intel_extension_for_pytorch")
    except metadata.PackageNotFoundError:
        return  # not installed: the import raises ModuleNotFoundError
    wanted, found = version.split(".")[:2], torch.__version__.split(".")[:2]
    if wanted != found:
        raise ImportError(
            f"intel_extension_for_pytorch {version} needs torch {'.'.join(wanted)}.*, "
            f"got torch {torch.__version__}"
        )


@final
class _IPEXFusedExperts:
    """A built ``GatedMLPMOE`` fed with the backend's routing."""

    def __init__(self, moe: GatedMLPMOELike, *, num_experts: int) -> None:
        self._moe = moe
        self._num_experts = num_experts

    def __call__(
        self,
        hidden_TD: torch.Tensor,
        topk_weights_TK: torch.Tensor,
        topk_ids_TK: torch.Tensor,
    ) -> torch.Tensor:
        ids_TK = topk_ids_TK.to(torch.int32)

        def routing(**_: object) -> tuple[torch.Tensor, torch.Tensor]:
            return topk_weights_TK, ids_TK

        # The logits are never read: custom_routing_function supplies the routing.
        logits_TE = torch.zeros(
            hidden_TD.shape[0],
            self._num_experts,
            dtype=torch.float32,
            device=hidden_TD.device,
        )
        return self._moe(
            hidden_states=hidden_TD,
            use_grouped_topk=False,
            top_k=int(topk_ids_TK.shape[1]),
            router_logits=logits_TE,
            renormalize=False,
            custom_routing_function=routing,
            activation="silu",
        )


@final
class IPEXGatedMLPMOEProvider:
    """IPEX's XPU ``GatedMLPMOE(is_int4=True)``; used only if IPEX imports.

    Args:
        load: returns the ``GatedMLPMOE`` class (test seam).
    """

    def __init__(
        self, *, load: Callable[[], GatedMLPMOEFactory] = load_gated_mlp_moe
    ) -> None:
        self._load = load

    @property
    def name(self) -> str:
        """``intel_extension_for_pytorch.GatedMLPMOE``."""
        return "intel_extension_for_pytorch.GatedMLPMOE"

    def refusal(
        self, config: MoEConfig, *, dtype: torch.dtype, device: DeviceInfo
    ) -> str | None:
        """Activation, then the import."""
        del dtype, device
        if config.activation != "silu":
            return f"activation must be `silu` for IPEX int4, got {config.activation!r}"
        return import_refusal(self._load, "intel_extension_for_pytorch")

    def build(self, weights: ProviderWeights, config: MoEConfig) -> FusedExperts:
        """Construct ``GatedMLPMOE`` on int32 views of the private copies."""
        del config
        moe = self._load()(
            weights.w13_qdata.view(torch.int32),
            weights.w2_qdata.view(torch.int32),
            w1_scale_inv=weights.w13_scale,
            w2_scale_inv=weights.w2_scale,
            is_int4=True,
        )
        return _IPEXFusedExperts(moe, num_experts=weights.num_experts)
