"""cpu-int4 against the float64 dense MoE on the same int4 weights, and its refusals.

Every input dtype runs the GEMMs in bf16 (``KERNEL_DTYPE``), so every numerical check
compares with ``tests.dense.dense_moe_f64`` (independent of ``core``) at bf16's
tolerance; ``test_fp32_fp16_inputs_round_to_bf16`` pins down what fp32 and fp16 get.
"""

import re

import pytest
import torch

from backends.base import DeviceInfo, PreparedExperts
from backends.cpu_int4 import KERNEL_DTYPE, CPUInt4Backend
from backends.reference import ReferenceBackend
from backends.registry import (
    available_backends,
    create_backend,
    select_backend,
    unregister_backend,
)
from core.config import ACTIVATIONS, Activation, MoEConfig
from core.errors import BackendUnavailableError, ShapeError
from core.layout import CANONICAL_LAYOUT, WeightLayout
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.dense import dense_moe_f64, dequant_f64
from tests.tolerances import (
    EXACT,
    KERNEL_VS_ORACLE,
    REL_L2_VS_ORACLE,
    Tolerance,
    rel_l2,
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCHEMES = tuple(
    Int4Scheme(mapping=m, group_size=g)
    for m in Int4Mapping
    for g in (32, 64, 128, 256, -1)
)
CPU = DeviceInfo(type="cpu", name="cpu")


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _make_config(
    e: int,
    k: int,
    d: int,
    f: int,
    activation: Activation = "silu",
    *,
    on_input: bool = False,
) -> MoEConfig:
    return MoEConfig(
        num_experts=e,
        top_k=k,
        hidden_size=d,
        intermediate_size=f,
        activation=activation,
        apply_router_weight_on_input=on_input,
        # w13 outputs are about N(0, 1): a limit of 1 makes swigluoai's clamps bite.
        swiglu_limit=1.0,
    )


def _make_weights(
    config: MoEConfig,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    generator: torch.Generator,
) -> QuantizedExpertWeights:
    e, d, f = config.num_experts, config.hidden_size, config.intermediate_size
    w13 = torch.randn(e, 2 * f, d, generator=generator) / d**0.5
    w2 = torch.randn(e, d, f, generator=generator) / f**0.5
    return quantize_expert_weights(w13, w2, scheme, scale_dtype=dtype)


def _make_inputs(
    config: MoEConfig, t: int, dtype: torch.dtype, generator: torch.Generator
) -> tuple[torch.Tensor, Routing]:
    hidden = torch.randn(t, config.hidden_size, generator=generator).to(dtype)
    logits = torch.randn(t, config.num_experts, generator=generator)
    return hidden, route_topk(logits, config)


def _dense_f64(
    config: MoEConfig,
    weights: QuantizedExpertWeights,
    hidden: torch.Tensor,
    routing: Routing,
) -> torch.Tensor:
    """The float64 dense MoE on ``weights`` dequantized in float64 (``tests/dense.py``)."""
    w = weights
    return dense_moe_f64(
        hidden,
        dequant_f64(w.w13_qdata, w.w13_scale, w.w13_zero_point),
        dequant_f64(w.w2_qdata, w.w2_scale, w.w2_zero_point),
        routing.topk_weights,
        routing.topk_ids,
        config=config,
    )


def _check_vs_dense(
    config: MoEConfig,
    weights: QuantizedExpertWeights,
    hidden: torch.Tensor,
    routing: Routing,
) -> torch.Tensor:
    """cpu-int4's output against the float64 dense MoE, at bf16's tolerance."""
    backend = CPUInt4Backend()
    out = backend.apply(
        hidden, backend.prepare(weights, config, dtype=hidden.dtype), routing
    )
    ref = _dense_f64(config, weights, hidden, routing)
    assert out.dtype == hidden.dtype
    assert out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, **KERNEL_VS_ORACLE[KERNEL_DTYPE])
    if ref.numel():
        assert rel_l2(ref, out) < REL_L2_VS_ORACLE[KERNEL_DTYPE]
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
def test_matches_oracle_every_scheme(
    scheme: Int4Scheme, dtype: torch.dtype, generator: torch.Generator
) -> None:
    # D = F = 256 so every group size, -1 included (one group of 256), divides both.
    config = _make_config(4, 2, 256, 256)
    weights = _make_weights(config, scheme, dtype, generator)
    hidden, routing = _make_inputs(config, 9, dtype, generator)
    _check_vs_dense(config, weights, hidden, routing)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize(
    "mapping", [Int4Mapping.SYMMETRIC, Int4Mapping.ASYMMETRIC], ids=lambda m: m.value
)
def test_matches_oracle_groups_split_for_the_kernel(
    mapping: Int4Mapping, dtype: torch.dtype, generator: torch.Generator
) -> None:
    # group_size=-1: one group of 512 along D (2 kernel groups of 256 sharing its scale
    # and zero point) and of 96 along F (3 of 32).
    config = _make_config(4, 2, 512, 96)
    scheme = Int4Scheme(mapping=mapping, group_size=-1)
    weights = _make_weights(config, scheme, dtype, generator)
    prepared = CPUInt4Backend().prepare(weights, config, dtype=dtype)
    assert (prepared.w13_group_size, prepared.w2_group_size) == (256, 32)
    assert prepared.w13_scale_and_zero.shape == (4, 2, 192, 2)
    assert prepared.w2_scale_and_zero.shape == (4, 3, 512, 2)
    hidden, routing = _make_inputs(config, 9, dtype, generator)
    _check_vs_dense(config, weights, hidden, routing)


