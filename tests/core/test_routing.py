"""Routing against a per-token float64 re-statement of FORMATS.md section 5."""

from typing import Any

import attrs
import pytest
import torch

from core.config import MoEConfig
from core.errors import ConfigTypeError, DeviceError, DTypeError, ShapeError
from core.routing import (
    Routing,
    count_tokens_per_expert,
    localize_routing,
    route_topk,
    sort_tokens_by_expert,
)
from tests.tolerances import EXACT


def _route_one_token(
    logits: list[float], config: MoEConfig, bias: list[float] | None
) -> tuple[list[int], list[float]]:
    """Plain-Python routing of one token (float64)."""
    x = torch.tensor(logits, dtype=torch.float64)
    scores = (
        torch.softmax(x, 0) if config.scoring_func == "softmax" else torch.sigmoid(x)
    )
    choice = scores.clone() if bias is None else scores + torch.tensor(bias).double()
    allowed = list(range(config.num_experts))
    if config.num_expert_group is not None and config.topk_group is not None:
        size = config.num_experts // config.num_expert_group
        groups = [
            choice[g * size : (g + 1) * size] for g in range(config.num_expert_group)
        ]
        # DeepSeek-V3 (sigmoid) sums a group's two best scores, V2 takes its best.
        top2 = config.group_score == "top2_sum" or (
            config.group_score is None and config.scoring_func == "sigmoid"
        )
        rank = [
            float(g.sort(descending=True).values[:2].sum()) if top2 else float(g.max())
            for g in groups
        ]
        keep = sorted(range(len(rank)), key=lambda i: -rank[i])[: config.topk_group]
        allowed = [e for e in allowed if e // size in keep]
    chosen = sorted(allowed, key=lambda e: -float(choice[e]))[: config.top_k]
    weights = [float(scores[e]) for e in chosen]
    if config.renormalize:
        total = sum(weights)
        weights = [w / total for w in weights]
    return chosen, [w * config.routed_scaling_factor for w in weights]


CASES = [
    {},
    {"renormalize": False},
    {"scoring_func": "sigmoid"},
    {"num_expert_group": 4, "topk_group": 2},
    {"num_expert_group": 8, "topk_group": 3, "scoring_func": "sigmoid"},
    {"num_expert_group": 4, "topk_group": 2, "group_score": "top2_sum"},
    {
        "num_expert_group": 8,
        "topk_group": 3,
        "scoring_func": "sigmoid",
        "group_score": "max",
    },
    {"routed_scaling_factor": 2.5, "renormalize": False},
]


@pytest.mark.parametrize(
    "options",
    CASES,
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default",
)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_route_topk_matches_per_token_rule(
    options: dict[str, Any], with_bias: bool, generator: torch.Generator
) -> None:
    config = attrs.evolve(
        MoEConfig(num_experts=32, top_k=4, hidden_size=64, intermediate_size=64),
        **options,
    )
    logits = torch.randn(50, 32, generator=generator)
    bias = torch.randn(32, generator=generator) * 0.1 if with_bias else None
    routing = route_topk(logits, config, correction_bias=bias)
    assert routing.topk_weights.dtype == torch.float32
    for t in range(50):
        ids, weights = _route_one_token(
            logits[t].tolist(), config, None if bias is None else bias.tolist()
        )
        assert routing.topk_ids[t].tolist() == ids
        torch.testing.assert_close(
            routing.topk_weights[t], torch.tensor(weights, dtype=torch.float32)
        )


def test_route_topk_zero_tokens() -> None:
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64)
    routing = route_topk(torch.zeros(0, 8), config)
    assert routing.topk_ids.shape == (0, 2)
    assert routing.num_tokens == 0
    assert routing.top_k == 2


def test_localize_routing() -> None:
    routing = Routing(
        topk_weights=torch.ones(2, 2), topk_ids=torch.tensor([[0, 3], [2, 1]])
    )
    expert_map = torch.tensor([-1, 0, -1, 1], dtype=torch.int32)
    local = localize_routing(routing, expert_map)
    assert local.topk_ids.tolist() == [[-1, 1], [-1, 0]]
    assert local.topk_ids.dtype == routing.topk_ids.dtype


@pytest.mark.parametrize(
    ("expert_map", "error", "words"),
    [
        (
            torch.tensor([0.7, 1.9, 2.5, -0.5]),
            DTypeError,
            "integer dtype, got torch.float32",
        ),
        (torch.tensor([True, False, True, True]), DTypeError, "got torch.bool"),
        (torch.tensor([[0, 1], [2, 3]]), ShapeError, r"1-D .* got shape \(2, 2\)"),
        ([0, 1, 2, 3], ConfigTypeError, "torch.Tensor, got list"),
        (
            torch.tensor([0, 1, 2, 3], device="meta"),
            DeviceError,
            "device cpu, got meta",
        ),
    ],
    ids=["float", "bool", "2-d", "list", "device"],
)
def test_localize_routing_refuses_a_map_of_the_wrong_form(
    expert_map: object, error: type[Exception], words: str
) -> None:
    """A float map once rounded global expert 3 to local 0, silently."""
    routing = Routing(topk_weights=torch.ones(1, 2), topk_ids=torch.tensor([[3, 2]]))
    with pytest.raises(error, match=words):
        localize_routing(routing, expert_map)  # type: ignore[arg-type]


