"""ReferenceBackend: pure torch on any device, the numerical truth.

May import core only. Shape legend: ``T`` tokens, ``D`` hidden size.
"""

from typing import final

import attrs
import torch

from backends.base import DeviceInfo, PreparedExperts, Support, check_prepared
from core.config import MoEConfig
from core.layout import WeightLayout
from core.reference import moe_forward_reference
from core.routing import Routing
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights


@final
@attrs.frozen(kw_only=True, eq=False)
class ReferencePrepared(PreparedExperts):
    """The canonical weights as they are: the reference needs no repacking."""

    def serves(self, dtype: torch.dtype) -> bool:
        """Every dtype: nothing here depends on the input's."""
        del dtype
        return True


@final
class ReferenceBackend:
    """Float32 math on the int4 weights, one dequantized expert at a time.

    Runs on any device and supports every scheme, dtype and activation; it is the
    last resort of ``select_backend`` and the oracle of the conformance tests.
    """

    @property
    def name(self) -> str:
        """``reference``."""
        return "reference"

    def supports(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        layout: WeightLayout,
        device: DeviceInfo,
        *,
        dtype: torch.dtype,
    ) -> Support:
        """Always supported."""
        del config, scheme, layout, device, dtype
        return Support.yes()

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> ReferencePrepared:
        """Keep a reference to the canonical weights."""
        return ReferencePrepared(weights=weights, config=config, dtype=dtype)

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        """``moe_forward_reference`` on the prepared weights."""
        ready = check_prepared(prepared, ReferencePrepared, self.name)
        return moe_forward_reference(hidden_TD, ready.weights, routing, ready.config)
