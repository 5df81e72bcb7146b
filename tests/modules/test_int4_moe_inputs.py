"""Int4MoE's refusals of bad input: each names the argument, what it expected and got."""

from typing import Any

import attrs
import pytest
import torch

from core.config import MoEConfig
from core.errors import (
    BackendUnavailableError,
    ConfigError,
    ConfigTypeError,
    DeviceError,
    DTypeError,
    ShapeError,
)
from core.quantize import quantize_expert_weights
from core.routing import route_topk
from core.scheme import (
    INT4_ASYM_G32,
    INT4_SYM_G32,
    INT4_SYM_G128,
    Int4Scheme,
)
from modules import Int4MoE
from tests.modules.int4_moe_cases import (
    CFG,
    _float_weights,
    _module,
)


def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(BackendUnavailableError, match=r"got 'nope'.*reference: ok"):
        Int4MoE(CFG, backend="nope")


@pytest.mark.parametrize(
    ("w13_shape", "w2_shape", "message"),
    [
        ((8, 128, 127), (8, 128, 64), r"w13_weight must have shape \(8, 128, 128\)"),
        ((8, 128, 128), (8, 64, 128), r"w2_weight must have shape \(8, 128, 64\)"),
        ((128, 128), (8, 128, 64), r"w13_weight must have shape"),
    ],
)
def test_from_float_rejects_shapes(
    w13_shape: tuple[int, ...], w2_shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ShapeError, match=message):
        Int4MoE.from_float(
            w13_weight=torch.zeros(w13_shape),
            w2_weight=torch.zeros(w2_shape),
            config=CFG,
        )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_from_float_rejects_non_finite(bad: float, generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    w2[3, 5, 7] = bad
    with pytest.raises(
        ShapeError,
        match=r"w2_weight must be finite, got 1 NaN/inf values \(first at \(3, 5, 7\)\)",
    ):
        Int4MoE.from_float(w13_weight=w13, w2_weight=w2, config=CFG)


def test_group_size_must_divide() -> None:
    cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=96, intermediate_size=64)
    with pytest.raises(
        ShapeError, match="hidden_size=96 must be divisible by group_size=128"
    ):
        Int4MoE(cfg, scheme=INT4_SYM_G128)
    odd = MoEConfig(num_experts=2, top_k=1, hidden_size=64, intermediate_size=33)
    with pytest.raises(
        ShapeError, match="intermediate_size must be a positive even number, got 33"
    ):
        Int4MoE(odd, scheme=Int4Scheme(group_size=-1))


def test_forward_rejects_bad_inputs(generator: torch.Generator) -> None:
    moe = _module(generator)
    x = torch.randn(4, 128, generator=generator)
    with pytest.raises(
        ShapeError,
        match=r"hidden_states must have last dim hidden_size=128, got shape \(4, 127\)",
    ):
        moe(torch.randn(4, 127), router_logits=torch.randn(4, 8))
    with pytest.raises(
        DTypeError,
        match=r"hidden_states must be float32, float16 or bfloat16, got dtype torch\.float64",
    ):
        moe(x.double(), router_logits=torch.randn(4, 8))
    with pytest.raises(
        ShapeError,
        match=r"router_logits must have shape \(..., num_experts=8\) with 4 tokens, got \(4, 7\)",
    ):
        moe(x, router_logits=torch.randn(4, 7))
    with pytest.raises(ConfigError, match="this module has no gate"):
        moe(x)
    with pytest.raises(ConfigError, match="got both"):
        moe(
            x,
            router_logits=torch.randn(4, 8),
            topk_weights=torch.ones(4, 2),
            topk_ids=torch.zeros(4, 2, dtype=torch.int64),
        )
    with pytest.raises(ConfigError, match="given together"):
        moe(x, topk_ids=torch.zeros(4, 2, dtype=torch.int64))


