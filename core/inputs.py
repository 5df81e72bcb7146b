"""Turn the routing inputs a caller gives into one validated ``Routing``. Pure.

Shape legend: ``T`` tokens, ``D`` hidden, ``E`` experts, ``K`` top_k.
Imports only torch and core.
"""

import torch

from core.config import MoEConfig
from core.errors import ConfigError, DeviceError, ShapeError
from core.routing import Routing, localize_routing, route_topk
from core.validate import check_routing


def compute_router_logits(
    hidden_TD: torch.Tensor, gate_weight_ED: torch.Tensor
) -> torch.Tensor:
    """``hidden @ gate.T`` in float32 ``(T, E)``."""
    # The router runs in float32: its top-k decisions are sensitive to bf16 rounding.
    return hidden_TD.float() @ gate_weight_ED.float().T


def _check_same_device(
    name: str, tensor: torch.Tensor, hidden_TD: torch.Tensor
) -> None:
    if tensor.device != hidden_TD.device:
        raise DeviceError(
            f"{name} must be on the device of hidden_states ({hidden_TD.device}), "
            f"got {tensor.device}"
        )


def _logits_routing(
    hidden_TD: torch.Tensor,
    router_logits: torch.Tensor,
    config: MoEConfig,
    correction_bias: torch.Tensor | None,
) -> Routing:
    t, e = hidden_TD.shape[0], config.num_experts
    _check_same_device("router_logits", router_logits, hidden_TD)
    if router_logits.shape[-1:] != (e,) or router_logits.numel() != t * e:
        raise ShapeError(
            f"router_logits must have shape (..., num_experts={e}) with {t} tokens, "
            f"got {tuple(router_logits.shape)}"
        )
    if not router_logits.dtype.is_floating_point:
        raise ShapeError(
            f"router_logits must be floating, got dtype {router_logits.dtype}"
        )
    return route_topk(
        router_logits.reshape(t, e), config, correction_bias=correction_bias
    )


def _topk_routing(
    hidden_TD: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoEConfig,
) -> Routing:
    t, k = hidden_TD.shape[0], config.top_k
    _check_same_device("topk_ids", topk_ids, hidden_TD)
    _check_same_device("topk_weights", topk_weights, hidden_TD)
    if topk_ids.numel() == t * k and topk_weights.numel() == t * k:
        # (..., K) inputs are flattened like hidden_states; anything else is reported.
        topk_ids, topk_weights = topk_ids.reshape(t, k), topk_weights.reshape(t, k)
    routing = Routing(topk_weights=topk_weights, topk_ids=topk_ids)
    check_routing(routing, config, num_tokens=t)
    return Routing(topk_weights=topk_weights.float(), topk_ids=topk_ids)


def resolve_routing(
    hidden_TD: torch.Tensor,
    config: MoEConfig,
    *,
    router_logits: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    topk_ids: torch.Tensor | None = None,
    gate_weight: torch.Tensor | None = None,
    correction_bias: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
) -> Routing:
    """One ``Routing`` over local expert ids from exactly one source.

    Sources, in order: precomputed ``topk_weights`` + ``topk_ids`` (``(..., K)``, global
    ids), ``router_logits`` (``(..., E)``), or the module's own ``gate_weight``.

    Raises:
        ConfigError: when no source or two sources are given.
        ShapeError, DTypeError, DeviceError: on malformed routing tensors.
    """
    given_topk = topk_weights is not None or topk_ids is not None
    if given_topk and router_logits is not None:
        raise ConfigError(
            "pass either router_logits or topk_weights/topk_ids, got both"
        )
    if given_topk:
        if topk_weights is None or topk_ids is None:
            raise ConfigError(
                "topk_weights and topk_ids must be given together, got one"
            )
        routing = _topk_routing(hidden_TD, topk_weights, topk_ids, config)
    elif router_logits is not None:
        routing = _logits_routing(hidden_TD, router_logits, config, correction_bias)
    elif gate_weight is not None:
        logits = compute_router_logits(hidden_TD, gate_weight)
        routing = route_topk(logits, config, correction_bias=correction_bias)
    else:
        raise ConfigError(
            "router_logits or topk_weights/topk_ids must be given: this module has no gate"
        )
    return routing if expert_map is None else localize_routing(routing, expert_map)
