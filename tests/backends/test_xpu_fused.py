"""XPUFusedBackend against CPU fakes of its providers, and (marker `xpu`) a real XPU."""

import logging

import attrs
import pytest
import torch

from backends.base import DeviceInfo
from backends.xpu.ipex import IPEXGatedMLPMOEProvider
from backends.xpu.vllm_kernels import VllmXpuKernelsProvider
from backends.xpu_fused import XPUFusedBackend, XPUFusedPrepared
from core.config import Activation
from core.errors import ShapeError
from core.layout import CANONICAL_LAYOUT
from core.reference import moe_forward_reference
from core.routing import Routing
from core.scheme import INT4_SYM_G32, Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.backends.fake_xpu_provider import (
    FakeIPEX,
    FakeXpuKernels,
    decode_twos_complement,
    to_twos_complement,
)
from tests.backends.xpu_cases import (
    D,
    E,
    F,
    K,
    T,
    assert_untouched,
    fake_backend,
    make_config,
    make_routing,
    make_weights,
    snapshot,
)
from tests.tolerances import EXACT, KERNEL_VS_ORACLE

# ------------------------------------------------------------------ the fake's contract


def test_nibble_rewrite_is_offset_binary_to_twos_complement() -> None:
    every_byte = torch.arange(256, dtype=torch.uint8)
    rewritten = to_twos_complement(every_byte).view(torch.uint8)
    torch.testing.assert_close(rewritten, every_byte ^ 0x88, **EXACT)
    # Byte 0x80: low code 0 (-8) and high code 8 (0) become 0x08.
    assert (
        int(
            to_twos_complement(torch.tensor([0x80], dtype=torch.uint8)).view(
                torch.uint8
            )
        )
        == 0x08
    )
    codes = decode_twos_complement(
        to_twos_complement(torch.tensor([0x80], dtype=torch.uint8))
    )
    assert codes.tolist() == [-8.0, 0.0]


# ------------------------------------------------------------------ prepare/apply vs the oracle


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh", "swigluoai"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("group_size", [32, 64])
def test_vllm_provider_matches_oracle(
    generator: torch.Generator,
    activation: Activation,
    dtype: torch.dtype,
    group_size: int,
) -> None:
    config = make_config(activation=activation)
    scheme = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=group_size)
    weights = make_weights(generator, scheme, scale_dtype=dtype)
    before = snapshot(weights)
    kernels = FakeXpuKernels()
    backend = fake_backend(kernels)
    prepared = backend.prepare(weights, config, dtype=dtype)
    assert_untouched(weights, before)
    hidden = torch.randn(T, D, generator=generator).to(dtype)
    routing = make_routing(generator)
    out = backend.apply(hidden, prepared, routing)
    assert out.dtype == dtype
    assert out.shape == (T, D)
    expected = moe_forward_reference(hidden, weights, routing, config)
    torch.testing.assert_close(out, expected, **KERNEL_VS_ORACLE[dtype])
    assert_untouched(weights, before)
    (moe,) = kernels.built
    applied_weights, _ = moe.applied[0]
    torch.testing.assert_close(applied_weights, routing.topk_weights, **EXACT)


