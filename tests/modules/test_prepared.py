"""Int4MoE's prepared form: rebuilt when its weights, backend or a dtype it does not
serve change; never copied."""

import copy
import io
from typing import Any, final

import attrs
import pytest
import torch

from backends import register_backend
from backends.base import PreparedExperts, Support, check_prepared
from backends.cpu_int4 import CPUInt4Backend
from backends.reference import ReferenceBackend
from core.config import MoEConfig
from core.errors import BackendUnavailableError
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, Int4Scheme
from core.weights import QuantizedExpertWeights
from modules import Int4MoE
from modules.prepared import WEIGHT_BUFFERS, PreparedCache
from tests.tolerances import EXACT, KERNEL_VS_ORACLE

CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)


def _module(
    gen: torch.Generator,
    scheme: Int4Scheme = INT4_SYM_G32,
    config: MoEConfig = CFG,
    **kw: Any,
) -> Int4MoE:
    w13 = torch.randn(8, 128, 128, generator=gen) * 0.05
    w2 = torch.randn(8, 128, 64, generator=gen) * 0.05
    return Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=config, scheme=scheme, **kw
    )


def test_load_state_dict_rebuilds_prepared(generator: torch.Generator) -> None:
    a, b = _module(generator), _module(generator)
    x = torch.randn(4, 128, generator=generator)
    logits = torch.randn(4, 8, generator=generator)
    a(x, router_logits=logits)
    a.load_state_dict(b.state_dict())
    torch.testing.assert_close(
        a(x, router_logits=logits), b(x, router_logits=logits), **EXACT
    )


def test_to_dtype_converts_scales_and_rebuilds(generator: torch.Generator) -> None:
    moe = _module(generator, backend="reference")
    x = torch.randn(5, 128, generator=generator, dtype=torch.float16)
    logits = torch.randn(5, 8, generator=generator)
    moe(x, router_logits=logits)
    moe.to(torch.float16)
    assert moe.w13_scale.dtype == torch.float16
    assert moe.w13_qdata.dtype == torch.uint8
    expected = moe_forward_reference(x, moe.weights, route_topk(logits, CFG), CFG)
    torch.testing.assert_close(moe(x, router_logits=logits), expected, **EXACT)


def _reassign(moe: Int4MoE, name: str, *, via_data: bool) -> None:
    """Replace one weight buffer by a changed tensor (not in place)."""
    old = getattr(moe, name)
    new = old.roll(1, dims=1) if old.dtype == torch.uint8 else old * 2
    if via_data:
        old.data = new  # same tensor object, new memory
    else:
        setattr(moe, name, new)


# Every buffer a prepared form is built from: asymmetric (zero points) with biases.
BIASED = attrs.evolve(CFG, expert_bias=True)


def _biased_module(generator: torch.Generator) -> Int4MoE:
    """A layer holding every one of ``WEIGHT_BUFFERS``."""
    return _module(
        generator,
        INT4_ASYM_G32,
        config=BIASED,
        w13_bias=torch.randn(8, 128, generator=generator) * 0.1,
        w2_bias=torch.randn(8, 128, generator=generator) * 0.1,
    )


@pytest.mark.parametrize("via_data", [False, True], ids=["setattr", "data"])
@pytest.mark.parametrize("name", WEIGHT_BUFFERS)
def test_reassigned_weights_are_prepared_again(
    name: str, via_data: bool, generator: torch.Generator
) -> None:
    moe = _biased_module(generator)
    assert name in dict(moe.named_buffers())  # the module holds every weight buffer
    x = torch.randn(6, 128, generator=generator, dtype=torch.bfloat16)
    logits = torch.randn(6, 8, generator=generator)
    before = moe(x, router_logits=logits)
    assert moe.backend_name == "cpu-int4"  # packs its own copy at prepare
    _reassign(moe, name, via_data=via_data)
    routing = route_topk(logits, BIASED)
    expected = moe_forward_reference(x, moe.weights, routing, BIASED)
    tol = KERNEL_VS_ORACLE[torch.bfloat16]
    # the change shows in the output, so serving the old weights fails the check below
    assert not torch.allclose(before, expected, **tol)
    torch.testing.assert_close(moe(x, router_logits=logits), expected, **tol)


