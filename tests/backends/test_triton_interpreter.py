"""Triton backends on CPU through Triton's interpreter, tiny shapes, vs the oracle.

``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` for the whole session where no CUDA
device exists (before any kernel is imported), so a GPU run keeps compiled kernels.
int4 weights (triton-w4a16) match the float32 oracle up to one-ulp output flips here
(``INTERPRETER_INT4_*``); 16-bit weights (triton-emulation) keep the kernel tolerances.
"""

import pytest
import torch

from backends.base import DeviceInfo, Support
from backends.reference import ReferenceBackend
from backends.registry import select_backend
from backends.triton import (
    EmulationMemoryWarning,
    TritonEmulationBackend,
    TritonEmulationPrepared,
    TritonW4A16Backend,
)
from backends.triton._align import max_row_blocks
from backends.triton._launch import ExpertMatrix
from core.config import Activation, MoEConfig
from core.errors import DTypeError
from core.layout import CANONICAL_LAYOUT
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.backends.alignment_cases import check_alignment
from tests.backends.triton_interpreter_cases import (
    INTERPRETER_ONLY,
    SCHEMES,
    D,
    E,
    F,
    tiny_config,
    weights_for,
)
from tests.tolerances import (
    INTERPRETER_INT4_REL_L2,
    INTERPRETER_INT4_VS_ORACLE,
    KERNEL_VS_ORACLE,
    REL_L2_VS_ORACLE,
    Tolerance,
    rel_l2,
)

pytestmark = INTERPRETER_ONLY

BackendName = str
BACKENDS = ("triton-w4a16", "triton-emulation")


def _run(
    name: BackendName,
    weights: QuantizedExpertWeights,
    hidden_TD: torch.Tensor,
    routing: Routing,
    config: MoEConfig,
) -> torch.Tensor:
    dtype = hidden_TD.dtype
    if name == "triton-w4a16":
        w4a16 = TritonW4A16Backend()
        return w4a16.apply(
            hidden_TD, w4a16.prepare(weights, config, dtype=dtype), routing
        )
    emulation = TritonEmulationBackend()
    with pytest.warns(EmulationMemoryWarning, match="16-bit weights"):
        prepared = emulation.prepare(weights, config, dtype=dtype)
    return emulation.apply(hidden_TD, prepared, routing)


def _bounds(name: BackendName, dtype: torch.dtype) -> tuple[Tolerance, float]:
    """Elementwise tolerance and relative L2 bound vs the oracle for ``name``.

    triton-w4a16 keeps int4 weights and float32 buffers: one-ulp output flips only.
    triton-emulation rounds its weights to 16 bits at load: the kernel tolerances.
    """
    if name == "triton-w4a16":
        return INTERPRETER_INT4_VS_ORACLE[dtype], INTERPRETER_INT4_REL_L2[dtype]
    return KERNEL_VS_ORACLE[dtype], REL_L2_VS_ORACLE[dtype]


def _check(
    name: BackendName,
    config: MoEConfig,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    generator: torch.Generator,
    *,
    tokens: int = 5,
    drop: bool = False,
) -> None:
    weights = weights_for(scheme, dtype, generator)
    hidden_TD = torch.randn(tokens, D, generator=generator).to(dtype)
    routing = route_topk(torch.randn(tokens, E, generator=generator), config)
    if drop and tokens:  # a dropped pair adds zero, whatever its weight
        ids, weights_TK = routing.topk_ids.clone(), routing.topk_weights.clone()
        ids[::2, 0] = -1
        weights_TK[::2, 0] = float("nan")
        routing = Routing(topk_weights=weights_TK, topk_ids=ids)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    actual = _run(name, weights, hidden_TD, routing, config)
    assert actual.dtype == dtype
    assert actual.shape == (tokens, D)
    tol, bound = _bounds(name, dtype)
    torch.testing.assert_close(actual, expected, rtol=tol["rtol"], atol=tol["atol"])
    if tokens:
        assert rel_l2(expected, actual) < bound


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("name", BACKENDS)
def test_matches_oracle(
    name: BackendName,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    generator: torch.Generator,
) -> None:
    _check(name, tiny_config(), scheme, dtype, generator)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "swigluoai"])
@pytest.mark.parametrize("name", BACKENDS)
def test_activations(
    name: BackendName, activation: Activation, generator: torch.Generator
) -> None:
    _check(name, tiny_config(activation), SCHEMES[0], torch.bfloat16, generator)