def test_provider_receives_private_contiguous_canonical_copies(
    generator: torch.Generator,
) -> None:
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    kernels = FakeXpuKernels()
    fake_backend(kernels).prepare(weights, make_config(), dtype=torch.bfloat16)
    got = kernels.built[0].received
    expected = {
        "w13": weights.w13_qdata,
        "w13_scales": weights.w13_scale,
        "w2": weights.w2_qdata,
        "w2_scales": weights.w2_scale,
    }
    for name, source in expected.items():
        seen = got[name]
        assert seen.tensor.data_ptr() != source.data_ptr(), (
            f"{name} aliases the module buffer"
        )
        assert (seen.dtype, seen.shape, seen.stride) == (
            source.dtype,
            tuple(source.shape),
            source.contiguous().stride(),
        )
        torch.testing.assert_close(seen.bytes, source, **EXACT)
    assert got["w13"].shape == (E, 2 * F, D // 2)
    assert got["w13"].dtype == torch.uint8
    assert got["w2"].shape == (E, D, F // 2)
    assert got["w2_scales"].shape == (
        E,
        D,
        F // 32,
    )
    # The provider rewrote its copy in place; the module's bytes stayed offset-binary.
    assert kernels.built[0].w13.dtype == torch.int8
    assert weights.w13_qdata.dtype == torch.uint8


def test_swigluoai_rows_are_interleaved_for_the_kernel(
    generator: torch.Generator,
) -> None:
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    kernels = FakeXpuKernels()
    fake_backend(kernels).prepare(
        weights, make_config(activation="swigluoai"), dtype=torch.bfloat16
    )
    seen = kernels.built[0].received["w13"].bytes
    torch.testing.assert_close(seen[:, 0::2], weights.w13_qdata[:, :F], **EXACT)
    torch.testing.assert_close(seen[:, 1::2], weights.w13_qdata[:, F:], **EXACT)
    scales = kernels.built[0].received["w13_scales"].bytes
    torch.testing.assert_close(scales[:, 1::2], weights.w13_scale[:, F:], **EXACT)


def test_non_contiguous_weights_are_copied_contiguous(
    generator: torch.Generator,
) -> None:
    w = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    strided = QuantizedExpertWeights(
        w13_qdata=w.w13_qdata.transpose(1, 2).contiguous().transpose(1, 2),
        w13_scale=w.w13_scale,
        w13_zero_point=None,
        w2_qdata=w.w2_qdata,
        w2_scale=w.w2_scale.transpose(1, 2).contiguous().transpose(1, 2),
        w2_zero_point=None,
        scheme=w.scheme,
    )
    assert not strided.w13_qdata.is_contiguous()
    kernels = FakeXpuKernels()
    backend = fake_backend(kernels)
    prepared = backend.prepare(strided, make_config(), dtype=torch.bfloat16)
    torch.testing.assert_close(
        kernels.built[0].received["w13"].bytes, w.w13_qdata, **EXACT
    )
    hidden = torch.randn(T, D, generator=generator).to(torch.bfloat16)
    routing = make_routing(generator)
    torch.testing.assert_close(
        backend.apply(hidden, prepared, routing),
        moe_forward_reference(hidden, w, routing, make_config()),
        **KERNEL_VS_ORACLE[torch.bfloat16],
    )


def test_scales_are_converted_to_the_activation_dtype(
    generator: torch.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.float32)
    kernels = FakeXpuKernels()
    backend = fake_backend(kernels)
    with caplog.at_level(logging.INFO, logger="backends.xpu_fused"):
        prepared = backend.prepare(weights, make_config(), dtype=torch.float16)
    assert (
        "converting scales from torch.float32 to the activation dtype torch.float16"
        in caplog.text
    )
    assert kernels.built[0].received["w13_scales"].dtype == torch.float16
    assert weights.w13_scale.dtype == torch.float32
    hidden = torch.randn(T, D, generator=generator).to(torch.float16)
    routing = make_routing(generator)
    expected = moe_forward_reference(hidden, weights, routing, make_config())
    out = backend.apply(hidden, prepared, routing)
    torch.testing.assert_close(out, expected, **KERNEL_VS_ORACLE[torch.float16])


def test_router_weight_on_input_is_not_applied_twice(
    generator: torch.Generator,
) -> None:
    config = make_config(top_k=1, apply_router_weight_on_input=True)
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    kernels = FakeXpuKernels()
    backend = fake_backend(kernels)
    prepared = backend.prepare(weights, config, dtype=torch.bfloat16)
    hidden = torch.randn(T, D, generator=generator).to(torch.bfloat16)
    routing = make_routing(generator, top_k=1)
    out = backend.apply(hidden, prepared, routing)
    torch.testing.assert_close(
        out,
        moe_forward_reference(hidden, weights, routing, config),
        **KERNEL_VS_ORACLE[torch.bfloat16],
    )
    applied_weights, _ = kernels.built[0].applied[0]
    torch.testing.assert_close(applied_weights, torch.ones(T, 1), **EXACT)


def test_experts_held_elsewhere_contribute_zero(generator: torch.Generator) -> None:
    config = make_config()
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    kernels = FakeXpuKernels()
    backend = fake_backend(kernels)
    prepared = backend.prepare(weights, config, dtype=torch.bfloat16)
    hidden = torch.randn(T, D, generator=generator).to(torch.bfloat16)
    routing = make_routing(generator)
    ids = routing.topk_ids.clone()
    ids[0, 1], ids[3, 0], ids[5] = -1, -1, -1
    local = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    out = backend.apply(hidden, prepared, local)
    torch.testing.assert_close(
        out,
        moe_forward_reference(hidden, weights, local, config),
        **KERNEL_VS_ORACLE[torch.bfloat16],
    )
    torch.testing.assert_close(out[5], torch.zeros(D, dtype=torch.bfloat16), **EXACT)
    applied_weights, applied_ids = kernels.built[0].applied[0]
    assert int(applied_ids.min()) >= 0
    assert float(applied_weights[0, 1]) == 0.0
    assert float(applied_weights[5].abs().sum()) == 0.0


def test_pairs_held_elsewhere_never_meet_an_overflowed_expert(
    generator: torch.Generator,
) -> None:
    """fp16, expert 0 overflows on every input: weight 0 * inf would be NaN.

    A remote pair stands in as the token's first held choice (token 0); a token with no
    held choice runs expert 0 on a zero row (token 1).
    """
    config = make_config()
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.float16)
    w13_scale = weights.w13_scale.clone()
    w13_scale[0] *= 2000
    weights = attrs.evolve(weights, w13_scale=w13_scale)
    kernels = FakeXpuKernels()
    backend = fake_backend(kernels)
    prepared = backend.prepare(weights, config, dtype=torch.float16)
    hidden = torch.randn(T, D, generator=generator).to(torch.float16)
    ids = torch.tensor([[1, -1], [-1, -1]] + [[2, 3]] * (T - 2), dtype=torch.int32)
    local = Routing(topk_weights=torch.full((T, 2), 0.5), topk_ids=ids)
    out = backend.apply(hidden, prepared, local)
    expected = moe_forward_reference(hidden, weights, local, config)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, expected, **KERNEL_VS_ORACLE[torch.float16])
    _, applied_ids = kernels.built[0].applied[0]
    assert applied_ids[:2].tolist() == [[1, 1], [0, 0]]


