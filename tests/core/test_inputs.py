"""resolve_routing: accepted routing layouts, refused permutations, error types."""

import pytest
import torch

from core.config import MoEConfig
from core.errors import DeviceError, DTypeError, ShapeError
from core.inputs import resolve_routing
from core.routing import Routing
from tests.tolerances import EXACT

CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=16, intermediate_size=16)


def _topk_f64(logits_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent softmax + top-2 + renormalize in float64, one token at a time."""
    ids, weights = [], []
    for row in logits_TE.double():
        scores = torch.softmax(row, 0)
        best = sorted(range(row.numel()), key=lambda e: -float(scores[e]))[:2]
        picked = scores[best]
        ids.append(best)
        weights.append(picked / picked.sum())
    return torch.tensor(ids), torch.stack(weights)


@pytest.mark.parametrize(
    "logits_shape", [(2, 3, 8), (6, 8)], ids=["leading-dims", "flattened"]
)
def test_logits_with_hidden_leading_dims_or_flattened(
    logits_shape: tuple[int, ...], generator: torch.Generator
) -> None:
    hidden = torch.randn(2, 3, 16, generator=generator)
    logits = torch.randn(*logits_shape, generator=generator)
    routing = resolve_routing(
        hidden.reshape(6, 16), CFG, router_logits=logits, token_shape=(2, 3)
    )
    ids, weights = _topk_f64(logits.reshape(6, 8))
    torch.testing.assert_close(routing.topk_ids, ids, **EXACT)
    torch.testing.assert_close(routing.topk_weights, weights.float())


def test_permuted_logits_are_refused(generator: torch.Generator) -> None:
    # (S, B, E) logits for (B, S, D) hidden states hold the right count of tokens in
    # another order: routed as given, every token would get another token's experts.
    hidden_TD = torch.randn(6, 16, generator=generator)
    with pytest.raises(
        ShapeError,
        match=r"router_logits must have the leading dims of hidden_states, shape "
        r"\(2, 3, 8\) or \(6, 8\), got \(3, 2, 8\)",
    ):
        resolve_routing(
            hidden_TD, CFG, router_logits=torch.randn(3, 2, 8), token_shape=(2, 3)
        )


def test_one_token_hidden_takes_its_logits_with_or_without_the_token_dim(
    generator: torch.Generator,
) -> None:
    # A 1-D (D,) hidden state is one token: token_shape is ().
    hidden_TD = torch.randn(16, generator=generator).reshape(1, 16)
    logits = torch.randn(8, generator=generator)
    for given in (logits, logits.reshape(1, 8)):
        routing = resolve_routing(hidden_TD, CFG, router_logits=given, token_shape=())
        torch.testing.assert_close(routing.topk_ids, _topk_f64(given.reshape(1, 8))[0])
    with pytest.raises(ShapeError, match=r"shape \(8,\) or \(1, 8\), got \(1, 1, 8\)"):
        resolve_routing(
            hidden_TD, CFG, router_logits=logits.reshape(1, 1, 8), token_shape=()
        )


@pytest.mark.parametrize("token_shape", [None, (3,)], ids=["no-token-shape", "(3,)"])
def test_transposed_topk_is_refused(token_shape: tuple[int, ...] | None) -> None:
    hidden_TD = torch.zeros(3, 16)
    ids_TK = torch.tensor([[0, 1], [2, 3], [4, 5]])
    weights_TK = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])

    def resolve(weights: torch.Tensor, ids: torch.Tensor) -> Routing:
        if token_shape is None:  # the call as it was before token_shape existed
            return resolve_routing(hidden_TD, CFG, topk_weights=weights, topk_ids=ids)
        return resolve_routing(
            hidden_TD, CFG, topk_weights=weights, topk_ids=ids, token_shape=token_shape
        )

    # (K, T) holds T * K entries too: reshaped to (T, K) it would re-pair tokens.
    with pytest.raises(
        ShapeError, match=r"topk_ids must have shape \(3, 2\), got \(2, 3\)"
    ):
        resolve(weights_TK.T, ids_TK.T)
    torch.testing.assert_close(resolve(weights_TK, ids_TK).topk_ids, ids_TK, **EXACT)


def test_topk_with_leading_dims() -> None:
    ids = torch.tensor([[[0, 1], [2, 3], [4, 5]], [[6, 7], [0, 2], [1, 3]]])
    weights = torch.full((2, 3, 2), 0.5)
    hidden_TD = torch.zeros(6, 16)
    routing = resolve_routing(
        hidden_TD, CFG, topk_weights=weights, topk_ids=ids, token_shape=(2, 3)
    )
    torch.testing.assert_close(routing.topk_ids, ids.reshape(6, 2), **EXACT)
    with pytest.raises(
        ShapeError,
        match=r"topk_weights must have shape \(2, 3, 2\) or \(6, 2\), got \(3, 2, 2\)",
    ):
        resolve_routing(
            hidden_TD,
            CFG,
            topk_weights=weights.transpose(0, 1),
            topk_ids=ids,
            token_shape=(2, 3),
        )


def test_without_token_shape_only_the_count_is_known(
    generator: torch.Generator,
) -> None:
    # Callers that flatten hidden_states without passing token_shape keep working.
    logits = torch.randn(2, 3, 8, generator=generator)
    routing = resolve_routing(torch.zeros(6, 16), CFG, router_logits=logits)
    torch.testing.assert_close(routing.topk_ids, _topk_f64(logits.reshape(6, 8))[0])


def test_integer_logits_are_a_dtype_error() -> None:
    with pytest.raises(
        DTypeError, match=r"router_logits must be floating, got dtype torch\.int64"
    ):
        resolve_routing(
            torch.zeros(3, 16), CFG, router_logits=torch.zeros(3, 8, dtype=torch.int64)
        )


def test_token_shape_must_hold_the_tokens() -> None:
    with pytest.raises(
        ShapeError,
        match=r"token_shape must hold the 6 tokens of hidden_TD, got \(2, 2\)",
    ):
        resolve_routing(
            torch.zeros(6, 16), CFG, router_logits=torch.zeros(6, 8), token_shape=(2, 2)
        )


def test_correction_bias_shape_is_checked() -> None:
    with pytest.raises(
        ShapeError,
        match=r"correction_bias must have shape \(num_experts=8,\), got \(1,\)",
    ):
        resolve_routing(
            torch.zeros(3, 16),
            CFG,
            router_logits=torch.zeros(3, 8),
            correction_bias=torch.zeros(1),
        )


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("gate_weight", "gate_weight"),
        ("router_logits", "correction_bias"),
        ("gate_weight", "correction_bias"),
    ],
)
def test_gate_and_correction_bias_off_the_hidden_device_are_refused(
    source: str, name: str
) -> None:
    """A meta ``gate_weight`` would route on garbage; a ``correction_bias``
    elsewhere would fail deep in torch. Both are named, like ``router_logits``."""
    tensors = {
        "router_logits": torch.zeros(3, 8),
        "gate_weight": torch.zeros(8, 16),
        "correction_bias": torch.zeros(8),
    }
    tensors[name] = tensors[name].to("meta")
    logits = tensors["router_logits"] if source == "router_logits" else None
    gate = tensors["gate_weight"] if source == "gate_weight" else None
    with pytest.raises(
        DeviceError,
        match=rf"{name} must be on the device of hidden_states \(cpu\), got meta",
    ):
        resolve_routing(
            torch.zeros(3, 16),
            CFG,
            router_logits=logits,
            gate_weight=gate,
            correction_bias=tensors["correction_bias"],
        )


CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=16, intermediate_size=16)


def test_topk_of_another_token_count_is_a_shape_error() -> None:
    """Without token_shape the count is still checked: (4, 2) for 3 tokens."""
    with pytest.raises(
        ShapeError, match=r"topk_ids must have shape \(3, 2\), got \(4, 2\)"
    ):
        resolve_routing(
            torch.zeros(3, 16),
            CFG,
            topk_weights=torch.full((4, 2), 0.5),
            topk_ids=torch.zeros(4, 2, dtype=torch.int64),
        )


def test_topk_weights_are_held_in_float32() -> None:
    weights = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.9, 0.1]], dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5]])
    routing = resolve_routing(
        torch.zeros(3, 16), CFG, topk_weights=weights, topk_ids=ids
    )
    torch.testing.assert_close(routing.topk_weights, weights.float(), **EXACT)


def test_topk_ids_range_check_can_be_left_to_the_caller() -> None:
    """``check_topk_ids=False`` (ids a top-k over the experts made) skips only the
    range; shapes and dtypes are still checked."""
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=16, intermediate_size=32)
    hidden = torch.zeros(2, 16)
    weights, ids = torch.ones(2, 2), torch.tensor([[0, 8], [1, 2]])
    with pytest.raises(ShapeError, match=r"topk_ids must be in \[0, num_experts=8\)"):
        resolve_routing(hidden, cfg, topk_weights=weights, topk_ids=ids)
    routing = resolve_routing(
        hidden, cfg, topk_weights=weights, topk_ids=ids, check_topk_ids=False
    )
    assert routing.topk_ids.tolist() == [[0, 8], [1, 2]]
    with pytest.raises(DTypeError, match="topk_ids must be int32 or int64"):
        resolve_routing(
            hidden, cfg, topk_weights=weights, topk_ids=ids.float(),
            check_topk_ids=False,
        )  # fmt: skip