def test_count_and_sort_tokens_by_expert() -> None:
    ids = torch.tensor([[2, 0], [-1, 2], [1, 2]])
    torch.testing.assert_close(
        count_tokens_per_expert(ids, 4), torch.tensor([1, 1, 3, 0]), **EXACT
    )
    order, counts = sort_tokens_by_expert(ids, 4)
    assert counts.tolist() == [1, 1, 3, 0]
    assert ids.flatten()[order].tolist() == [0, 1, 2, 2, 2, -1]
    assert order.tolist()[:5] == [1, 4, 0, 3, 5]  # stable within an expert


@pytest.mark.parametrize(
    ("shape", "got"),
    [((3, 16), r"\(3, 16\)"), ((3, 4), r"\(3, 4\)"), ((2, 3, 8), r"\(2, 3, 8\)")],
    ids=["too-many-experts", "too-few-experts", "3-D"],
)
def test_route_topk_rejects_logits_of_another_width(
    shape: tuple[int, ...], got: str
) -> None:
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64)
    with pytest.raises(
        ShapeError,
        match=rf"router_logits must have shape \(T, num_experts=8\), got {got}",
    ):
        route_topk(torch.zeros(shape), config)


@pytest.mark.parametrize("shape", [(1,), (4,), (1, 8)], ids=str)
def test_route_topk_rejects_correction_bias_of_another_shape(
    shape: tuple[int, ...],
) -> None:
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64)
    with pytest.raises(
        ShapeError, match=r"correction_bias must have shape \(num_experts=8,\), got"
    ):
        route_topk(torch.zeros(3, 8), config, correction_bias=torch.zeros(shape))


@pytest.mark.parametrize(
    ("config", "got"),
    [
        ({"num_experts": 8, "top_k": 2}, "dict"),
        (None, "NoneType"),
        ("MoEConfig(num_experts=8)", "str"),
    ],
    ids=["dict", "None", "str"],
)
def test_route_topk_refuses_a_config_of_another_type(config: object, got: str) -> None:
    with pytest.raises(
        ConfigTypeError, match=rf"config must be of type MoEConfig, got {got}$"
    ) as info:
        route_topk(torch.zeros(3, 8), config)  # type: ignore[arg-type]  # on purpose
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.uint8, torch.bool], ids=str
)
def test_route_topk_refuses_logits_that_are_not_floating(dtype: torch.dtype) -> None:
    """Integer logits were routed silently (softmax over their float cast)."""
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64)
    with pytest.raises(
        DTypeError, match=rf"router_logits must be floating, got dtype {dtype}$"
    ):
        route_topk(torch.zeros(3, 8, dtype=dtype), config)


def test_group_ranking_does_not_depend_on_a_bias_being_passed(
    generator: torch.Generator,
) -> None:
    """DeepSeek-V3 (sigmoid) ranks groups by their two best scores with or without a
    correction bias tensor, as its model does; it used to switch to the best score."""
    config = MoEConfig(
        num_experts=64,
        top_k=8,
        hidden_size=64,
        intermediate_size=64,
        scoring_func="sigmoid",
        num_expert_group=8,
        topk_group=4,
    )
    assert config.group_ranking == "top2_sum"
    logits = torch.randn(512, 64, generator=generator)
    plain = route_topk(logits, config)
    zero_bias = route_topk(logits, config, correction_bias=torch.zeros(64))
    assert torch.equal(plain.topk_ids, zero_bias.topk_ids)
    as_v2 = route_topk(logits, attrs.evolve(config, group_score="max"))
    assert not torch.equal(plain.topk_ids, as_v2.topk_ids)


def _assert_per_token_rule(
    logits: torch.Tensor, config: MoEConfig, bias: torch.Tensor | None = None
) -> None:
    routing = route_topk(logits, config, correction_bias=bias)
    for t in range(logits.shape[0]):
        ids, weights = _route_one_token(
            logits[t].tolist(), config, None if bias is None else bias.tolist()
        )
        assert routing.topk_ids[t].tolist() == ids
        torch.testing.assert_close(
            routing.topk_weights[t], torch.tensor(weights, dtype=torch.float32)
        )


def test_grouped_topk_with_negative_choice_scores(generator: torch.Generator) -> None:
    """A correction bias can push every choice score below 0 (DeepSeek-V3's is learned,
    any sign): experts of dropped groups must still never be picked (masked to -inf,
    not to 0, which would then beat every kept expert)."""
    config = MoEConfig(
        num_experts=32, top_k=4, hidden_size=64, intermediate_size=64,
        scoring_func="sigmoid", num_expert_group=8, topk_group=2,
    )  # fmt: skip
    logits = torch.randn(50, 32, generator=generator)
    bias = torch.randn(32, generator=generator) * 0.1 - 2.0
    _assert_per_token_rule(logits, config, bias)
    ids = route_topk(logits, config, correction_bias=bias).topk_ids
    assert all(len(set((row // 4).tolist())) <= 2 for row in ids)


def test_grouped_top2_sum_with_one_expert_per_group(
    generator: torch.Generator,
) -> None:
    """top2_sum on groups of a single expert ranks a group by its one score."""
    config = MoEConfig(
        num_experts=16, top_k=4, hidden_size=64, intermediate_size=64,
        scoring_func="sigmoid", num_expert_group=16, topk_group=6,
    )  # fmt: skip
    assert config.group_ranking == "top2_sum"
    _assert_per_token_rule(torch.randn(50, 16, generator=generator), config)


def test_renormalize_tiny_sigmoid_scores(generator: torch.Generator) -> None:
    """Scores near 1e-13 still renormalize to weights summing to one (no epsilon)."""
    config = MoEConfig(
        num_experts=8, top_k=2, hidden_size=64, intermediate_size=64,
        scoring_func="sigmoid",
    )  # fmt: skip
    _assert_per_token_rule(torch.randn(20, 8, generator=generator) - 30.0, config)
