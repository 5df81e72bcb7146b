"""XPUFusedBackend.supports: every refusal reason, delegation to triton-w4a16, registry."""

import sys
from typing import NoReturn

import attrs
import pytest
import torch

from backends.base import DeviceInfo, Support
from backends.reference import ReferenceBackend
from backends.registry import (
    available_backends,
    create_backend,
    register_backend,
    select_backend,
    unregister_backend,
)
from backends.xpu.ipex import IPEXGatedMLPMOEProvider, load_gated_mlp_moe
from backends.xpu.vllm_kernels import (
    VllmXpuKernelsProvider,
    load_xpu_fused_moe,
    xe2_or_xe3,
)
from backends.xpu_fused import XPUFusedBackend
from core.errors import BackendUnavailableError
from core.layout import CANONICAL_LAYOUT, WeightLayout
from core.reference import moe_forward_reference
from core.scheme import INT4_ASYM_G32, INT4_SYM, INT4_SYM_G32
from tests.backends.fake_xpu_provider import (
    FakeIPEX,
    FakeXpuKernels,
)
from tests.backends.xpu_cases import (
    XPU,
    D,
    T,
    fake_backend,
    make_config,
    make_routing,
    make_weights,
)
from tests.tolerances import EXACT

# ------------------------------------------------------------------ delegation to triton-w4a16


def _register_fake_triton(support: Support) -> None:
    class FakeTriton:
        name = "triton-w4a16"
        prepare = ReferenceBackend.prepare
        apply = ReferenceBackend.apply

        def supports(self, *args: object, **kwargs: object) -> Support:
            return support

    register_backend("triton-w4a16", FakeTriton, priority=30)


def test_delegates_to_triton_when_no_provider_imports(
    generator: torch.Generator,
) -> None:
    _register_fake_triton(Support.yes())
    backend = XPUFusedBackend(
        providers=(VllmXpuKernelsProvider(load=FakeXpuKernels(error="x").load),)
    )
    assert backend.supports(
        make_config(), INT4_SYM_G32, CANONICAL_LAYOUT, XPU, dtype=torch.bfloat16
    ).ok
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    prepared = backend.prepare(weights, make_config(), dtype=torch.bfloat16)
    assert prepared.provider == "triton-w4a16"
    assert prepared.delegate is not None
    # The delegate's (here the reference's) answer.
    assert prepared.serves(torch.float16)
    hidden = torch.randn(T, D, generator=generator).to(torch.bfloat16)
    routing = make_routing(generator)
    torch.testing.assert_close(
        backend.apply(hidden, prepared, routing),
        moe_forward_reference(hidden, weights, routing, make_config()),
        **EXACT,
    )


def test_no_provider_joins_every_reason() -> None:
    _register_fake_triton(Support.no("Intel's Triton is missing"))
    backend = XPUFusedBackend(
        providers=(
            VllmXpuKernelsProvider(
                load=FakeXpuKernels(error="no Level Zero loader").load
            ),
            IPEXGatedMLPMOEProvider(load=FakeIPEX(error="needs torch 2.8").load),
        ),
    )
    support = backend.supports(
        make_config(), INT4_SYM_G32, CANONICAL_LAYOUT, XPU, dtype=torch.bfloat16
    )
    assert not support.ok
    for part in (
        "vllm_xpu_kernels.XpuFusedMoe: vllm_xpu_kernels is not importable: no Level Zero loader",
        "intel_extension_for_pytorch.GatedMLPMOE: intel_extension_for_pytorch is not importable: needs torch 2.8",
        "triton-w4a16: Intel's Triton is missing",
    ):
        assert part in support.reason


def test_prepare_without_any_provider_raises(generator: torch.Generator) -> None:
    unregister_backend("triton-w4a16")
    backend = XPUFusedBackend(
        providers=(VllmXpuKernelsProvider(load=FakeXpuKernels(error="x").load),)
    )
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailableError, match="triton-w4a16: not registered"):
        backend.prepare(weights, make_config(), dtype=torch.bfloat16)


def test_default_loader_turns_a_failed_import_into_a_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm_xpu_kernels", None)
    with pytest.raises(ImportError, match="vllm_xpu_kernels"):
        load_xpu_fused_moe()
    reason = VllmXpuKernelsProvider().refusal(
        make_config(), dtype=torch.bfloat16, device=XPU
    )
    assert reason is not None
    assert reason.startswith("vllm_xpu_kernels is not importable")