def test_forward_rejects_bad_topk(generator: torch.Generator) -> None:
    moe = _module(generator)
    x = torch.randn(4, 128, generator=generator)
    ids = torch.tensor([[0, 1], [2, 8], [0, 1], [0, 1]])
    with pytest.raises(
        ShapeError,
        match=r"topk_ids must be in \[0, num_experts=8\), got values in \[0, 8\]",
    ):
        moe(x, topk_weights=torch.ones(4, 2), topk_ids=ids)
    with pytest.raises(
        ShapeError, match=r"topk_ids must have shape \(4, 2\), got \(4, 3\)"
    ):
        moe(
            x,
            topk_weights=torch.ones(4, 3),
            topk_ids=torch.zeros(4, 3, dtype=torch.int64),
        )
    with pytest.raises(
        DTypeError, match=r"topk_ids must be int32 or int64, got dtype torch\.float32"
    ):
        moe(x, topk_weights=torch.ones(4, 2), topk_ids=torch.zeros(4, 2))


def test_routing_must_follow_the_tokens_leading_dims(
    generator: torch.Generator,
) -> None:
    """(S, B, E) logits or (B, K, S) top-k for (B, S, D) tokens would misroute."""
    moe = _module(generator, backend="reference")
    x = torch.randn(2, 3, 128, generator=generator)
    logits = torch.randn(2, 3, 8, generator=generator)
    flat = moe(x, router_logits=logits.reshape(6, 8))
    assert torch.equal(moe(x, router_logits=logits), flat)
    with pytest.raises(ShapeError, match=r"router_logits must have the leading dims"):
        moe(x, router_logits=logits.transpose(0, 1))
    r = route_topk(logits.reshape(6, 8), CFG)
    ids, w = r.topk_ids.reshape(2, 3, 2), r.topk_weights.reshape(2, 3, 2)
    assert torch.equal(moe(x, topk_weights=w, topk_ids=ids), flat)
    with pytest.raises(ShapeError, match="topk_ids"):
        moe(x, topk_weights=w.transpose(1, 2), topk_ids=ids.transpose(1, 2))


def test_device_mismatch_is_reported(generator: torch.Generator) -> None:
    moe = _module(generator)
    with pytest.raises(
        DeviceError, match="hidden_states must be on the module's device cpu, got meta"
    ):
        moe(torch.empty(4, 128, device="meta"), router_logits=torch.randn(4, 8))
    with pytest.raises(
        DeviceError, match="router_logits must be on the device of hidden_states"
    ):
        moe(torch.randn(4, 128), router_logits=torch.empty(4, 8, device="meta"))


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("gpu", "device must name a torch device, got 'gpu'"),
        ("cuda:99", "device must be a device present here, got 'cuda:99'"),
        ("xpu:7", "device must be a device present here, got 'xpu:7'"),
    ],
)
def test_a_device_not_here_is_named_at_construction(device: str, says: str) -> None:
    with pytest.raises(DeviceError, match=says):
        Int4MoE(CFG, device=device)