@pytest.mark.parametrize("via_data", [False, True], ids=["setattr", "data"])
@pytest.mark.parametrize("name", WEIGHT_BUFFERS)
def test_cache_is_stale_after_any_weight_buffer_changes(
    name: str, via_data: bool, generator: torch.Generator
) -> None:
    """The cache itself sees every change, even where a forward cannot show it.

    cpu-int4 reads the biases live, so after ``bias.data = ...`` a stale prepared
    form still gives the right output and the test above passes either way.
    """
    moe = _module(
        generator,
        INT4_ASYM_G32,
        config=BIASED,
        w13_bias=torch.randn(8, 128, generator=generator),
        w2_bias=torch.randn(8, 128, generator=generator),
    )
    backend = ReferenceBackend()
    key = (torch.device("cpu"), torch.bfloat16)
    cache = PreparedCache.from_buffers(
        dict(moe.named_buffers()),
        key=key,
        backend=backend,
        prepared=backend.prepare(moe.weights, BIASED, dtype=torch.bfloat16),
    )
    assert cache.is_current(key, dict(moe.named_buffers()))
    _reassign(moe, name, via_data=via_data)
    assert not cache.is_current(key, dict(moe.named_buffers()))


def _edit_in_place(moe: Int4MoE, name: str) -> None:
    """Change one weight buffer in place (same tensor, same memory)."""
    t = moe.get_buffer(name)
    with torch.no_grad():
        if t.dtype == torch.uint8:
            t.copy_(t.roll(1, dims=1))
        else:
            t.mul_(2)


@pytest.mark.parametrize("name", WEIGHT_BUFFERS)
def test_weights_edited_in_place_are_prepared_again(
    name: str, generator: torch.Generator
) -> None:
    moe = _biased_module(generator)
    x = torch.randn(6, 128, generator=generator, dtype=torch.bfloat16)
    logits = torch.randn(6, 8, generator=generator)
    before = moe(x, router_logits=logits)
    prepared = moe._prepared
    moe(x, router_logits=logits)
    assert moe._prepared is prepared  # nothing edited: not prepared again
    _edit_in_place(moe, name)
    expected = moe_forward_reference(x, moe.weights, route_topk(logits, BIASED), BIASED)
    tol = KERNEL_VS_ORACLE[torch.bfloat16]
    assert not torch.allclose(before, expected, **tol)
    torch.testing.assert_close(moe(x, router_logits=logits), expected, **tol)
    assert moe._prepared is not prepared


def test_inference_tensors_edited_in_place_need_invalidate_prepared(
    generator: torch.Generator,
) -> None:
    """Tensors made under inference mode keep no version counter."""
    with torch.inference_mode():
        moe = _module(generator)
        x = torch.randn(6, 128, generator=generator, dtype=torch.bfloat16)
        logits = torch.randn(6, 8, generator=generator)
        before = moe(x, router_logits=logits)
        moe.get_buffer("w2_scale").mul_(2)
        torch.testing.assert_close(moe(x, router_logits=logits), before, **EXACT)
        moe.invalidate_prepared()
        assert not torch.allclose(moe(x, router_logits=logits), before)


@pytest.mark.parametrize("how", ["torch.save", "deepcopy"])
def test_copies_leave_the_prepared_form_out(
    how: str, generator: torch.Generator
) -> None:
    moe = _module(generator, gate_weight=torch.randn(8, 128, generator=generator))
    x = torch.randn(5, 128, generator=generator, dtype=torch.bfloat16)
    before = moe(x)
    if how == "deepcopy":
        copied = copy.deepcopy(moe)
    else:
        buffer = io.BytesIO()
        torch.save(moe, buffer)
        buffer.seek(0)
        copied = torch.load(buffer, weights_only=False)
    assert copied.backend_name is None  # nothing machine specific came along
    torch.testing.assert_close(copied(x), before, **EXACT)
    assert copied.backend_name == moe.backend_name


def test_setting_backend_checks_and_selects_again(generator: torch.Generator) -> None:
    moe = _module(generator)
    x = torch.randn(3, 128, generator=generator, dtype=torch.bfloat16)
    logits = torch.randn(3, 8, generator=generator)
    moe(x, router_logits=logits)
    assert moe.backend_name == "cpu-int4"
    moe.backend = "reference"
    moe(x, router_logits=logits)
    assert moe.backend_name == "reference"
    with pytest.raises(BackendUnavailableError, match=r"got 'nope'\. On cpu with"):
        moe.backend = "nope"
    assert moe.backend == "reference"


DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def _count_prepares(
    monkeypatch: pytest.MonkeyPatch, cls: type[Any]
) -> list[torch.dtype]:
    """Record the dtype of every ``cls.prepare`` call from now on."""
    calls: list[torch.dtype] = []
    original = cls.prepare

    def prepare(self: Any, *args: Any, dtype: torch.dtype, **kw: Any) -> Any:
        calls.append(dtype)
        return original(self, *args, dtype=dtype, **kw)

    monkeypatch.setattr(cls, "prepare", prepare)
    return calls