# ------------------------------------------------------------------ every refusal reason


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("cpu", "device must be `xpu`, got `cpu`"),
        ("asym", "scheme must be symmetric (no zero points), got int4_asym_g32"),
        ("group-1", "group_size must be one of (32, 64, 128, 256), got -1"),
        ("fp32", "dtype must be torch.bfloat16 or torch.float16, got torch.float32"),
        ("layout", "layout must be the canonical layout"),
        ("n_not_8", "hidden_size (a GEMM N) must be a multiple of 8, got 36"),
        (
            "group_not_dividing",
            "intermediate_size=48 must be divisible by group_size=32",
        ),
        ("top_k", "top_k must be one of (1, 2, 4, 6, 7, 8, 10, 12, 16), got 3"),
        ("experts", "num_experts must be <= 1024, got 2048"),
        (
            "reference_env",
            "VLLM_XPU_FUSED_MOE_USE_REF=' yes' turns on its reference path",
        ),
        ("not_xe2", "the int4 kernel runs only on Xe2 / Xe3 GPUs"),
        ("swiglu_limit", "swigluoai needs (swiglu_alpha, swiglu_limit)=(1.702, 7.0)"),
        (
            "bias",
            "expert biases (config.expert_bias, gpt-oss) are not passed to the XPU",
        ),
    ],
)
def test_refusal_reasons(
    case: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, scheme, layout, device, dtype = (
        make_config(),
        INT4_SYM_G32,
        CANONICAL_LAYOUT,
        XPU,
        torch.bfloat16,
    )
    if case == "cpu":
        device = DeviceInfo(type="cpu")
    elif case == "asym":
        scheme = INT4_ASYM_G32
    elif case == "group-1":
        scheme = INT4_SYM
    elif case == "fp32":
        dtype = torch.float32
    elif case == "layout":
        layout = WeightLayout(w13_gate_up_halves=False)
    elif case == "n_not_8":
        config = make_config(hidden_size=36)
    elif case == "group_not_dividing":
        config = make_config(intermediate_size=48)
    elif case == "top_k":
        config = make_config(top_k=3)
    elif case == "bias":
        config = attrs.evolve(make_config(activation="swigluoai"), expert_bias=True)
    elif case == "experts":
        config = make_config(num_experts=2048)
    elif case == "reference_env":
        monkeypatch.setenv("VLLM_XPU_FUSED_MOE_USE_REF", " yes")
    elif case == "not_xe2":
        pass  # the fake's architecture check answers no, below
    else:
        config = make_config(activation="swigluoai", swiglu_limit=10.0)
    kernels = FakeXpuKernels(xe2_or_xe3=case != "not_xe2")
    support = fake_backend(kernels).supports(
        config, scheme, layout, device, dtype=dtype
    )
    assert not support.ok
    assert expected in support.reason


@pytest.mark.parametrize("value", ["", "0", "false", "off", "no", "0 ", "2"])
def test_reference_env_values_that_leave_the_int4_kernel_on(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vllm-xpu-kernels turns its reference path on only for 1 / on / true / yes / y.
    monkeypatch.setenv("VLLM_XPU_FUSED_MOE_USE_REF", value)
    support = fake_backend(FakeXpuKernels()).supports(
        make_config(), INT4_SYM_G32, CANONICAL_LAYOUT, XPU, dtype=torch.bfloat16
    )
    assert support.ok, support.reason


def test_ipex_refuses_activations_it_lacks() -> None:
    reason = IPEXGatedMLPMOEProvider(load=FakeIPEX().load).refusal(
        make_config(activation="gelu"), dtype=torch.float16, device=XPU
    )
    assert reason == "activation must be `silu` for IPEX int4, got 'gelu'"


def test_supported_with_a_provider() -> None:
    support = fake_backend(FakeXpuKernels()).supports(
        make_config(activation="swigluoai"),
        INT4_SYM_G32,
        CANONICAL_LAYOUT,
        XPU,
        dtype=torch.float16,
    )
    assert support == Support.yes()


def test_apply_rejects_a_foreign_prepared(generator: torch.Generator) -> None:
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    foreign = ReferenceBackend().prepare(weights, make_config(), dtype=torch.bfloat16)
    hidden = torch.zeros(T, D, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="prepared must come from backend 'xpu-fused'"):
        fake_backend(FakeXpuKernels()).apply(hidden, foreign, make_routing(generator))


def test_registered_as_xpu_fused() -> None:
    assert "xpu-fused" in available_backends()
    assert create_backend("xpu-fused").name == "xpu-fused"


def test_auto_sends_biased_layers_on_xpu_to_triton() -> None:
    """xpu-fused refuses gpt-oss biases; ``auto`` moves on to triton-w4a16."""
    config = attrs.evolve(make_config(activation="swigluoai"), expert_bias=True)
    chosen = select_backend(
        config, INT4_SYM_G32, CANONICAL_LAYOUT, XPU, dtype=torch.bfloat16
    )
    assert chosen.name == "triton-w4a16"


def test_the_architecture_check_says_no_without_the_ops() -> None:
    """Without vllm-xpu-kernels' ops (here: no XPU, no package) the int4 path is not
    known to be safe, so the default check answers no rather than guessing."""
    assert not xe2_or_xe3(0)
    assert not xe2_or_xe3(None)


def test_top_k_of_the_pinned_binaries_is_accepted() -> None:
    for top_k in (7, 12, 16):
        config = make_config(num_experts=16, top_k=top_k)
        support = fake_backend(FakeXpuKernels()).supports(
            config, INT4_SYM_G32, CANONICAL_LAYOUT, XPU, dtype=torch.bfloat16
        )
        assert support == Support.yes(), (top_k, support.reason)


def test_prepare_refuses_weights_with_zero_points(generator: torch.Generator) -> None:
    """A direct prepare (no supports before it): zero points must not reach a provider,
    which would drop them (it reads symmetric codes) and give wrong outputs without an
    error."""
    weights = make_weights(generator, INT4_ASYM_G32, scale_dtype=torch.bfloat16)
    kernels = FakeXpuKernels()
    with pytest.raises(
        BackendUnavailableError,
        match=r"cannot prepare this: scheme must be symmetric \(no zero points\), "
        r"got int4_asym_g32",
    ):
        fake_backend(kernels).prepare(weights, make_config(), dtype=torch.bfloat16)
    assert kernels.built == []


def test_prepare_refuses_expert_biases_and_what_supports_refuses(
    generator: torch.Generator,
) -> None:
    """Biases (gpt-oss) and an fp32 compute dtype: a direct prepare raises what
    supports says, instead of running the kernels without the biases."""
    weights = make_weights(generator, INT4_SYM_G32, scale_dtype=torch.bfloat16)
    biased = attrs.evolve(
        weights,
        w13_bias=torch.ones(weights.num_experts, 2 * weights.intermediate_size),
        w2_bias=torch.ones(weights.num_experts, weights.hidden_size),
    )
    kernels = FakeXpuKernels()
    backend = fake_backend(kernels)
    for cfg, w, dtype, reason in (
        (make_config(expert_bias=True), biased, torch.bfloat16, "expert biases"),
        (make_config(), biased, torch.bfloat16, "expert biases are not passed"),
        (make_config(), weights, torch.float32, "dtype must be torch.bfloat16"),
    ):
        with pytest.raises(BackendUnavailableError, match=reason):
            backend.prepare(w, cfg, dtype=dtype)
    assert kernels.built == []


def test_a_missing_delegate_is_named_as_such() -> None:
    backend = XPUFusedBackend(
        providers=(VllmXpuKernelsProvider(load=FakeXpuKernels(error="x").load),),
        delegate=None,
    )
    support = backend.supports(
        make_config(), INT4_SYM_G32, CANONICAL_LAYOUT, XPU, dtype=torch.bfloat16
    )
    assert "delegate: no delegate configured" in support.reason
    assert "None:" not in support.reason


@pytest.mark.parametrize(
    "failure",
    [AttributeError("module 'os' has no attribute 'exit'"), SystemExit(127)],
    ids=["attribute_error", "system_exit"],
)
def test_an_import_guard_that_exits_is_a_refusal(failure: BaseException) -> None:
    """IPEX's check against another torch calls ``os.exit`` (2.8: AttributeError) or
    ``exit(127)``: a reason to refuse, not a crash of backend selection."""

    def load() -> NoReturn:
        raise failure

    reason = IPEXGatedMLPMOEProvider(load=load).refusal(
        make_config(), dtype=torch.bfloat16, device=XPU
    )
    assert reason is not None
    assert reason.startswith("intel_extension_for_pytorch is not importable: ")
    assert type(failure).__name__ in reason


def test_ipex_for_another_torch_is_refused_before_its_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The version is read from the package metadata, so IPEX's own guard never runs."""
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "2.8.10+xpu")
    monkeypatch.setattr(torch, "__version__", "2.9.1")  # whatever torch runs this
    monkeypatch.setitem(sys.modules, "intel_extension_for_pytorch", None)
    with pytest.raises(
        ImportError,
        match=r"intel_extension_for_pytorch 2\.8\.10\+xpu needs torch 2\.8\.\*",
    ):
        load_gated_mlp_moe()


def test_swigluoai_alpha_other_than_the_kernels_is_refused() -> None:
    """The kernel hard-codes alpha 1.702 as well as the limit."""
    kernels = FakeXpuKernels()
    provider = VllmXpuKernelsProvider(load=kernels.load, int4_arch=kernels.int4_arch)
    config = make_config(activation="swigluoai", swiglu_alpha=1.0)
    reason = provider.refusal(config, dtype=torch.bfloat16, device=XPU)
    assert reason is not None
    assert "swigluoai needs (swiglu_alpha, swiglu_limit)=(1.702, 7.0)" in reason
    assert "got (1.0, 7.0)" in reason


def test_vllm_provider_takes_exactly_1024_experts() -> None:
    kernels = FakeXpuKernels()
    provider = VllmXpuKernelsProvider(load=kernels.load, int4_arch=kernels.int4_arch)
    for experts, refused in ((1024, False), (1025, True)):
        reason = provider.refusal(
            make_config(num_experts=experts), dtype=torch.bfloat16, device=XPU
        )
        assert (reason is not None) == refused, reason


def test_a_backend_cannot_delegate_to_itself() -> None:
    backend = XPUFusedBackend(providers=(), delegate="xpu-fused")
    support = backend.supports(
        make_config(), INT4_SYM_G32, CANONICAL_LAYOUT, XPU, dtype=torch.bfloat16
    )
    assert not support.ok
    assert "xpu-fused: a backend cannot delegate to itself" in support.reason