@pytest.mark.parametrize("name", BACKENDS)
def test_ids_of_minus_one_contribute_zero(
    name: BackendName, generator: torch.Generator
) -> None:
    _check(name, tiny_config(), SCHEMES[1], torch.float16, generator, drop=True)


@pytest.mark.parametrize("name", BACKENDS)
def test_router_weight_on_input(name: BackendName, generator: torch.Generator) -> None:
    config = MoEConfig(
        num_experts=E,
        top_k=1,
        hidden_size=D,
        intermediate_size=F,
        renormalize=False,
        apply_router_weight_on_input=True,
    )
    _check(name, config, SCHEMES[0], torch.float16, generator)


@pytest.mark.parametrize("tokens", [0, 1])
@pytest.mark.parametrize("name", BACKENDS)
def test_zero_and_one_token(
    name: BackendName, tokens: int, generator: torch.Generator
) -> None:
    _check(name, tiny_config(), SCHEMES[2], torch.bfloat16, generator, tokens=tokens)


# 9 and 600 tokens of 3 pairs: one launch (1800 pairs: two 1024-id chunks); 700: the
# count launch first (2100 > ALIGN_ONE_LAUNCH_MAX_PAIRS)
@pytest.mark.parametrize("tokens", [9, 600, 700])
def test_alignment_groups_pairs_stably_by_expert(
    tokens: int, generator: torch.Generator
) -> None:
    check_alignment(torch.randint(-1, E, (tokens, 3), generator=generator), E, 4)


@pytest.mark.parametrize("name", BACKENDS)
def test_supports_refusals(name: BackendName) -> None:
    backend = (
        TritonW4A16Backend() if name == "triton-w4a16" else TritonEmulationBackend()
    )
    config, scheme = tiny_config(), SCHEMES[0]

    def ask(device: DeviceInfo, dtype: torch.dtype) -> Support:
        return backend.supports(config, scheme, CANONICAL_LAYOUT, device, dtype=dtype)

    on_cpu = ask(DeviceInfo(type="cpu"), torch.bfloat16)
    assert on_cpu.ok
    assert on_cpu.explicit_only  # `auto` never picks the interpreter
    assert "interpreter" in on_cpu.reason
    assert ask(DeviceInfo(type="cuda"), torch.bfloat16) == Support.yes()
    assert ask(DeviceInfo(type="xpu"), torch.float16) == Support.yes()
    assert (
        "device must be `cuda` or `xpu`"
        in ask(DeviceInfo(type="other"), torch.bfloat16).reason
    )
    assert ask(DeviceInfo(type="cuda"), torch.float32) == Support.yes()  # run in bf16
    assert "dtype must be" in ask(DeviceInfo(type="cuda"), torch.float64).reason
    auto = select_backend(
        config, scheme, CANONICAL_LAYOUT, DeviceInfo(type="cpu"), dtype=torch.bfloat16
    )
    assert not auto.name.startswith("triton")
    by_name = select_backend(
        config,
        scheme,
        CANONICAL_LAYOUT,
        DeviceInfo(type="cpu"),
        dtype=torch.bfloat16,
        prefer=name,
    )
    assert by_name.name == name


def test_emulation_refuses_packedweights_for(generator: torch.Generator) -> None:
    weights = weights_for(SCHEMES[0], torch.bfloat16, generator)
    prepared = TritonEmulationPrepared(
        weights=weights,
        config=tiny_config(),
        dtype=torch.bfloat16,
        w13=ExpertMatrix(data=weights.w13_qdata),
        w2=ExpertMatrix(data=weights.w2_qdata),
    )
    hidden_TD = torch.randn(2, D, generator=generator).to(torch.bfloat16)
    routing = route_topk(torch.randn(2, E, generator=generator), tiny_config())
    with pytest.raises(DTypeError, match=r"got torch\.uint8"):
        TritonEmulationBackend().apply(hidden_TD, prepared, routing)


def test_apply_rejects_other_backends_prepared(generator: torch.Generator) -> None:
    weights = weights_for(SCHEMES[0], torch.bfloat16, generator)
    prepared = ReferenceBackend().prepare(weights, tiny_config(), dtype=torch.bfloat16)
    hidden_TD = torch.randn(2, D, generator=generator).to(torch.bfloat16)
    routing = route_topk(torch.randn(2, E, generator=generator), tiny_config())
    with pytest.raises(TypeError, match="triton-w4a16"):
        TritonW4A16Backend().apply(hidden_TD, prepared, routing)


