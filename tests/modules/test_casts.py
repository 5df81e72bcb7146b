"""Int4MoE under .to / .half() / .type: refused casts, the router kept float32 (modules/casts.py)."""

import gc
import weakref

import pytest
import torch

from core.errors import (
    DTypeError,
    ShapeError,
)
from core.routing import route_topk
from modules import Int4MoE
from tests.modules.int4_moe_cases import (
    CFG,
    _float_weights,
    _module,
    _routed_layer,
)
from tests.tolerances import (
    EXACT,
)


def test_the_router_is_kept_in_float32(generator: torch.Generator) -> None:
    """A float32 router stays exact in a bf16 layer (rounding it moved some tokens to
    other experts); a state dict's bf16 router loads into it exactly."""
    gate = torch.randn(8, 128, generator=generator)
    moe = _module(generator, gate_weight=gate, dtype=torch.bfloat16)
    assert moe.gate_weight is not None
    assert moe.gate_weight.dtype == torch.float32
    torch.testing.assert_close(moe.gate_weight.data, gate, **EXACT)
    empty = Int4MoE(CFG, with_gate=True)
    assert empty.gate_weight is not None
    state = moe.state_dict()
    state["gate_weight"] = gate.to(torch.bfloat16)
    empty.load_state_dict(state)
    torch.testing.assert_close(
        empty.gate_weight.data, gate.to(torch.bfloat16).float(), **EXACT
    )
    x = torch.randn(64, 128, generator=generator).to(torch.bfloat16)
    routed = route_topk(x.float() @ gate.T, CFG)
    expected = moe(x, topk_weights=routed.topk_weights, topk_ids=routed.topk_ids)
    torch.testing.assert_close(moe(x), expected, **EXACT)


@pytest.mark.parametrize(
    "convert",
    ["bfloat16", "half", "to_bfloat16", "float"],
)
def test_dtype_casts_keep_the_router_in_float32(
    convert: str, generator: torch.Generator
) -> None:
    """``.half()`` and friends cast the scales, not the router: rounding it moved
    tokens to other experts."""
    moe, x = _routed_layer(generator)
    gate = moe.get_parameter("gate_weight").detach().clone()
    bias = moe.get_buffer("e_score_correction_bias").clone()
    if convert == "to_bfloat16":
        moe.to(torch.bfloat16)
    else:
        getattr(moe, convert)()
    torch.testing.assert_close(moe.get_parameter("gate_weight").data, gate, **EXACT)
    torch.testing.assert_close(moe.get_buffer("e_score_correction_bias"), bias, **EXACT)
    assert moe.get_buffer("w13_scale").dtype != torch.float32 or convert == "float"
    assert moe._prepared is None  # the old prepared form is dropped at once
    routed = route_topk(x.float() @ gate.T, CFG, correction_bias=bias)
    expected = moe(x, topk_weights=routed.topk_weights, topk_ids=routed.topk_ids)
    torch.testing.assert_close(moe(x), expected, **EXACT)


def test_a_cast_to_an_unsupported_dtype_is_refused_before_anything_moves(
    generator: torch.Generator,
) -> None:
    moe, x = _routed_layer(generator)
    before = moe(x)
    for cast in (moe.double, lambda: moe.to(torch.float64)):
        with pytest.raises(DTypeError, match=r"cannot be cast to torch\.float64"):
            cast()
        assert moe.get_buffer("w13_scale").dtype == torch.bfloat16
    torch.testing.assert_close(moe(x), before, **EXACT)
    # bf16 scales below fp16's range would round to 0 under .half(): refused too.
    with torch.no_grad():
        moe.get_buffer("w2_scale")[0, 0, 0] = 1e-9
    with pytest.raises(
        ShapeError,
        match=r"w2_scale \(cast to torch.float16; this layer was not cast\) must fit "
        r"torch.float16, got 1 nonzero values rounding to 0",
    ):
        moe.half()
    assert moe.get_buffer("w2_scale").dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32], ids=str)
def test_module_type_is_refused_before_it_converts_the_codes(
    dtype: torch.dtype, generator: torch.Generator
) -> None:
    # Module.type(dtype) converts every buffer, the uint8 codes too; .to(dtype) does not.
    moe, x = _routed_layer(generator)
    before = moe(x)
    dtypes = {name: t.dtype for name, t in moe.state_dict().items()}
    with pytest.raises(
        DTypeError, match=r"turns its torch\.uint8 buffers .* as Module\.type\(dtype\)"
    ):
        moe.type(dtype)
    assert {name: t.dtype for name, t in moe.state_dict().items()} == dtypes
    torch.testing.assert_close(moe(x), before, **EXACT)


def test_a_cast_frees_the_old_tensors_at_once(generator: torch.Generator) -> None:
    """``.half()`` drops the prepared form, so nothing keeps the bf16 scales alive."""
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, backend="reference"
    )
    moe(torch.randn(4, 128, generator=generator), router_logits=torch.randn(4, 8))
    chosen = moe.backend_name
    assert chosen == "reference"
    old = weakref.ref(moe.w13_scale)
    moe.half()
    gc.collect()
    assert moe.backend_name is None
    assert old() is None


def test_half_keeps_a_trained_router_s_gradient_in_float32(
    generator: torch.Generator,
) -> None:
    w13, w2 = _float_weights(generator)
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, backend="reference",
        gate_weight=torch.randn(8, 128, generator=generator),
    )  # fmt: skip
    assert moe.gate_weight is not None
    moe.gate_weight.requires_grad_(True)
    torch.autograd.backward(moe(torch.randn(3, 128, generator=generator)).sum())
    assert moe.gate_weight.grad is not None
    moe.gate_weight.grad[0, :3] = torch.tensor([1e-8, 1e5, 0.1000001])  # not fp16's
    before = moe.gate_weight.grad.clone()
    moe.half()
    assert moe.gate_weight.dtype == torch.float32
    assert moe.gate_weight.grad is not None
    assert moe.gate_weight.grad.dtype == torch.float32
    torch.testing.assert_close(moe.gate_weight.grad, before, **EXACT)