def test_a_meta_router_beside_real_weights_is_named(generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    with pytest.raises(DeviceError, match="gate_weight must hold values to copy"):
        Int4MoE.from_float(
            w13_weight=w13, w2_weight=w2, config=CFG,
            gate_weight=torch.empty(8, 128, device="meta"),
        )  # fmt: skip
    with pytest.raises(DeviceError, match="e_score_correction_bias must hold values"):
        Int4MoE.from_float(
            w13_weight=w13, w2_weight=w2, config=CFG,
            e_score_correction_bias=torch.empty(8, device="meta"),
        )  # fmt: skip


def test_from_quantized_checks_tensors(generator: torch.Generator) -> None:
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    with pytest.raises(
        ShapeError,
        match=r"w13_qdata must have shape \(4, 128, 64\), got \(8, 128, 64\)",
    ):
        Int4MoE.from_quantized(
            q,
            config=MoEConfig(
                num_experts=4, top_k=2, hidden_size=128, intermediate_size=64
            ),
        )
    bad = quantize_expert_weights(w13, w2, INT4_ASYM_G32, scale_dtype=torch.float16)
    mixed = type(q)(
        **{
            **{
                k: getattr(q, k)
                for k in (
                    "w13_qdata",
                    "w13_scale",
                    "w13_zero_point",
                    "w2_qdata",
                    "w2_zero_point",
                    "scheme",
                )
            },
            "w2_scale": bad.w2_scale.to(torch.float32),
        }
    )
    with pytest.raises(DTypeError, match="w2_scale must have the dtype of w13_scale"):
        Int4MoE.from_quantized(mixed, config=CFG)
    emap = torch.tensor([0, 1, 2, 3, 4, 5, 6, 9], dtype=torch.int32)
    with pytest.raises(
        ShapeError, match=r"expert_map values must be -1 or local ids in \[0, 8\)"
    ):
        Int4MoE.from_quantized(q, config=CFG, expert_map=emap)


def test_unknown_backend_is_reported_for_the_weights_device(
    generator: torch.Generator,
) -> None:
    with pytest.raises(
        BackendUnavailableError, match=r"got 'nope'\. On cpu with torch\.bfloat16: "
    ):
        _module(generator, backend="nope")


def test_zero_points_above_15_are_refused(generator: torch.Generator) -> None:
    """A zero point is one int4 code a byte: 200 would shift every weight of its group."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    assert q.w13_zero_point is not None
    zero = q.w13_zero_point.clone()
    zero[3, 5, 1] = 200
    with pytest.raises(
        ShapeError,
        match=r"w13_zero_point must hold int4 codes 0..15 .*got values up to 200",
    ):
        Int4MoE.from_quantized(attrs.evolve(q, w13_zero_point=zero), config=CFG)


@pytest.mark.parametrize(
    "where",
    ["w13_scale", "w2_scale", "gate_weight", "e_score_correction_bias", "w2_bias"],
)
def test_non_finite_weights_are_refused_where_they_enter(
    where: str, generator: torch.Generator
) -> None:
    """One NaN scale or router entry would turn every token it touches into NaN."""
    w13, w2 = _float_weights(generator)
    cfg = attrs.evolve(CFG, expert_bias=True)
    q = attrs.evolve(
        quantize_expert_weights(w13, w2, INT4_SYM_G32),
        w13_bias=torch.zeros(8, 128, dtype=torch.bfloat16),
        w2_bias=torch.zeros(8, 128, dtype=torch.bfloat16),
    )
    gate, bias = torch.randn(8, 128, generator=generator), torch.zeros(8)
    tensors = {
        "w13_scale": q.w13_scale.clone(),
        "w2_scale": q.w2_scale.clone(),
        "w2_bias": torch.zeros(8, 128, dtype=torch.bfloat16),
        "gate_weight": gate,
        "e_score_correction_bias": bias,
    }
    tensors[where].view(-1)[7] = float("nan")
    q = attrs.evolve(
        q,
        w13_scale=tensors["w13_scale"],
        w2_scale=tensors["w2_scale"],
        w2_bias=tensors["w2_bias"],
    )
    with pytest.raises(ShapeError, match=rf"{where} must be finite, got 1 NaN/inf"):
        Int4MoE.from_quantized(
            q, config=cfg, gate_weight=gate, e_score_correction_bias=bias
        )


@pytest.mark.parametrize("count", [2.0, True, "2"])
def test_num_local_experts_must_be_an_int(count: object) -> None:
    with pytest.raises(
        ConfigTypeError, match="num_local_experts must be an int or None"
    ):
        Int4MoE(CFG, num_local_experts=count)  # type: ignore[arg-type]  # deliberately bad
    import numpy as np

    shard = Int4MoE(CFG, num_local_experts=np.int64(2), device="meta")  # an Integral
    assert shard.get_buffer("w13_qdata").shape[0] == 2


def test_arguments_of_the_wrong_type_are_named(generator: torch.Generator) -> None:
    """What strict mypy catches in users' code is also caught at run time, by name."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    cases: list[tuple[Any, str]] = [
        (lambda: Int4MoE({"num_experts": 8}), "config must be of type MoEConfig, got dict"),  # type: ignore[arg-type]
        (lambda: Int4MoE(CFG, scheme="int4_sym_g32"), "scheme must be of type Int4Scheme, got str"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_quantized(q.tensors(), config=CFG), "weights must be of type QuantizedExpertWeights, got dict"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_quantized(q, config=CFG, expert_map=[0] * 8), "expert_map must be of type Tensor, got list"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_quantized(q, config=CFG, gate_weight=1.0), "gate_weight must be of type Tensor, got float"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_float(w13_weight=w13.numpy(), w2_weight=w2, config=CFG), "w13_weight must be of type Tensor, got ndarray"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_checkpoint(42, prefix="m", config=CFG), "source must be of type str or PathLike or Mapping, got int"),  # type: ignore[arg-type]
        (lambda: Int4MoE.from_checkpoint({}, prefix="m", config=CFG, quantization_config="gptq"), "quantization_config must be of type Mapping, got str"),  # type: ignore[arg-type]
    ]  # fmt: skip
    for call, message in cases:
        with pytest.raises(ConfigTypeError, match=message):
            call()


