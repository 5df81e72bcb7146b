"""Checks of a state dict before ``load_state_dict`` copies it into Int4MoE's buffers.

May import core and modules.buffers (pure functions on the layer's config, scheme and
buffers; ``modules/layer_state.py`` registers them as the layer's load hook).
"""

from collections.abc import Mapping
from typing import Any

import torch

from core.config import MoEConfig
from core.errors import ConfigError, DTypeError
from core.scheme import Int4Scheme
from core.validate import check_cast_fits
from modules.buffers import CODE_BUFFERS, FLOAT_BUFFERS, check_expert_map

Buffers = Mapping[str, torch.Tensor | None]


def check_loaded_state(
    config: MoEConfig,
    scheme: Int4Scheme,
    buffers: Buffers,
    state_dict: Mapping[str, Any],
    prefix: str,
) -> None:
    """Refuse loaded tensors that torch's copy into ``buffers`` would garble.

    ``load_state_dict`` casts each tensor to its buffer's dtype: int32 codes would
    wrap into uint8 and large fp32 scales overflow fp16 to inf, silently. Also
    refuses an ``expert_map`` naming experts this module does not hold, and a state
    of another scheme (zero points present or not, scales of another group size: the
    state does not record its scheme), with or without ``strict`` (a zero point left
    out would be read as garbage). Torch hands its hooks ``strict=True`` whatever the
    caller asked, so router tensors this module lacks are left to its key report.
    """
    check_state_scheme(config, scheme, buffers, state_dict, prefix)
    for name in (*CODE_BUFFERS, *FLOAT_BUFFERS):
        loaded, buffer = state_dict.get(prefix + name), buffers.get(name)
        if not isinstance(loaded, torch.Tensor) or buffer is None:
            continue  # torch reports missing and unexpected keys
        if name in CODE_BUFFERS and loaded.dtype != torch.uint8:
            raise DTypeError(
                f"state_dict {prefix + name} must be uint8 (int4 codes, as saved), "
                f"got dtype {loaded.dtype}"
            )
        if name in FLOAT_BUFFERS:  # torch's copy casts to the buffer's dtype
            check_cast_fits(f"state_dict {prefix + name}", loaded, buffer.dtype)
    emap, qdata = state_dict.get(prefix + "expert_map"), buffers.get("w13_qdata")
    if emap is None or buffers.get("expert_map") is None or qdata is None:
        return  # torch reports the unexpected key
    check_expert_map(
        emap,
        num_experts=config.num_experts,
        num_local_experts=qdata.shape[0],
    )


def check_state_scheme(
    config: MoEConfig,
    scheme: Int4Scheme,
    buffers: Buffers,
    state_dict: Mapping[str, Any],
    prefix: str,
) -> None:
    """Refuse a state of another scheme or size: zero points, packed sizes, groups."""
    if not isinstance(state_dict.get(prefix + "w13_qdata"), torch.Tensor):
        return  # not this layer's state (torch reports the missing keys)
    has_zero = isinstance(state_dict.get(prefix + "w13_zero_point"), torch.Tensor)
    if has_zero != scheme.has_zero_point:
        got = "has zero points" if has_zero else "has no zero points"
        kind = "asymmetric" if scheme.has_zero_point else "symmetric"
        raise ConfigError(
            f"state_dict must match this Int4MoE's {kind} scheme {scheme.name}, got "
            f"a state that {got} ({prefix}w13_zero_point): build the module with the "
            "scheme the state was saved with (Int4MoE(config, scheme=...))"
        )
    _check_packed_sizes(config, buffers, state_dict, prefix)
    for name, size in (
        ("w13_scale", config.hidden_size),
        ("w2_scale", config.intermediate_size),
    ):
        loaded, buffer = state_dict.get(prefix + name), buffers.get(name)
        if (
            isinstance(loaded, torch.Tensor)
            and buffer is not None
            and loaded.ndim == buffer.ndim
            and loaded.shape[:-1] == buffer.shape[:-1]
            and loaded.shape[-1] != buffer.shape[-1]
            and loaded.shape[-1] > 0
        ):
            groups = int(loaded.shape[-1])
            group = "-1 (one group per row)" if groups == 1 else str(size // groups)
            raise ConfigError(
                f"state_dict {prefix}{name} must have {buffer.shape[-1]} groups a row "
                f"for this Int4MoE's scheme {scheme.name} (group_size "
                f"{scheme.group_size}), got {groups}, as group_size {group} gives: "
                "build the module with the scheme the state was saved with"
            )


def _check_packed_sizes(
    config: MoEConfig, buffers: Buffers, state_dict: Mapping[str, Any], prefix: str
) -> None:
    """Rows and packed columns of the codes first: a group count follows from them."""
    for name in ("w13_qdata", "w2_qdata"):
        loaded, buffer = state_dict.get(prefix + name), buffers.get(name)
        if (
            isinstance(loaded, torch.Tensor)
            and buffer is not None
            and loaded.shape[-2:] != buffer.shape[-2:]
        ):
            raise ConfigError(
                f"state_dict {prefix}{name} must have rows x packed columns "
                f"{tuple(buffer.shape[-2:])} for this Int4MoE (hidden_size="
                f"{config.hidden_size}, intermediate_size={config.intermediate_size}), "
                f"got {tuple(loaded.shape[-2:])}: build the module with the config "
                "the state was saved with"
            )
