"""Names, shapes and dtypes of Int4MoE's canonical buffers (see the README's layout).

May import core only.
"""

import math
from numbers import Integral

import torch

from core.config import MoEConfig
from core.errors import ConfigError, ConfigTypeError, DTypeError, ShapeError
from core.scheme import Int4Scheme
from core.validate import check_cast_fits, check_shape, check_type
from core.weights import QuantizedExpertWeights

BufferSpec = tuple[tuple[int, ...], torch.dtype]


def canonical_buffer_specs(
    config: MoEConfig, scheme: Int4Scheme, num_experts: int, dtype: torch.dtype
) -> dict[str, BufferSpec]:
    """Shape and dtype of each int4 buffer for ``num_experts`` local experts."""
    e, f, d = num_experts, config.intermediate_size, config.hidden_size
    gd, gf = (
        scheme.num_groups(d, name="hidden_size"),
        scheme.num_groups(f, name="intermediate_size"),
    )
    specs: dict[str, BufferSpec] = {
        "w13_qdata": ((e, 2 * f, d // 2), torch.uint8),
        "w13_scale": ((e, 2 * f, gd), dtype),
        "w2_qdata": ((e, d, f // 2), torch.uint8),
        "w2_scale": ((e, d, gf), dtype),
    }
    if scheme.has_zero_point:
        specs["w13_zero_point"] = ((e, 2 * f, gd), torch.uint8)
        specs["w2_zero_point"] = ((e, d, gf), torch.uint8)
    if config.expert_bias:
        specs["w13_bias"] = ((e, 2 * f), dtype)
        specs["w2_bias"] = ((e, d), dtype)
    return specs


def expert_map_size(config: MoEConfig, num_local_experts: int | None) -> int:
    """Experts held here: ``num_local_experts`` or, by default, all of them."""
    if num_local_experts is None:
        return config.num_experts
    given: object = num_local_experts  # checked at run time: callers may pass anything
    if isinstance(given, bool) or not isinstance(given, Integral):  # True, 2.0
        raise ConfigTypeError(
            f"num_local_experts must be an int or None, got "
            f"{type(num_local_experts).__name__}"
        )
    num_local_experts = int(num_local_experts)  # a numpy int, say
    if not 1 <= num_local_experts <= config.num_experts:
        raise ConfigError(
            f"num_local_experts must be in [1, num_experts={config.num_experts}], "
            f"got {num_local_experts}"
        )
    return num_local_experts


def default_expert_map(
    num_experts: int, num_local_experts: int, device: torch.device | str | None
) -> torch.Tensor:
    """``(E,)`` int32: the first ``num_local_experts`` experts held here, ``-1`` after.

    The contiguous split's first shard; a real map is loaded or passed in. It never
    names a local id ``>= num_local_experts``.
    """
    emap = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
    emap[:num_local_experts] = torch.arange(
        num_local_experts, dtype=torch.int32, device=device
    )
    return emap


def check_expert_map(
    expert_map: torch.Tensor, *, num_experts: int, num_local_experts: int
) -> None:
    """Raise unless ``expert_map`` is an integer ``(E,)`` of ``-1`` or distinct local ids.

    Raises:
        ShapeError: on a wrong shape, a value outside ``[-1, num_local_experts)`` or a
            local id given to two global experts (one would run the other's weights).
        DTypeError: unless int32 or int64.
    """
    check_type("expert_map", expert_map, torch.Tensor)
    check_shape("expert_map", expert_map, (num_experts,))
    if expert_map.dtype not in (torch.int32, torch.int64):
        raise DTypeError(
            f"expert_map must be int32 or int64, got dtype {expert_map.dtype}"
        )
    if expert_map.is_meta or not expert_map.numel():
        return  # a meta tensor has no values to check
    low, high = int(expert_map.min()), int(expert_map.max())
    if low < -1 or high >= num_local_experts:
        raise ShapeError(
            f"expert_map values must be -1 or local ids in [0, {num_local_experts}), "
            f"got values in [{low}, {high}]"
        )
    held = expert_map[expert_map >= 0].long()
    counts = torch.bincount(held, minlength=num_local_experts)
    if held.numel() and int(counts.max()) > 1:
        local = int(torch.argmax(counts))
        shared = torch.nonzero(expert_map == local).flatten().tolist()
        raise ShapeError(
            "expert_map must give each local id to at most one global expert, "
            f"got local id {local} for global experts {shared}"
        )


def local_experts(
    config: MoEConfig, weights: QuantizedExpertWeights, expert_map: torch.Tensor | None
) -> int:
    """Experts the weights hold, after checking ``expert_map`` (global to local, -1)."""
    if expert_map is None:
        return config.num_experts
    local = weights.num_experts
    check_expert_map(
        expert_map, num_experts=config.num_experts, num_local_experts=local
    )
    return local


CODE_BUFFERS = ("w13_qdata", "w2_qdata", "w13_zero_point", "w2_zero_point")
"""Int4MoE's integer buffers (int4 codes and zero points), ``None`` where absent."""
FLOAT_BUFFERS = ("w13_scale", "w2_scale", "w13_bias", "w2_bias")
"""Int4MoE's floating buffers of the experts, ``None`` where absent."""
REQUIRED_BUFFERS = ("w13_qdata", "w13_scale", "w2_qdata", "w2_scale")
"""The buffers every Int4MoE holds, whatever its scheme and config."""


def frozen_copy(
    t: torch.Tensor, dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """A detached copy of ``t`` in ``dtype`` (on ``device``).

    No autograd history and no storage shared with the caller's tensor.
    """
    return t.detach().to(device=device or t.device, dtype=dtype, copy=True)


def fitting_copy(
    name: str, t: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """:func:`frozen_copy` of an expert bias in ``dtype``, if no value overflows.

    ``None`` (no bias) stays ``None``. Raises ``ShapeError`` naming ``name`` where the
    cast would turn finite values to inf; values rounding to 0 are kept as 0 (a bias
    that small changes nothing).
    """
    if t is None:
        return None
    check_cast_fits(name, t, dtype, underflow=False)
    return frozen_copy(t, dtype)


def unloaded_buffer(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str | None
) -> torch.Tensor:
    """A buffer before loading: NaN where floating (``check_loaded`` tells), else empty.

    Int4 codes have no value that could mark them; a state loaded without them fails
    ``load_state_dict``'s strict key check, and one loaded ``strict=False`` without
    the scales fails ``check_loaded``.
    """
    if dtype.is_floating_point:
        return torch.full(shape, math.nan, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def check_optional_tensors(**tensors: object) -> None:
    """Each named argument is a tensor or ``None``."""
    for name, tensor in tensors.items():
        if tensor is not None:
            check_type(name, tensor, torch.Tensor)