@pytest.mark.parametrize("name", BACKENDS)
def test_fp32_inputs_run_in_bf16(name: BackendName, generator: torch.Generator) -> None:
    """fp32 inputs are rounded to bf16 and the bf16 output converted back: exactly the
    bf16 path's result (checked against the oracle by the tests above), in fp32, and
    within bf16's relative error of the float32 oracle on the unrounded input."""
    config, scheme = tiny_config(), SCHEMES[0]
    weights = weights_for(scheme, torch.bfloat16, generator)
    hidden_TD = torch.randn(5, D, generator=generator)
    routing = route_topk(torch.randn(5, E, generator=generator), config)
    actual = _run(name, weights, hidden_TD, routing, config)
    assert actual.dtype == torch.float32
    as_bf16 = _run(name, weights, hidden_TD.to(torch.bfloat16), routing, config)
    torch.testing.assert_close(actual, as_bf16.float(), rtol=0.0, atol=0.0)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert rel_l2(expected, actual) < REL_L2_VS_ORACLE[torch.bfloat16]


def test_prepared_forms_serve_the_dtypes_their_apply_takes(
    generator: torch.Generator,
) -> None:
    weights = weights_for(SCHEMES[0], torch.bfloat16, generator)
    config = tiny_config()
    w4a16 = TritonW4A16Backend().prepare(weights, config, dtype=torch.float16)
    assert [
        w4a16.serves(d) for d in (torch.bfloat16, torch.float16, torch.float32)
    ] == [
        True,
        True,
        True,
    ]
    assert not w4a16.serves(torch.float64)
    with pytest.warns(EmulationMemoryWarning):
        emulation = TritonEmulationBackend().prepare(
            weights, config, dtype=torch.float32
        )
    assert emulation.w13.data.dtype == torch.bfloat16
    assert emulation.serves(torch.bfloat16)
    assert emulation.serves(torch.float32)
    assert not emulation.serves(torch.float16)


def test_emulation_refuses_weights_prepared_for_another_dtype(
    generator: torch.Generator,
) -> None:
    """fp16 weights with bf16 inputs: refused, naming both dtypes (not run mixed)."""
    config = tiny_config()
    weights = weights_for(SCHEMES[0], torch.bfloat16, generator)
    with pytest.warns(EmulationMemoryWarning):
        prepared = TritonEmulationBackend().prepare(
            weights, config, dtype=torch.float16
        )
    hidden_TD = torch.randn(2, D, generator=generator).to(torch.bfloat16)
    routing = route_topk(torch.randn(2, E, generator=generator), config)
    with pytest.raises(
        DTypeError,
        match=r"^hidden_states in torch\.bfloat16 need w13 prepared in torch\.bfloat16, "
        r"got torch\.float16: prepare again with dtype=torch\.bfloat16$",
    ):
        TritonEmulationBackend().apply(hidden_TD, prepared, routing)


def test_emulation_refuses_weights_past_the_sixteen_bit_range(
    generator: torch.Generator,
) -> None:
    """triton-emulation dequantizes to the activation's 16-bit dtype at prepare: a
    weight past fp16's range would be inf there (all-NaN outputs), so it refuses;
    bf16 holds it."""
    from core.errors import ShapeError
    from core.quantize import quantize_expert_weights
    from core.scheme import INT4_SYM_G32

    config = MoEConfig(num_experts=2, top_k=1, hidden_size=64, intermediate_size=32)
    w13 = torch.randn(2, 64, 64, generator=generator) * 1e5
    w2 = torch.randn(2, 64, 32, generator=generator)
    weights = quantize_expert_weights(w13, w2, INT4_SYM_G32, scale_dtype=torch.float32)
    emulation = TritonEmulationBackend()
    with (
        pytest.warns(EmulationMemoryWarning),
        pytest.raises(
            ShapeError,
            match=r"triton-emulation's w13 dequantized to torch.float16 must be finite",
        ),
    ):
        emulation.prepare(weights, config, dtype=torch.float16)
    with pytest.warns(EmulationMemoryWarning):
        emulation.prepare(weights, config, dtype=torch.bfloat16)


def test_alignment_fits_the_worst_case_block_count() -> None:
    """Every expert gets one pair: E blocks, the bound ``max_row_blocks`` must allow."""
    assert max_row_blocks(4, 4, 4) == 4
    assert max_row_blocks(16, 16, 16) == 16
    check_alignment(torch.arange(E).reshape(2, 2), E, 4)