@pytest.mark.parametrize(
    ("name", "cls"), [("cpu-int4", CPUInt4Backend), ("reference", ReferenceBackend)]
)
def test_alternating_dtypes_prepare_once(
    name: str,
    cls: type[Any],
    monkeypatch: pytest.MonkeyPatch,
    generator: torch.Generator,
) -> None:
    """A form that does not depend on the dtype serves each one: one prepare, and
    each output equals a fresh layer's for that dtype alone."""
    moe = _module(generator, backend=name)
    fresh = {d: _module(torch.Generator().manual_seed(0), backend=name) for d in DTYPES}
    for layer in fresh.values():
        layer.load_state_dict(moe.state_dict())
    x = torch.randn(5, 128, generator=generator)
    logits = torch.randn(5, 8, generator=generator)
    expected = {d: fresh[d](x.to(d), router_logits=logits) for d in DTYPES}
    calls = _count_prepares(monkeypatch, cls)
    for dtype in (*DTYPES, *DTYPES):
        out = moe(x.to(dtype), router_logits=logits)
        torch.testing.assert_close(out, expected[dtype], **EXACT)
    assert calls == [torch.bfloat16]
    assert moe.backend_name == name


@final
@attrs.frozen(kw_only=True, eq=False)
class _OneDtypePrepared(PreparedExperts):
    """Serves only the dtype it was prepared for (the base class's answer)."""


class _OneDtypeBackend:
    """The reference math behind a prepared form that serves one dtype."""

    name = "one-dtype"

    def supports(self, *args: Any, **kw: Any) -> Support:
        return Support.yes()

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> _OneDtypePrepared:
        return _OneDtypePrepared(weights=weights, config=config, dtype=dtype)

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        ready = check_prepared(prepared, _OneDtypePrepared, self.name)
        assert hidden_TD.dtype == ready.dtype  # what the cache must guarantee
        return moe_forward_reference(hidden_TD, ready.weights, routing, ready.config)


def test_a_form_serving_one_dtype_is_prepared_on_each_switch(
    monkeypatch: pytest.MonkeyPatch, generator: torch.Generator
) -> None:
    register_backend("one-dtype", _OneDtypeBackend, priority=1000)
    moe = _module(generator, backend="one-dtype")
    x = torch.randn(5, 128, generator=generator)
    logits = torch.randn(5, 8, generator=generator)
    calls = _count_prepares(monkeypatch, _OneDtypeBackend)
    for dtype in (torch.bfloat16, torch.bfloat16, torch.float16, torch.bfloat16):
        expected = moe_forward_reference(
            x.to(dtype), moe.weights, route_topk(logits, CFG), CFG
        )
        torch.testing.assert_close(
            moe(x.to(dtype), router_logits=logits), expected, **EXACT
        )
    assert calls == [torch.bfloat16, torch.float16, torch.bfloat16]


@final
class _Fp16Only(_OneDtypeBackend):
    name = "fp16-only"

    def supports(self, *args: Any, dtype: torch.dtype, **kw: Any) -> Support:
        return Support.yes() if dtype == torch.float16 else Support.no("fp16 only")


def test_another_backend_chosen_for_a_dtype_prepares(
    generator: torch.Generator,
) -> None:
    """The served dtypes count only while ``auto`` picks the same backend."""
    register_backend("fp16-only", _Fp16Only, priority=1000)
    moe = _module(generator)
    x = torch.randn(5, 128, generator=generator)
    logits = torch.randn(5, 8, generator=generator)
    names = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float16):
        moe(x.to(dtype), router_logits=logits)
        names.append(moe.backend_name)
    assert names == ["cpu-int4", "fp16-only", "cpu-int4", "fp16-only"]


def test_cache_refuses_to_serve_a_dtype_its_form_does_not(
    generator: torch.Generator,
) -> None:
    moe = _module(generator)
    backend = _OneDtypeBackend()
    cache = PreparedCache.from_buffers(
        dict(moe.named_buffers()),
        key=(torch.device("cpu"), torch.bfloat16),
        backend=backend,
        prepared=backend.prepare(moe.weights, CFG, dtype=torch.bfloat16),
    )
    with pytest.raises(ValueError, match=r"one-dtype.*got torch\.float16"):
        cache.serving(torch.float16)
