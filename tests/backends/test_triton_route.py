"""``route_topk_fused`` (backends/triton/_route.py) against ``route_topk``.

On a CUDA device the kernel is compiled and runs there; elsewhere it runs in Triton's
interpreter on CPU tensors (``tests/conftest.py`` sets ``TRITON_INTERPRET=1``).
``route_topk`` (torch ops in float32) is the reference: the same ids in the same
order, weights within float32 rounding. Logits are seeded normal draws, so no two
choices of a case are near-tied.
"""

import math
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

import backends.triton._route as route_module
from backends.triton import fused_router_for, route_topk_fused
from core.config import MoEConfig
from core.errors import ConfigTypeError, DeviceError, DTypeError, ShapeError
from core.routing import Routing, route_topk

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _config(e: int, k: int, **options: Any) -> MoEConfig:
    return MoEConfig(
        num_experts=e, top_k=k, hidden_size=8, intermediate_size=8, **options
    )


def _logits(
    t: int, e: int, dtype: torch.dtype = torch.float32, seed: int = 0
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(t, e, generator=gen) * 2).to(dtype).to(DEVICE)


def _assert_same(got: Routing, want: Routing) -> None:
    assert got.topk_ids.dtype == torch.int64
    assert got.topk_weights.dtype == torch.float32
    torch.testing.assert_close(got.topk_ids, want.topk_ids, rtol=0, atol=0)
    torch.testing.assert_close(
        got.topk_weights, want.topk_weights, rtol=2e-6, atol=1e-7
    )