@pytest.mark.parametrize(
    ("e", "k", "t"),
    [(1, 1, 1), (2, 2, 7), (4, 3, 64), (8, 4, 7), (16, 4, 64), (16, 1, 1), (8, 2, 0)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_matches_oracle_shapes(
    e: int, k: int, t: int, dtype: torch.dtype, generator: torch.Generator
) -> None:
    config = _make_config(e, k, 64, 96)
    weights = _make_weights(config, Int4Scheme(group_size=32), dtype, generator)
    hidden, routing = _make_inputs(config, t, dtype, generator)
    _check_vs_dense(config, weights, hidden, routing)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_matches_oracle_activations(
    activation: Activation, dtype: torch.dtype, generator: torch.Generator
) -> None:
    config = _make_config(4, 2, 128, 64, activation)
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=64)
    weights = _make_weights(config, scheme, dtype, generator)
    hidden, routing = _make_inputs(config, 7, dtype, generator)
    _check_vs_dense(config, weights, hidden, routing)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_minus_one_ids_contribute_zero(
    dtype: torch.dtype, generator: torch.Generator
) -> None:
    config = _make_config(8, 3, 64, 64)
    weights = _make_weights(config, Int4Scheme(group_size=64), dtype, generator)
    hidden, routing = _make_inputs(config, 16, dtype, generator)
    ids = routing.topk_ids.clone()
    ids[::2, 0] = -1
    ids[3] = -1
    partial = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    out = _check_vs_dense(config, weights, hidden, partial)
    torch.testing.assert_close(out[3], torch.zeros_like(out[3]), **EXACT)
    full = _check_vs_dense(config, weights, hidden, routing)
    assert not torch.equal(out[0], full[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_router_weight_on_input(dtype: torch.dtype, generator: torch.Generator) -> None:
    config = _make_config(4, 1, 64, 64, on_input=True)
    weights = _make_weights(config, Int4Scheme(group_size=32), dtype, generator)
    hidden, routing = _make_inputs(config, 7, dtype, generator)
    # Renormalized top-1 weights are all 1; random ones make the two placements differ.
    weights_TK = 0.2 + 0.8 * torch.rand(routing.topk_ids.shape, generator=generator)
    scaled = Routing(topk_weights=weights_TK, topk_ids=routing.topk_ids)
    on_input = _check_vs_dense(config, weights, hidden, scaled)
    on_output = _make_config(4, 1, 64, 64)
    backend = CPUInt4Backend()
    prepared = backend.prepare(weights, on_output, dtype=dtype)
    # SiLU is not linear: weighting the input differs from weighting the output.
    assert rel_l2(backend.apply(hidden, prepared, scaled), on_input) > 0.05


def test_scales_in_another_dtype_than_activations(generator: torch.Generator) -> None:
    config = _make_config(4, 2, 64, 64)
    weights = _make_weights(config, Int4Scheme(group_size=32), torch.float32, generator)
    hidden, routing = _make_inputs(config, 7, torch.bfloat16, generator)
    _check_vs_dense(config, weights, hidden, routing)


def test_input_dtype_other_than_prepared_is_converted(
    generator: torch.Generator,
) -> None:
    config = _make_config(4, 2, 64, 64)
    weights = _make_weights(
        config, Int4Scheme(group_size=32), torch.bfloat16, generator
    )
    hidden, routing = _make_inputs(config, 7, torch.float32, generator)
    backend = CPUInt4Backend()
    prepared = backend.prepare(weights, config, dtype=torch.bfloat16)
    out = backend.apply(hidden, prepared, routing)
    assert out.dtype == torch.float32
    ref = _dense_f64(config, weights, hidden, routing)
    torch.testing.assert_close(out.double(), ref, **KERNEL_VS_ORACLE[torch.bfloat16])


def test_prepare_twice_is_deterministic_and_pure(generator: torch.Generator) -> None:
    config = _make_config(4, 2, 128, 64)
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=32)
    weights = _make_weights(config, scheme, torch.bfloat16, generator)
    before = {k: (v.clone(), v.data_ptr()) for k, v in weights.tensors().items()}
    hidden, routing = _make_inputs(config, 9, torch.bfloat16, generator)
    backend = CPUInt4Backend()
    first = backend.prepare(weights, config, dtype=torch.bfloat16)
    second = backend.prepare(weights, config, dtype=torch.bfloat16)
    assert first.w13_packed is not None
    assert second.w13_packed is not None
    assert first.w13_packed.data_ptr() != second.w13_packed.data_ptr()
    out1 = backend.apply(hidden, first, routing)
    out2 = backend.apply(hidden, second, routing)
    torch.testing.assert_close(out1, out2, **EXACT)
    for name, tensor in weights.tensors().items():
        saved, ptr = before[name]
        assert tensor.data_ptr() == ptr, name
        assert tensor.dtype == saved.dtype, name
        assert torch.equal(tensor.view(torch.uint8), saved.view(torch.uint8)), name


def test_wrong_prepared_type_raises(generator: torch.Generator) -> None:
    config = _make_config(2, 1, 64, 32)
    weights = _make_weights(config, Int4Scheme(group_size=32), torch.float32, generator)
    hidden, routing = _make_inputs(config, 3, torch.float32, generator)
    foreign: PreparedExperts = ReferenceBackend().prepare(
        weights, config, dtype=torch.float32
    )
    with pytest.raises(
        TypeError,
        match=r"'cpu-int4'\.prepare \(CPUInt4Prepared\), got ReferencePrepared",
    ):
        CPUInt4Backend().apply(hidden, foreign, routing)


@pytest.mark.parametrize(
    ("d", "f", "group", "dtype", "device", "reason"),
    [
        (64, 64, 32, torch.float32, DeviceInfo(type="cuda", index=0), "needs a CPU device, got cuda"),
        (64, 64, 32, torch.float32, DeviceInfo(type="xpu"), "needs a CPU device, got xpu"),
        (64, 64, 32, torch.float64, CPU, "activation dtype must be one of .* got torch.float64"),
        (64, 20, 32, torch.float32, CPU, r"w13 \(2F x D\): output rows must be a multiple of 16, got 40"),
        (40, 64, 32, torch.float32, CPU, r"w2 \(D x F\): output rows must be a multiple of 16, got 40"),
        (48, 64, -1, torch.float32, CPU, r"w13 .*got 48 \(group_size=-1 is one group of 48\)"),
        (64, 48, -1, torch.float32, CPU, r"w2 .*group size must be a multiple of one of \(32, 64, 128, 256\), got 48"),
        (96, 64, 64, torch.float32, CPU, r"w13 .*reduction size 96 must be a multiple of group size 64"),
        (128, 160, 128, torch.float32, CPU, r"w2 .*reduction size 160 must be a multiple of group size 128"),
    ],
)  # fmt: skip
def test_refusals_name_the_reason(
    d: int, f: int, group: int, dtype: torch.dtype, device: DeviceInfo, reason: str
) -> None:
    config = _make_config(2, 1, d, f)
    scheme = Int4Scheme(group_size=group)
    support = CPUInt4Backend().supports(
        config, scheme, CANONICAL_LAYOUT, device, dtype=dtype
    )
    assert not support.ok
    assert support.reason
    assert re.search(reason, support.reason), support.reason


def test_refuses_non_canonical_layout() -> None:
    layout = WeightLayout(w13_gate_up_halves=False)
    config = _make_config(2, 1, 64, 64)
    support = CPUInt4Backend().supports(
        config, Int4Scheme(), layout, CPU, dtype=torch.bfloat16
    )
    assert not support.ok
    assert "canonical layout" in support.reason


def test_refuses_torch_without_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("backends.cpu_int4._MM_OP", "_no_such_int4_mm_op")
    config = _make_config(2, 1, 64, 64)
    support = CPUInt4Backend().supports(
        config, Int4Scheme(), CANONICAL_LAYOUT, CPU, dtype=torch.bfloat16
    )
    assert not support.ok
    assert (
        "lacks torch.ops.aten._convert_weight_to_int4pack_for_cpu or ._no_such_int4_mm_op"
        in support.reason
    )


def test_supports_the_qwen3_shape() -> None:
    config = MoEConfig(
        num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768
    )
    for scheme in SCHEMES:
        support = CPUInt4Backend().supports(
            config, scheme, CANONICAL_LAYOUT, CPU, dtype=torch.bfloat16
        )
        # -1 is one group of 2048 along D and 768 along F: 8 and 3 kernel groups of 256.
        assert support.ok, (scheme.name, support.reason)


def test_prepare_refuses_unsupported_weights(generator: torch.Generator) -> None:
    config = _make_config(2, 1, 48, 64)
    weights = _make_weights(config, Int4Scheme(group_size=-1), torch.float32, generator)
    with pytest.raises(
        BackendUnavailableError, match=r"cpu-int4 cannot prepare.*got 48"
    ):
        CPUInt4Backend().prepare(weights, config, dtype=torch.float32)


def test_registry_prefers_cpu_int4_on_cpu_and_falls_back() -> None:
    assert isinstance(create_backend("cpu-int4"), CPUInt4Backend)
    # Only these two: with TRITON_INTERPRET=1 (tests/conftest.py, without CUDA) the Triton
    # backends also accept CPU and outrank cpu-int4. The fixture restores the registry.
    for name in available_backends():
        if name not in ("cpu-int4", "reference"):
            unregister_backend(name)
    config = _make_config(4, 2, 512, 64)
    good = select_backend(
        config, Int4Scheme(group_size=-1), CANONICAL_LAYOUT, CPU, dtype=torch.bfloat16
    )
    assert good.name == "cpu-int4"
    bad = select_backend(
        _make_config(4, 2, 48, 64),
        Int4Scheme(group_size=-1),
        CANONICAL_LAYOUT,
        CPU,
        dtype=torch.bfloat16,
    )
    assert bad.name == "reference"


def test_module_saves_no_packed_form_and_repacks_after_load(
    generator: torch.Generator,
) -> None:
    from modules.int4_moe import Int4MoE

    config = _make_config(4, 2, 64, 64)
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=32)
    weights = _make_weights(config, scheme, torch.bfloat16, generator)
    hidden, routing = _make_inputs(config, 6, torch.bfloat16, generator)
    ids, topk = routing.topk_ids, routing.topk_weights
    source = Int4MoE.from_quantized(weights, config=config, backend="cpu-int4")
    expected = source(hidden, topk_weights=topk, topk_ids=ids)
    assert source.backend_name == "cpu-int4"
    state = source.state_dict()
    assert set(state) == set(weights.tensors())
    target = Int4MoE(config, scheme=scheme, backend="cpu-int4", dtype=torch.bfloat16)
    target.load_state_dict(state)
    torch.testing.assert_close(
        target(hidden, topk_weights=topk, topk_ids=ids), expected, **EXACT
    )
    # Editing the weights and reloading must rebuild the packed form, not reuse it.
    state["w2_scale"] = state["w2_scale"] * 2
    target.load_state_dict(state)
    doubled = target(hidden, topk_weights=topk, topk_ids=ids)
    torch.testing.assert_close(
        doubled, expected * 2, **KERNEL_VS_ORACLE[torch.bfloat16]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_fp32_fp16_inputs_round_to_bf16(
    dtype: torch.dtype, generator: torch.Generator
) -> None:
    """fp32/fp16 inputs give the bf16 path's float32 sums, in the input's dtype."""
    config = _make_config(4, 2, 128, 64)
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=32)
    weights = _make_weights(config, scheme, torch.bfloat16, generator)
    hidden, routing = _make_inputs(config, 9, dtype, generator)
    backend = CPUInt4Backend()
    out = backend.apply(hidden, backend.prepare(weights, config, dtype=dtype), routing)
    assert out.dtype == dtype
    as_bf16 = backend.apply(
        hidden.to(torch.bfloat16),
        backend.prepare(weights, config, dtype=torch.bfloat16),
        routing,
    )
    # Same rounded input, same float32 sums: equal once rounded to bf16 as well, up to
    # one bf16 step where fp16's rounding came first (a double rounding).
    tolerance = EXACT if dtype == torch.float32 else Tolerance(rtol=2.0**-7, atol=1e-7)
    torch.testing.assert_close(out.to(torch.bfloat16), as_bf16, **tolerance)
    exact = moe_forward_reference(hidden.float(), weights, routing, config)
    assert rel_l2(exact, out) > REL_L2_VS_ORACLE[dtype]  # not the float32 math


def test_ids_outside_the_held_experts_raise(generator: torch.Generator) -> None:
    """As the reference does: an id past the experts held here is not dropped."""
    config = _make_config(4, 2, 64, 64)
    weights = _make_weights(
        config, Int4Scheme(group_size=32), torch.bfloat16, generator
    )
    hidden, routing = _make_inputs(config, 3, torch.bfloat16, generator)
    bad = Routing(
        topk_weights=routing.topk_weights,
        topk_ids=torch.tensor([[0, 1], [2, 4], [3, -1]]),
    )
    backend = CPUInt4Backend()
    prepared = backend.prepare(weights, config, dtype=torch.bfloat16)
    with pytest.raises(
        ShapeError, match=r"local expert ids in \[0, 4\), got values in \[-1, 4\]"
    ):
        backend.apply(hidden, prepared, bad)


def test_router_weight_on_input_rounds_the_weighted_input_once(
    generator: torch.Generator,
) -> None:
    """fp32 input: ``x * w`` is formed in float32 from the input as given, then rounded to bf16:
    the same as handing the backend ``x * w`` with weight 1 (rounding ``x`` to bf16
    first as well would round twice)."""
    dtype = torch.float32
    config = _make_config(4, 1, 64, 64, on_input=True)
    weights = _make_weights(config, Int4Scheme(group_size=32), dtype, generator)
    hidden, routing = _make_inputs(config, 7, dtype, generator)
    weights_TK = 0.2 + 0.8 * torch.rand(routing.topk_ids.shape, generator=generator)
    backend = CPUInt4Backend()
    prepared = backend.prepare(weights, config, dtype=dtype)
    out = backend.apply(
        hidden, prepared, Routing(topk_weights=weights_TK, topk_ids=routing.topk_ids)
    )
    pre_scaled = hidden * weights_TK  # float32, as the backend forms it
    ones = Routing(topk_weights=torch.ones_like(weights_TK), topk_ids=routing.topk_ids)
    torch.testing.assert_close(out, backend.apply(pre_scaled, prepared, ones), **EXACT)
