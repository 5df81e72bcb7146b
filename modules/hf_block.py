"""Int4SparseMoeBlock: a transformers sparse MoE block with its routed experts in int4.

Also ``RoutingMode`` and the names a block's router goes by. May import core and
modules.int4_moe. Shape legend: ``T`` tokens, ``D`` hidden, ``E`` experts, ``K`` top_k.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypeAlias

import torch
from torch import nn

from core.errors import ConfigError
from modules.int4_moe import Int4MoE

RoutingMode: TypeAlias = Literal["model", "config"]
"""Where an ``Int4SparseMoeBlock`` takes its top-k from (see its ``routing``)."""

ROUTER_NAMES = ("gate", "router")
"""The attribute names a transformers sparse MoE block keeps its router under."""


class Int4SparseMoeBlock(nn.Module):
    """A transformers sparse MoE block with its routed experts in int4.

    The float router (under its original name, so its output recorders still fire)
    and the float shared experts stay as they were; ``experts`` is an
    :class:`~modules.int4_moe.Int4MoE`. ``forward`` returns what the original block
    returned: the hidden states, or ``(hidden, router_scores)`` for gpt-oss.

    Args:
        router: the block's router module, returning ``(logits, weights, ids)``.
        router_name: its attribute name (``gate`` or ``router``).
        experts: the int4 experts.
        shared: optional ``{name: module}`` of ``shared_expert(s)`` and
            ``shared_expert_gate`` (Qwen2-MoE's sigmoid gate on the shared expert).
        routing: `model` uses the router's own top-k weights and ids (exactly the
            model's semantics); `config` routes the logits with ``experts.config``
            (and ``experts``' copy of a correction bias, made at replacement: update
            it with the router's).
        returns_router_scores: return ``(hidden, router_scores)`` like gpt-oss.
        jitter_noise: Mixtral's ``router_jitter_noise``: in training mode the hidden
            states are scaled by uniform noise in ``[1 - j, 1 + j]`` before the router
            and experts, as the original block does (0: never).
    """

    def __init__(
        self,
        *,
        router: nn.Module,
        router_name: str,
        experts: Int4MoE,
        shared: Mapping[str, nn.Module],
        routing: RoutingMode = "model",
        returns_router_scores: bool = False,
        jitter_noise: float = 0.0,
    ) -> None:
        super().__init__()
        if routing not in ("model", "config"):
            raise ConfigError(f"routing must be `model` or `config`, got {routing!r}")
        self.router_name = router_name
        self.add_module(router_name, router)
        self.experts = experts
        for name, module in shared.items():
            self.add_module(name, module)
        self.shared_names = tuple(n for n in shared if n != "shared_expert_gate")
        self.routing = routing
        self.returns_router_scores = returns_router_scores
        self.jitter_noise = float(jitter_noise)
        # The router's own top-k over the experts makes the ids: in range by
        # construction, so the layer skips its per-call check (Int4MoE.check_topk_ids).
        experts.check_topk_ids = routing != "model"

    if TYPE_CHECKING:

        def __call__(
            self, hidden_states: torch.Tensor
        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            """Typed twin of ``forward`` so strict mypy sees its result type."""
            ...

    def forward(
        self, hidden_states: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``(..., D)`` to ``(..., D)`` (gpt-oss: also the router scores ``(T, K)``)."""
        if self.training and self.jitter_noise > 0:
            j = self.jitter_noise
            noise = torch.empty_like(hidden_states).uniform_(1.0 - j, 1.0 + j)
            hidden_states = hidden_states * noise
        x_TD = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits_TE, weights_TK, ids_TK = self.get_submodule(self.router_name)(x_TD)
        if self.routing == "model":
            out_TD = self.experts(x_TD, topk_weights=weights_TK, topk_ids=ids_TK)
        else:
            out_TD = self.experts(x_TD, logits_TE)
        for name in self.shared_names:
            shared_TD = self.get_submodule(name)(x_TD)
            gate = self._modules.get("shared_expert_gate")
            if gate is not None:
                shared_TD = torch.sigmoid(gate(x_TD)) * shared_TD
            out_TD = out_TD + shared_TD
        out = out_TD.reshape(hidden_states.shape)
        return (out, weights_TK) if self.returns_router_scores else out

    def extra_repr(self) -> str:
        """Routing mode and the router's name."""
        return f"routing={self.routing}, router={self.router_name}"
