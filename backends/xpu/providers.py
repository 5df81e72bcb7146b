"""The provider seam of the XPU fused backend: what a fused int4 MoE kernel must offer.

Shape legend: ``T`` tokens, ``D`` hidden size, ``F`` intermediate size, ``H`` = 2F,
``E`` experts, ``K`` top_k, ``P`` packed reduction dim (reduction / 2), ``G`` groups
along the reduction dim. May import core and ``backends.base``.
"""

from collections.abc import Callable
from typing import Protocol

import attrs
import torch

from backends.base import DeviceInfo
from core.config import MoEConfig


@attrs.frozen(kw_only=True, eq=False)
class ProviderWeights:
    """Private, contiguous copies of the canonical int4 tensors (see the README).

    A provider owns these tensors: upstream kernels rewrite their weights in place, so
    they must never alias the module's buffers.

    Attributes:
        w13_qdata: uint8 ``(E, H, D/2)``, gate rows ``[0:F]``, up rows ``[F:H]``, codes
            with offset 8 (``value = (q - 8) * scale``), element ``2j`` in the low nibble.
        w13_scale: ``(E, H, D/G)`` in the activation dtype.
        w2_qdata: uint8 ``(E, D, F/2)``.
        w2_scale: ``(E, D, F/G)`` in the activation dtype.
    """

    w13_qdata: torch.Tensor
    w13_scale: torch.Tensor
    w2_qdata: torch.Tensor
    w2_scale: torch.Tensor

    @property
    def num_experts(self) -> int:
        """``E``."""
        return int(self.w13_qdata.shape[0])


class FusedExperts(Protocol):
    """A built kernel: the expert math of one layer, routing given."""

    def __call__(
        self,
        hidden_TD: torch.Tensor,
        topk_weights_TK: torch.Tensor,
        topk_ids_TK: torch.Tensor,
    ) -> torch.Tensor:
        """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t])``, ``(T, D)``.

        Args:
            hidden_TD: contiguous activations in the prepared dtype.
            topk_weights_TK: float32 weights, used as given (no renormalization).
            topk_ids_TK: int64 local expert ids, all in ``[0, E)``.
        """
        ...


class XPUProvider(Protocol):
    """One source of a fused int4 MoE kernel for Intel XPU."""

    @property
    def name(self) -> str:
        """Human-readable provider name, used in refusal reasons."""
        ...

    def refusal(
        self, config: MoEConfig, *, dtype: torch.dtype, device: DeviceInfo
    ) -> str | None:
        """Why this provider cannot run ``config`` with ``dtype`` on ``device``.

        ``None``: it can. Imports the provider's package lazily; a failed import is a
        reason.
        """
        ...

    def build(self, weights: ProviderWeights, config: MoEConfig) -> FusedExperts:
        """Hand ``weights`` (private copies, rewritten in place if needed) to the kernel."""
        ...


def import_refusal(load: Callable[[], object], package: str) -> str | None:
    """``load()``, its failure as a refusal reason (``None`` when it imports).

    Besides ``ImportError`` and ``OSError`` (missing package or libraries), a
    package's own import-time guard may raise anything or call ``exit`` (IPEX 2.8
    meeting another torch calls ``os.exit``, later sources ``exit(127)``): every such
    failure is a reason to refuse, never a crash of the backend selection.
    """
    try:
        load()
    except (ImportError, OSError) as err:
        return f"{package} is not importable: {err}"
    except (Exception, SystemExit) as err:  # a guard of the package's own
        return f"{package} is not importable: {type(err).__name__}: {err}"
    return None
