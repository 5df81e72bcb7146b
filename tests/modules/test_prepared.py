"""Int4MoE's prepared form: rebuilt when its weights, dtype or backend change; never copied."""

import copy
import io
from typing import Any

import pytest
import torch

from core.config import MoEConfig
from core.errors import BackendUnavailableError
from core.reference import moe_forward_reference
from core.routing import route_topk
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, Int4Scheme
from modules import Int4MoE
from tests.tolerances import EXACT, KERNEL_VS_ORACLE

CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)


def _module(
    gen: torch.Generator, scheme: Int4Scheme = INT4_SYM_G32, **kw: Any
) -> Int4MoE:
    w13 = torch.randn(8, 128, 128, generator=gen) * 0.05
    w2 = torch.randn(8, 128, 64, generator=gen) * 0.05
    return Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, scheme=scheme, **kw
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


def _reassign(moe: Int4MoE, name: str) -> None:
    """Replace one weight buffer by a changed tensor (not in place)."""
    old = getattr(moe, name.removesuffix(".data"))
    new = old.roll(1, dims=1) if old.dtype == torch.uint8 else old * 2
    if name.endswith(".data"):
        old.data = new
    else:
        setattr(moe, name, new)


@pytest.mark.parametrize(
    "name", ["w13_qdata", "w13_scale", "w13_zero_point", "w2_qdata", "w2_scale.data"]
)
def test_reassigned_weights_are_prepared_again(
    name: str, generator: torch.Generator
) -> None:
    moe = _module(generator, INT4_ASYM_G32)
    x = torch.randn(6, 128, generator=generator, dtype=torch.bfloat16)
    logits = torch.randn(6, 8, generator=generator)
    moe(x, router_logits=logits)
    assert moe.backend_name == "cpu-int4"  # packs its own copy at prepare
    _reassign(moe, name)
    expected = moe_forward_reference(x, moe.weights, route_topk(logits, CFG), CFG)
    torch.testing.assert_close(
        moe(x, router_logits=logits), expected, **KERNEL_VS_ORACLE[torch.bfloat16]
    )


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