CASES: dict[str, tuple[int, int, dict[str, Any]]] = {
    "softmax-renorm": (8, 2, {}),
    "softmax-raw": (8, 2, {"renormalize": False}),
    "softmax-top1": (16, 1, {}),
    "softmax-e60-k6": (60, 6, {"renormalize": False}),
    "softmax-scaled": (128, 8, {"routed_scaling_factor": 2.5}),
    "sigmoid-renorm": (32, 4, {"scoring_func": "sigmoid"}),
    "sigmoid-raw": (32, 4, {"scoring_func": "sigmoid", "renormalize": False}),
    "grouped-top2-sum": (
        64,
        8,
        {
            "scoring_func": "sigmoid",
            "num_expert_group": 8,
            "topk_group": 4,
            "routed_scaling_factor": 2.5,
        },
    ),
    "grouped-max": (
        60,
        6,
        {"num_expert_group": 6, "topk_group": 3, "group_score": "max"},
    ),
    "grouped-top2-uneven": (
        40,
        3,
        {"num_expert_group": 5, "topk_group": 2, "group_score": "top2_sum"},
    ),
    "grouped-size-one": (
        8,
        2,
        {"num_expert_group": 8, "topk_group": 3, "group_score": "top2_sum"},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("t", [1, 5, 37])
def test_matches_route_topk(case: str, t: int) -> None:
    e, k, options = CASES[case]
    config = _config(e, k, **options)
    logits = _logits(t, e, seed=t)
    _assert_same(route_topk_fused(logits, config), route_topk(logits, config))


@pytest.mark.parametrize("grouped", [False, True])
def test_correction_bias_chooses_but_does_not_weigh(grouped: bool) -> None:
    groups = {"num_expert_group": 4, "topk_group": 2} if grouped else {}
    config = _config(32, 4, scoring_func="sigmoid", **groups)
    logits = _logits(9, 32)
    gen = torch.Generator().manual_seed(1)
    bias = (torch.randn(32, generator=gen) * 0.5).to(DEVICE)
    got = route_topk_fused(logits, config, correction_bias=bias)
    _assert_same(got, route_topk(logits, config, correction_bias=bias))
    # The bias changed the choice (else this case would not test it).
    assert not torch.equal(got.topk_ids, route_topk(logits, config).topk_ids)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_logits_dtypes(dtype: torch.dtype) -> None:
    config = _config(16, 4)
    logits = _logits(6, 16, dtype)
    _assert_same(route_topk_fused(logits, config), route_topk(logits, config))


def test_strided_correction_bias() -> None:
    config = _config(16, 4, scoring_func="sigmoid")
    logits = _logits(5, 16)
    gen = torch.Generator().manual_seed(2)
    bias = torch.randn(32, generator=gen).to(DEVICE)[::2]  # stride 2
    got = route_topk_fused(logits, config, correction_bias=bias)
    _assert_same(got, route_topk(logits, config, correction_bias=bias))


def test_strided_logits() -> None:
    config = _config(16, 4)
    logits = _logits(16, 12).T  # (12, 16) with strides (1, 12)
    assert not logits.is_contiguous()
    _assert_same(route_topk_fused(logits, config), route_topk(logits, config))


def test_many_programs() -> None:
    # 256 experts: 8 tokens a program, so 50 tokens take seven programs.
    config = _config(256, 8, scoring_func="sigmoid", num_expert_group=8, topk_group=4)
    logits = _logits(50, 256)
    _assert_same(route_topk_fused(logits, config), route_topk(logits, config))


def test_exact_ties_take_the_lower_id() -> None:
    config = _config(8, 3, renormalize=False)
    logits = torch.zeros(2, 8, device=DEVICE)
    logits[1, 5] = 1.0
    got = route_topk_fused(logits, config)
    assert got.topk_ids.tolist() == [[0, 1, 2], [5, 0, 1]]


NAN, INF = float("nan"), float("inf")


@pytest.fixture
def compiled_argmax(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the interpreter, ``tl.argmax`` as compiled code reduces: by its combine function.

    The interpreter takes numpy's ``argmax``, which picks the first NaN; compiled
    Triton folds ``_argmax_combine_tie_break_left``, where every comparison with NaN
    is false, so NaN loses to everything, -inf included. The kernel's non-finite
    handling is tested under the compiled rule (on a GPU it is the rule).
    """
    if torch.cuda.is_available():
        return
    import triton.language as tl
    from triton.runtime import interpreter  # type: ignore[import-untyped]  # unstubbed (typings/triton stubs what the library uses)

    numpy_form = interpreter.ReduceOps.apply_impl

    def apply_impl(self: Any, input: Any) -> Any:
        if self.combine_fn == tl.standard._argmax_combine_tie_break_left:
            return self.generic_reduce(input)
        return numpy_form(self, input)

    monkeypatch.setattr(interpreter.ReduceOps, "apply_impl", apply_impl)


# The interpreter computes in numpy, which warns at inf - inf: the very case tested.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize(
    ("e", "k", "row", "options"),
    [
        (3, 2, [NAN, 0.0, 1.0], {}),  # softmax: one NaN makes the row NaN
        (60, 4, [NAN] + [0.5] * 59, {}),  # not a power of two: padded lanes exist
        (8, 3, [0.0, INF, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0], {}),  # inf - inf is NaN
        (5, 2, [NAN] * 5, {"scoring_func": "sigmoid"}),
        (6, 2, [0.0, NAN, 1.0, -INF, 2.0, 0.0], {"scoring_func": "sigmoid"}),
        (
            6,
            2,
            [NAN, 0.0, 1.0, 2.0, -INF, -INF],
            {"num_expert_group": 3, "topk_group": 1, "group_score": "top2_sum"},
        ),
        (
            12,
            4,
            [-INF] * 12,
            {"scoring_func": "sigmoid", "num_expert_group": 4, "topk_group": 2},
        ),
    ],
)
@pytest.mark.usefixtures("compiled_argmax")
def test_non_finite_logits_give_distinct_ids_below_e(
    e: int, k: int, row: list[float], options: dict[str, Any]
) -> None:
    # Ids index the weights: whatever the logits, each is one of the E experts, once.
    # NaN ranks above every number, as in torch.topk.
    config = _config(e, k, **options)
    logits = torch.tensor([row, row[::-1]], device=DEVICE)
    ids = route_topk_fused(logits, config).topk_ids
    assert ids.min() >= 0
    assert ids.max() < e
    assert all(len(set(r)) == k for r in ids.tolist())
    nan_lanes = [i for i, v in enumerate(row) if math.isnan(v)]
    if nan_lanes and options.get("scoring_func") == "sigmoid":
        assert ids[0, 0].item() == nan_lanes[0]


@pytest.mark.usefixtures("compiled_argmax")
def test_minus_inf_bias_gives_distinct_ids() -> None:
    config = _config(8, 3, scoring_func="sigmoid")
    bias = torch.full((8,), -INF, device=DEVICE)
    ids = route_topk_fused(_logits(4, 8), config, correction_bias=bias).topk_ids
    assert ids.min() >= 0
    assert ids.max() < 8
    assert all(len(set(r)) == 3 for r in ids.tolist())


def test_no_tokens() -> None:
    got = route_topk_fused(_logits(0, 8), _config(8, 2))
    assert got.topk_ids.shape == got.topk_weights.shape == (0, 2)


def test_gradient_falls_back_to_route_topk() -> None:
    logits = _logits(3, 8).requires_grad_(True)
    got = route_topk_fused(logits, _config(8, 2))
    (grad,) = torch.autograd.grad(got.topk_weights[:, 0].sum(), logits)
    assert grad.abs().sum() > 0
    with torch.no_grad():
        assert got.topk_ids.equal(route_topk(logits, _config(8, 2)).topk_ids)


def test_fake_tensors_fall_back_to_route_topk() -> None:
    config = _config(8, 2)
    with FakeTensorMode():
        logits = torch.empty(3, 8, device=DEVICE)
        assert not route_module.fuses(logits, config)
        got = route_topk_fused(logits, config)
    assert got.topk_ids.shape == (3, 2)
    assert is_fake(got.topk_ids)


def test_over_the_unroll_limits_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(route_module, "MAX_FUSED_EXPERTS", 4)
    config = _config(8, 2)
    logits = _logits(3, 8)
    assert not route_module.fuses(logits, config)
    _assert_same(route_topk_fused(logits, config), route_topk(logits, config))
    monkeypatch.undo()
    assert route_module.fuses(logits, config)
    assert not route_module.fuses(logits, _config(200, 65))
    assert not route_module.fuses(
        logits, _config(130, 2, num_expert_group=65, topk_group=1)
    )


def test_errors_are_route_topk_s() -> None:
    config = _config(8, 2)
    with pytest.raises(
        ShapeError, match=r"router_logits must have shape \(T, num_experts=8\)"
    ):
        route_topk_fused(_logits(3, 7), config)
    with pytest.raises(DTypeError, match="router_logits must be floating"):
        route_topk_fused(torch.zeros(3, 8, dtype=torch.int32, device=DEVICE), config)
    with pytest.raises(ShapeError, match="correction_bias must have shape"):
        route_topk_fused(
            _logits(3, 8), config, correction_bias=torch.zeros(7, device=DEVICE)
        )
    with pytest.raises(DeviceError, match="correction_bias must be on the device of"):
        route_topk_fused(
            _logits(3, 8), config, correction_bias=torch.zeros(8, device="meta")
        )
    with pytest.raises(ConfigTypeError, match="config must be of type MoEConfig"):
        route_topk_fused(_logits(3, 8), {"num_experts": 8})  # type: ignore[arg-type]  # the wrong type on purpose


def test_fused_router_for(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fused_router_for(torch.device("cpu")) is route_topk
    monkeypatch.setattr(route_module, "is_interpreting", lambda: True)
    assert fused_router_for(torch.device("cuda")) is route_topk
    monkeypatch.setattr(route_module, "is_interpreting", lambda: False)
    assert fused_router_for(torch.device("cuda")) is route_topk_fused
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    route_module._triton_installed.cache_clear()  # asked once: ask again
    try:
        assert fused_router_for(torch.device("cuda")) is route_topk
    finally:
        monkeypatch.undo()
        route_module._triton_installed.cache_clear()  # forget the patched answer