def test_meta_tensors_are_refused_where_values_are_needed(
    generator: torch.Generator,
) -> None:
    w13, w2 = _float_weights(generator)
    with pytest.raises(
        DeviceError, match="w13_weight must hold values, got a tensor on the meta"
    ):
        Int4MoE.from_float(
            w13_weight=w13.to("meta"), w2_weight=w2.to("meta"), config=CFG
        )
    moe = Int4MoE(CFG, device="meta")  # an empty layer, before its weights are loaded
    with pytest.raises(
        DeviceError, match="must hold its weights to run, got buffers on the meta"
    ):
        moe(
            torch.randn(2, 128, device="meta"),
            router_logits=torch.randn(2, 8, device="meta"),
        )


def test_zero_point_16_is_refused_and_15_accepted(generator: torch.Generator) -> None:
    """The range check's edge: 15 is the largest code, 16 one too many."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    assert q.w2_zero_point is not None
    ok = q.w2_zero_point.clone()
    ok[0, 0, 0] = 15
    Int4MoE.from_quantized(attrs.evolve(q, w2_zero_point=ok), config=CFG)
    bad = q.w2_zero_point.clone()
    bad[1, 2, 1] = 16
    with pytest.raises(
        ShapeError,
        match=r"w2_zero_point must hold int4 codes 0..15 .*got values up to 16",
    ):
        Int4MoE.from_quantized(attrs.evolve(q, w2_zero_point=bad), config=CFG)


def test_weights_on_two_devices_are_refused(generator: torch.Generator) -> None:
    """One tensor left on another device (here meta) is named, not run."""
    w13, w2 = _float_weights(generator)
    q = quantize_expert_weights(w13, w2, INT4_SYM_G32)
    split = attrs.evolve(q, w2_scale=q.w2_scale.to("meta"))
    with pytest.raises(
        DeviceError, match=r"tensors must be on one device, got .*w2_scale on meta"
    ):
        Int4MoE.from_quantized(split, config=CFG)


def test_forward_arguments_of_another_type_are_named(
    generator: torch.Generator,
) -> None:
    moe = _module(generator)
    x = torch.randn(2, 128, generator=generator)
    logits = torch.randn(2, 8, generator=generator)
    with pytest.raises(ConfigTypeError, match=r"hidden_states must be of type Tensor"):
        moe(x.tolist(), logits)  # type: ignore[arg-type]  # deliberately bad
    with pytest.raises(ConfigTypeError, match=r"router_logits must be of type Tensor"):
        moe(x, logits.numpy())  # type: ignore[arg-type]  # deliberately bad
    routing = route_topk(logits, CFG)
    with pytest.raises(ConfigTypeError, match=r"topk_ids must be of type Tensor"):
        moe(x, topk_weights=routing.topk_weights, topk_ids=routing.topk_ids.tolist())  # type: ignore[arg-type]  # deliberately bad
