"""States that load_state_dict must refuse before copying them (modules/state_checks.py)."""

import re

import attrs
import pytest
import torch
from torch import nn

from core.errors import (
    ConfigError,
    DTypeError,
    NotLoadedError,
    ShapeError,
)
from core.scheme import (
    INT4_ASYM_G32,
    INT4_SYM,
    INT4_SYM_G32,
    Int4Scheme,
)
from modules import Int4MoE
from tests.modules.int4_moe_cases import (
    CFG,
    _module,
)
from tests.tolerances import (
    EXACT,
)


def test_load_refuses_what_the_copy_into_the_buffers_would_garble(
    generator: torch.Generator,
) -> None:
    """load_state_dict casts into each buffer's dtype: int32 codes would wrap into
    uint8, and fp32 scales past fp16's range would become inf."""
    moe = _module(generator, dtype=torch.float16)
    state = {k: v.clone() for k, v in moe.state_dict().items()}
    codes = dict(state, w13_qdata=state["w13_qdata"].to(torch.int32))
    with pytest.raises(DTypeError, match=r"state_dict w13_qdata must be uint8.*int32"):
        moe.load_state_dict(codes)
    scales = dict(state, w2_scale=state["w2_scale"].float() * 1e8)
    with pytest.raises(
        ShapeError,
        match=r"state_dict w2_scale must fit torch.float16, got \d+ values overflowing",
    ):
        moe.load_state_dict(scales)
    tiny = dict(state, w2_scale=state["w2_scale"].float() * 1e-8)  # below fp16's range
    with pytest.raises(
        ShapeError, match=r"state_dict w2_scale must fit torch.float16, got \d+ nonzero"
    ):
        moe.load_state_dict(tiny)
    same = dict(state, w2_scale=state["w2_scale"].float())  # fits: loads exactly
    moe.load_state_dict(same)
    torch.testing.assert_close(moe.get_buffer("w2_scale"), state["w2_scale"], **EXACT)


@pytest.mark.parametrize("left_out", ["w2_scale", "gate_weight"])
def test_state_loaded_without_a_float_buffer_is_refused(
    left_out: str, generator: torch.Generator
) -> None:
    """``load_state_dict(strict=False)`` missing a scale or the router: the buffer
    keeps its NaN, and the first forward names it (before: garbage, silently)."""
    source = _module(generator)
    source.gate_weight = nn.Parameter(
        torch.randn(8, 128, generator=generator), requires_grad=False
    )
    state = source.state_dict()
    del state[left_out]
    moe = Int4MoE(CFG, with_gate=True)
    moe.load_state_dict(state, strict=False)
    x = torch.randn(3, 128, generator=generator)
    with pytest.raises(NotLoadedError, match=rf"{left_out} was never loaded"):
        moe(x)
    moe.load_state_dict(source.state_dict())  # a full load then runs
    want = source(x)
    torch.testing.assert_close(moe(x), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("field", "shape"),
    [("hidden_size", "(128, 64)"), ("intermediate_size", "(128, 64)")],
)
def test_a_state_of_other_sizes_names_the_sizes_not_the_scheme(
    field: str, shape: str, generator: torch.Generator
) -> None:
    """A state saved for another hidden or intermediate size is a config mismatch:
    said so, rather than blamed on the group size its scales' width implies."""
    state = _module(generator).state_dict()
    other = attrs.evolve(CFG, **{field: 2 * getattr(CFG, field)})
    for strict in (True, False):
        moe = Int4MoE(other)
        with pytest.raises(
            ConfigError,
            match=rf"state_dict w(13|2)_qdata must have rows x packed columns .* for "
            rf"this Int4MoE \(hidden_size={other.hidden_size}, intermediate_size="
            rf"{other.intermediate_size}\), got {re.escape(shape)}: build the module "
            r"with the config",
        ):
            moe.load_state_dict(state, strict=strict)


@pytest.mark.parametrize(
    ("saved", "built", "message"),
    [
        (
            INT4_ASYM_G32,
            INT4_SYM_G32,
            r"symmetric scheme int4_sym_g32, got a state "
            r"that has zero points",
        ),
        (
            INT4_SYM_G32,
            INT4_ASYM_G32,
            r"asymmetric scheme int4_asym_g32, got a state "
            r"that has no zero points",
        ),
        (
            INT4_SYM,
            INT4_SYM_G32,
            r"w13_scale must have 4 groups a row for this "
            r"Int4MoE's scheme int4_sym_g32 \(group_size 32\), got 1, as group_size -1 "
            r"\(one group per row\) gives",
        ),
    ],
    ids=["asym-into-sym", "sym-into-asym", "per-row-into-g32"],
)
def test_a_state_of_another_scheme_is_refused_by_name(
    saved: Int4Scheme, built: Int4Scheme, message: str, generator: torch.Generator
) -> None:
    """The state does not record its scheme; loading one into a module of another
    says which, strict or not (a zero point left out would be garbage)."""
    state = _module(generator, saved).state_dict()
    for strict in (True, False):
        moe = Int4MoE(CFG, scheme=built)
        with pytest.raises(ConfigError, match=message):
            moe.load_state_dict(state, strict=strict)