def test_ipex_provider_matches_oracle(generator: torch.Generator) -> None:
    config = make_config()
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.float16)
    before = snapshot(weights)
    ipex = FakeIPEX()
    backend = XPUFusedBackend(
        providers=(
            VllmXpuKernelsProvider(load=FakeXpuKernels(error="no vllm").load),
            IPEXGatedMLPMOEProvider(load=ipex.load),
        ),
        delegate=None,
    )
    prepared = backend.prepare(weights, config, dtype=torch.float16)
    assert isinstance(prepared, XPUFusedPrepared)
    assert prepared.provider == "intel_extension_for_pytorch.GatedMLPMOE"
    assert prepared.serves(torch.float16)
    assert not prepared.serves(torch.bfloat16)  # the provider holds fp16 scales
    seen = ipex.built[0].received["W13"]
    assert seen.dtype == torch.int32
    assert seen.shape == (E, 2 * F, D // 8)
    assert seen.tensor.data_ptr() != weights.w13_qdata.data_ptr()
    hidden = torch.randn(T, D, generator=generator).to(torch.float16)
    routing = make_routing(generator)
    out = backend.apply(hidden, prepared, routing)
    expected = moe_forward_reference(hidden, weights, routing, config)
    torch.testing.assert_close(out, expected, **KERNEL_VS_ORACLE[torch.float16])
    assert_untouched(weights, before)


# ------------------------------------------------------------------ real hardware


@pytest.mark.xpu
def test_real_xpu_matches_oracle(generator: torch.Generator) -> None:
    device = torch.device("xpu")
    backend = XPUFusedBackend()
    support = backend.supports(
        make_config(),
        INT4_SYM_G32,
        CANONICAL_LAYOUT,
        DeviceInfo.of(device),
        dtype=torch.bfloat16,
    )
    if not support.ok:
        pytest.skip(support.reason)
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    moved = QuantizedExpertWeights(
        w13_qdata=weights.w13_qdata.to(device),
        w13_scale=weights.w13_scale.to(device),
        w13_zero_point=None,
        w2_qdata=weights.w2_qdata.to(device),
        w2_scale=weights.w2_scale.to(device),
        w2_zero_point=None,
        scheme=weights.scheme,
    )
    before = snapshot(moved)
    prepared = backend.prepare(moved, make_config(), dtype=torch.bfloat16)
    hidden = torch.randn(T, D, generator=generator).to(torch.bfloat16)
    routing = make_routing(generator)
    out = backend.apply(
        hidden.to(device),
        prepared,
        Routing(
            topk_weights=routing.topk_weights.to(device),
            topk_ids=routing.topk_ids.to(device),
        ),
    )
    expected = moe_forward_reference(hidden, weights, routing, make_config())
    torch.testing.assert_close(out.cpu(), expected, **KERNEL_VS_ORACLE[torch.bfloat16])
    assert_untouched(moved, before)


def test_scales_that_do_not_fit_the_activation_dtype_are_refused(
    generator: torch.Generator,
) -> None:
    """The kernels read scales in the activation dtype: bf16 scales past fp16's range
    would turn into inf there, so prepare refuses them."""
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    big = weights.w13_scale.clone()
    big[0, 0, 0] = 1e6
    with pytest.raises(ShapeError, match=r"must fit torch.float16, got 1 values"):
        fake_backend(FakeXpuKernels()).prepare(
            attrs.evolve(weights, w13_scale=big), make_config(), dtype=torch.float16
        )


def test_zero_tokens_reach_the_fake_kernel_and_give_zero_rows(
    generator: torch.Generator,
) -> None:
    """Zero tokens reach the backend where a gradient is wanted (``Int4MoE``); the
    fake kernel takes them as the contract allows and the output has no rows."""
    config = make_config()
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    backend = fake_backend(FakeXpuKernels())
    prepared = backend.prepare(weights, config, dtype=torch.bfloat16)
    routing = Routing(
        topk_weights=torch.empty(0, K), topk_ids=torch.empty(0, K, dtype=torch.int64)
    )
    out = backend.apply(torch.empty(0, D, dtype=torch.bfloat16), prepared, routing)
    assert out.shape == (0, D)
