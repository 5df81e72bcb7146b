"""Routing: scores, (grouped) top-k and token grouping by expert. Pure functions.

Shape legend: ``T`` tokens, ``E`` experts, ``K`` top_k, ``N`` = T*K routed pairs.
Imports only torch, attrs and core.
"""

from typing import Protocol

import attrs
import torch

from core.config import MoEConfig
from core.errors import ConfigTypeError, DeviceError, DTypeError, ShapeError


@attrs.frozen(kw_only=True, eq=False)
class Routing:
    """Which experts each token goes to, and with what weight.

    Attributes:
        topk_weights: float32 ``(T, K)``.
        topk_ids: integer ``(T, K)``; ``-1`` marks an expert not held here (expert
            parallelism), which contributes zero.
    """

    topk_weights: torch.Tensor
    topk_ids: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """``T``."""
        return int(self.topk_ids.shape[0])

    @property
    def top_k(self) -> int:
        """``K``."""
        return int(self.topk_ids.shape[1])


def score_logits(router_logits_TE: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """Softmax or sigmoid scores in float32 ``(T, E)``."""
    # Routing decisions are made in float32: bf16 ties and rounding flip the top-k.
    logits = router_logits_TE.float()
    if config.scoring_func == "softmax":
        return torch.softmax(logits, dim=-1)
    return torch.sigmoid(logits)


def _mask_groups(choice_TE: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """Keep the ``topk_group`` best expert groups per token, others set to -inf.

    Groups are ranked as ``config.group_ranking`` says, on the (biased) choice scores.
    """
    assert config.num_expert_group is not None
    assert config.topk_group is not None
    t, e = choice_TE.shape
    grouped = choice_TE.view(t, config.num_expert_group, e // config.num_expert_group)
    if config.group_ranking == "top2_sum":
        # DeepSeek-V3: a group's score is the sum of its two best biased scores.
        group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
    else:
        group_score = grouped.amax(dim=-1)
    keep = group_score.topk(config.topk_group, dim=-1).indices
    mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, value=True)
    return grouped.masked_fill(~mask.unsqueeze(-1), float("-inf")).view(t, e)


def check_routing_inputs(
    router_logits_TE: torch.Tensor,
    config: MoEConfig,
    correction_bias: torch.Tensor | None,
) -> None:
    """``route_topk``'s checks: types, shapes and dtypes only (no device sync).

    Raises:
        ConfigTypeError, ShapeError, DTypeError: as ``route_topk`` documents.
    """
    given: object = config  # untyped callers can pass anything (a dict, say)
    if not isinstance(given, MoEConfig):
        raise ConfigTypeError(
            f"config must be of type MoEConfig, got {type(given).__name__}"
        )
    e = config.num_experts
    if router_logits_TE.ndim != 2 or router_logits_TE.shape[1] != e:
        raise ShapeError(
            f"router_logits must have shape (T, num_experts={e}), "
            f"got {tuple(router_logits_TE.shape)}"
        )
    if not router_logits_TE.dtype.is_floating_point:
        raise DTypeError(
            f"router_logits must be floating, got dtype {router_logits_TE.dtype}"
        )
    if correction_bias is not None and tuple(correction_bias.shape) != (e,):
        raise ShapeError(
            f"correction_bias must have shape (num_experts={e},), "
            f"got {tuple(correction_bias.shape)}"
        )


def route_topk(
    router_logits_TE: torch.Tensor,
    config: MoEConfig,
    *,
    correction_bias: torch.Tensor | None = None,
) -> Routing:
    """Top-k routing with every option of ``config`` (README: routing options).

    Experts are chosen on ``scores + correction_bias`` (restricted to the best groups
    when grouped top-k is configured); the weights come from the unbiased scores,
    are renormalized if asked, then multiplied by ``routed_scaling_factor``.

    Args:
        router_logits_TE: ``(T, E)`` logits.
        config: layer configuration.
        correction_bias: optional ``(E,)`` selection bias (DeepSeek-V3).

    Returns:
        ``Routing`` with float32 weights and int64 ids.

    Raises:
        ShapeError: when ``router_logits_TE`` is not ``(T, num_experts)`` or
            ``correction_bias`` not ``(num_experts,)``.
        DTypeError: when ``router_logits_TE`` is not floating.
        ConfigTypeError: when ``config`` is not a ``MoEConfig``.
    """
    check_routing_inputs(router_logits_TE, config, correction_bias)
    scores_TE = score_logits(router_logits_TE, config)
    choice_TE = (
        scores_TE if correction_bias is None else scores_TE + correction_bias.float()
    )
    if config.uses_grouped_topk:
        choice_TE = _mask_groups(choice_TE, config)
    topk_ids_TK = choice_TE.topk(config.top_k, dim=-1).indices
    topk_weights_TK = scores_TE.gather(1, topk_ids_TK)
    if config.renormalize:
        denom = topk_weights_TK.sum(dim=-1, keepdim=True)
        topk_weights_TK = topk_weights_TK / denom.clamp(
            min=torch.finfo(torch.float32).tiny
        )
    if config.routed_scaling_factor != 1.0:
        topk_weights_TK = topk_weights_TK * config.routed_scaling_factor
    return Routing(topk_weights=topk_weights_TK, topk_ids=topk_ids_TK)


class TopkRouter(Protocol):
    """What routes logits: ``route_topk``, or a fused form with its results and errors."""

    def __call__(
        self,
        router_logits_TE: torch.Tensor,
        config: MoEConfig,
        *,
        correction_bias: torch.Tensor | None = None,
    ) -> Routing:
        """``Routing`` of ``(T, E)`` logits under ``config``."""
        ...


def localize_routing(routing: Routing, expert_map_E: torch.Tensor) -> Routing:
    """Map global expert ids to local ids through ``expert_map`` (-1: held elsewhere).

    Args:
        routing: routing over global expert ids.
        expert_map_E: integer ``(E_global,)``; local id or ``-1``, on the ids' device.

    Raises:
        ConfigTypeError, DTypeError, ShapeError, DeviceError: for a map that is not a
            1-D integer tensor on the ids' device. Its values are not read here (that
            would synchronize a GPU): ``Int4MoE`` checks a map's values
            (``check_expert_map``) when it is set, and routing through an unchecked map
            with ids past its end or entries past the local experts is undefined.
    """
    _check_map_form(expert_map_E, routing.topk_ids)
    ids = routing.topk_ids.long()
    local = torch.where(
        ids >= 0, expert_map_E[ids.clamp(min=0)], torch.full_like(ids, -1)
    )
    return Routing(
        topk_weights=routing.topk_weights, topk_ids=local.to(routing.topk_ids.dtype)
    )


def _check_map_form(expert_map_E: object, ids: torch.Tensor) -> None:
    """``expert_map`` is a 1-D integer tensor on the ids' device (values unread)."""
    if not isinstance(expert_map_E, torch.Tensor):
        msg = f"expert_map must be a torch.Tensor, got {type(expert_map_E).__name__}"
        raise ConfigTypeError(msg)
    if (
        expert_map_E.dtype.is_floating_point
        or expert_map_E.dtype.is_complex
        or (expert_map_E.dtype == torch.bool)
    ):
        msg = f"expert_map must have an integer dtype, got {expert_map_E.dtype}"
        raise DTypeError(msg)
    if expert_map_E.ndim != 1:
        msg = (
            "expert_map must be 1-D (num_experts,), got shape "
            f"{tuple(expert_map_E.shape)}"
        )
        raise ShapeError(msg)
    if expert_map_E.device != ids.device:
        msg = (
            f"expert_map must be on the topk_ids' device {ids.device}, got "
            f"{expert_map_E.device}"
        )
        raise DeviceError(msg)


def count_tokens_per_expert(
    topk_ids_TK: torch.Tensor, num_experts: int
) -> torch.Tensor:
    """Routed pairs per expert ``(E,)`` int64; ``-1`` ids are not counted."""
    flat_N = topk_ids_TK.flatten().long()
    flat_N = torch.where(flat_N >= 0, flat_N, torch.full_like(flat_N, num_experts))
    return torch.bincount(flat_N, minlength=num_experts + 1)[:num_experts]


def sort_tokens_by_expert(
    topk_ids_TK: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group the routed pairs by expert.

    Returns:
        ``order_N``: indices into the flattened ``(T*K,)`` pairs, sorted by expert
        (stable), pairs with id ``-1`` last; ``counts_E``: pairs per expert.
        Token of pair ``n`` is ``n // K``.
    """
    flat_N = topk_ids_TK.flatten().long()
    key_N = torch.where(flat_N >= 0, flat_N, torch.full_like(flat_N, num_experts))
    order_N = torch.sort(key_N, stable=True).indices
    return order_N, count_tokens_per_expert(topk_ids_TK, num_experts)
