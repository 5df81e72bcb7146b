"""Turn the routing inputs a caller gives into one validated ``Routing``. Pure.

Shape legend: ``T`` tokens, ``D`` hidden, ``E`` experts, ``K`` top_k.
Imports only torch and core.
"""

import math

import torch

from core.config import MoEConfig
from core.errors import ConfigError, DeviceError, DTypeError, ShapeError
from core.routing import Routing, TopkRouter, localize_routing, route_topk
from core.validate import check_routing, check_shape


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


def _accepted_shapes(
    num_tokens: int, size: int, token_shape: tuple[int, ...]
) -> list[tuple[int, ...]]:
    """``token_shape + (size,)``, and the flattened ``(T, size)`` when it differs."""
    shapes: list[tuple[int, ...]] = [(*token_shape, size)]
    if shapes[0] != (num_tokens, size):
        shapes.append((num_tokens, size))
    return shapes


def _has_routing_shape(
    tensor: torch.Tensor,
    num_tokens: int,
    size: int,
    token_shape: tuple[int, ...] | None,
) -> bool:
    """Whether ``tensor`` is a ``(..., size)`` routing tensor over these tokens."""
    if token_shape is None:
        # The caller's leading dims are unknown: only the last dim and the count are checked.
        return tensor.shape[-1:] == (size,) and tensor.numel() == num_tokens * size
    return tuple(tensor.shape) in _accepted_shapes(num_tokens, size, token_shape)


def _describe_shapes(
    num_tokens: int, size: int, token_shape: tuple[int, ...] | None
) -> str:
    known = (num_tokens,) if token_shape is None else token_shape
    shapes = _accepted_shapes(num_tokens, size, known)
    return " or ".join(str(s) for s in shapes)


def _logits_routing(
    hidden_TD: torch.Tensor,
    router_logits: torch.Tensor,
    config: MoEConfig,
    *,
    correction_bias: torch.Tensor | None,
    token_shape: tuple[int, ...] | None,
    router: TopkRouter,
) -> Routing:
    t, e = hidden_TD.shape[0], config.num_experts
    _check_same_device("router_logits", router_logits, hidden_TD)
    if correction_bias is not None:
        _check_same_device("correction_bias", correction_bias, hidden_TD)
    if not router_logits.dtype.is_floating_point:
        raise DTypeError(
            f"router_logits must be floating, got dtype {router_logits.dtype}"
        )
    got = tuple(router_logits.shape)
    if got[-1:] != (e,) or router_logits.numel() != t * e:
        raise ShapeError(
            f"router_logits must have shape (..., num_experts={e}) with {t} tokens, "
            f"got {got}"
        )
    if not _has_routing_shape(router_logits, t, e, token_shape):
        raise ShapeError(
            "router_logits must have the leading dims of hidden_states, shape "
            f"{_describe_shapes(t, e, token_shape)}, got {got}"
        )
    return router(router_logits.reshape(t, e), config, correction_bias=correction_bias)


def _topk_routing(
    hidden_TD: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoEConfig,
    token_shape: tuple[int, ...] | None,
    *,
    check_ids: bool,
) -> Routing:
    t, k = hidden_TD.shape[0], config.top_k
    for name, tensor in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        _check_same_device(name, tensor, hidden_TD)
        if not _has_routing_shape(tensor, t, k, token_shape):
            raise ShapeError(
                f"{name} must have shape {_describe_shapes(t, k, token_shape)}, "
                f"got {tuple(tensor.shape)}"
            )
    topk_ids, topk_weights = topk_ids.reshape(t, k), topk_weights.reshape(t, k)
    routing = Routing(topk_weights=topk_weights, topk_ids=topk_ids)
    check_routing(routing, config, num_tokens=t, ids_in_range=check_ids)
    return Routing(topk_weights=topk_weights.float(), topk_ids=topk_ids)


def _check_token_shape(
    hidden_TD: torch.Tensor, token_shape: tuple[int, ...] | None
) -> None:
    if token_shape is not None and math.prod(token_shape) != hidden_TD.shape[0]:
        raise ShapeError(
            f"token_shape must hold the {hidden_TD.shape[0]} tokens of hidden_TD, "
            f"got {tuple(token_shape)}"
        )


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
    token_shape: tuple[int, ...] | None = None,
    check_topk_ids: bool = True,
    router: TopkRouter = route_topk,
) -> Routing:
    """One ``Routing`` over local expert ids from exactly one source.

    Sources, in order: precomputed ``topk_weights`` + ``topk_ids`` (``(..., K)``, global
    ids), ``router_logits`` (``(..., E)``), or the module's own ``gate_weight``.

    Args:
        hidden_TD: ``(T, D)`` tokens, flattened by the caller.
        config: layer configuration.
        router_logits: ``(..., E)`` logits.
        topk_weights: ``(..., K)`` routing weights.
        topk_ids: ``(..., K)`` global expert ids.
        gate_weight: ``(E, D)`` router used when no routing tensor is given.
        correction_bias: ``(E,)`` selection bias for ``router_logits``/``gate_weight``.
        expert_map: ``(E_global,)`` global to local ids (``-1``: held elsewhere).
        token_shape: ``hidden_states.shape[:-1]`` before the caller flattened it into
            ``hidden_TD``. Routing tensors must then have exactly these leading dims,
            or be flattened to ``(T, ...)`` like ``hidden_TD``; a permuted layout such
            as ``(S, B, E)`` for ``(B, S, D)`` hidden states is refused. Without it the
            leading dims are unknown, and only the last dim and the token count are
            checked.
        check_topk_ids: range-check given ``topk_ids`` (``check_routing``); off
            only for ids a top-k over the ``E`` experts made.
        router: routes ``router_logits`` and the gate's logits: ``route_topk``, or a
            fused form of it (``backends.triton``'s ``route_topk_fused`` on CUDA).

    Raises:
        ConfigError: when no source or two sources are given.
        ShapeError, DTypeError, DeviceError: on malformed routing tensors (a
            ``gate_weight`` not ``(E, D)`` among them; DeviceError for a
            ``router_logits``, ``topk_*``, ``gate_weight`` or ``correction_bias``
            off ``hidden_states``' device), and ShapeError for a ``token_shape``
            that does not hold ``T`` tokens.
    """
    _check_token_shape(hidden_TD, token_shape)
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
        routing = _topk_routing(
            hidden_TD, topk_weights, topk_ids, config, token_shape,
            check_ids=check_topk_ids,
        )  # fmt: skip
    elif router_logits is not None:
        routing = _logits_routing(
            hidden_TD, router_logits, config, correction_bias=correction_bias,
            token_shape=token_shape, router=router,
        )  # fmt: skip
    elif gate_weight is not None:
        _check_same_device("gate_weight", gate_weight, hidden_TD)
        if correction_bias is not None:
            _check_same_device("correction_bias", correction_bias, hidden_TD)
        check_shape(
            "gate_weight", gate_weight, (config.num_experts, config.hidden_size)
        )
        logits = compute_router_logits(hidden_TD, gate_weight)
        routing = router(logits, config, correction_bias=correction_bias)
    else:
        raise ConfigError(
            "router_logits or topk_weights/topk_ids must be given: this module has no gate"
        )
    if expert_map is None:
        return routing
    # Its values are checked before a prepare; its shape is needed right here.
    check_shape("expert_map", expert_map, (config.num_experts,))
    return localize_routing(routing, expert_map)
