"""Boundary checks (``check_*`` raise, ``is_*`` answer). Pure; imports torch and core.

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k.
Messages name the argument, then what was expected, then what came.
"""

import torch

from core.config import MoEConfig
from core.errors import (
    ConfigTypeError,
    DeviceError,
    DTypeError,
    NotLoadedError,
    ShapeError,
)
from core.routing import Routing
from core.scheme import SUPPORTED_GROUP_SIZES, Int4Scheme
from core.weights import QuantizedExpertWeights

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def is_supported_group_size(group_size: int) -> bool:
    """Whether ``group_size`` is an int the library implements (``32.0`` is not)."""
    return type(group_size) is int and group_size in SUPPORTED_GROUP_SIZES


def check_activation_dtype(name: str, dtype: torch.dtype) -> None:
    """Raise ``DTypeError`` unless ``dtype`` is fp32, fp16 or bf16."""
    if dtype not in ACTIVATION_DTYPES:
        raise DTypeError(
            f"{name} must be float32, float16 or bfloat16, got dtype {dtype}"
        )


def check_hidden_states(hidden_states: torch.Tensor, config: MoEConfig) -> None:
    """``hidden_states`` must be ``(..., D)`` in a supported floating dtype."""
    check_activation_dtype("hidden_states", hidden_states.dtype)
    if hidden_states.ndim == 0 or hidden_states.shape[-1] != config.hidden_size:
        raise ShapeError(
            f"hidden_states must have last dim hidden_size={config.hidden_size}, "
            f"got shape {tuple(hidden_states.shape)}"
        )


def check_type(name: str, value: object, expected: type | tuple[type, ...]) -> None:
    """Raise ``ConfigTypeError`` unless ``value`` is an instance of ``expected``.

    For arguments a static checker would catch, reported at run time before they
    fail deep inside (``'dict' object has no attribute ...``).
    """
    if not isinstance(value, expected):
        types = expected if isinstance(expected, tuple) else (expected,)
        want = " or ".join(t.__name__ for t in types)
        raise ConfigTypeError(
            f"{name} must be of type {want}, got {type(value).__name__}"
        )


def check_finite(name: str, tensor: torch.Tensor, *, allow_meta: bool = False) -> None:
    """Raise ``ShapeError`` (a ``ValueError``) if ``tensor`` holds NaN or inf.

    A tensor that is not floating raises ``DTypeError``. One on the meta device has
    no values: it passes with ``allow_meta`` and raises ``DeviceError`` without.
    """
    if not tensor.dtype.is_floating_point:
        raise DTypeError(f"{name} must be a floating tensor, got dtype {tensor.dtype}")
    if tensor.is_meta and allow_meta:
        return
    if tensor.is_meta:
        raise DeviceError(
            f"{name} must hold values, got a tensor on the meta device (materialize "
            "it first, for example with to_empty and load_state_dict)"
        )
    if not tensor.numel():
        return
    # Two reductions (NaN propagates through both), no tensor-sized temporary; the
    # element-wise mask only to say where.
    ends = torch.stack([tensor.detach().amax(), tensor.detach().amin()])
    if bool(torch.isfinite(ends).all()):
        return
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ShapeError(
            f"{name} must be finite, got {int(bad.sum())} NaN/inf values (first at {where})"
        )


def check_loaded(name: str, tensor: torch.Tensor | None) -> None:
    """Raise ``NotLoadedError`` if ``tensor`` is floating and all NaN.

    ``Int4MoE(config)`` fills its floating buffers with NaN until a state is loaded
    into them; ``None`` (an absent buffer) and meta tensors pass.
    """
    if tensor is None or tensor.is_meta or not tensor.dtype.is_floating_point:
        return
    if tensor.numel() and bool(torch.isnan(tensor.detach()).all()):
        raise NotLoadedError(
            f"{name} was never loaded: Int4MoE(config) creates its buffers empty "
            "(NaN), so load_state_dict (or Int4MoE.from_quantized / from_float) must "
            f"fill them before a forward, got {name} all NaN"
        )


def check_cast_fits(
    name: str, tensor: torch.Tensor, dtype: torch.dtype, *, underflow: bool = True
) -> None:
    """Raise ``ShapeError`` unless ``tensor`` cast to ``dtype`` keeps its values.

    Finite values must stay finite (no overflow to inf) and, with ``underflow``,
    nonzero ones nonzero (no underflow to 0): a scale that does either ruins its whole
    group, silently. An additive bias that rounds to 0 loses less than fp16 rounds
    off its other values: pass ``underflow=False`` for those. Meta tensors (no
    values) and casts to the same dtype pass.
    """
    if tensor.is_meta or tensor.dtype == dtype or not tensor.numel():
        return
    cast = tensor.detach().to(dtype)
    grew = torch.isfinite(tensor) & ~torch.isfinite(cast)
    if bool(grew.any()):
        raise ShapeError(
            f"{name} must fit {dtype}, got {int(grew.sum())} values overflowing it "
            f"(largest magnitude {float(tensor.detach().abs().amax()):.3g})"
        )
    lost = (tensor != 0) & (cast == 0)
    if underflow and bool(lost.any()):
        smallest = float(tensor.detach()[lost].abs().amin())
        raise ShapeError(
            f"{name} must fit {dtype}, got {int(lost.sum())} nonzero values rounding "
            f"to 0 (smallest magnitude {smallest:.3g})"
        )


def check_shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    """Raise ``ShapeError`` unless ``tensor.shape == expected``."""
    if tuple(tensor.shape) != expected:
        raise ShapeError(
            f"{name} must have shape {expected}, got {tuple(tensor.shape)}"
        )


def check_float_expert_weights(
    w13_weight: torch.Tensor, w2_weight: torch.Tensor, config: MoEConfig
) -> None:
    """Float ``w13_weight (E, 2F, D)`` and ``w2_weight (E, D, F)``, finite."""
    e, f, d = config.num_experts, config.intermediate_size, config.hidden_size
    check_shape("w13_weight", w13_weight, (e, 2 * f, d))
    check_shape("w2_weight", w2_weight, (e, d, f))
    check_finite("w13_weight", w13_weight)
    check_finite("w2_weight", w2_weight)


def check_scheme(scheme: Int4Scheme, config: MoEConfig) -> None:
    """The scheme's group size must divide both reduction dims, which must be even."""
    scheme.num_groups(config.hidden_size, name="hidden_size")
    scheme.num_groups(config.intermediate_size, name="intermediate_size")


def _check_codes(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tensor.dtype != torch.uint8:
        raise DTypeError(f"{name} must be uint8, got dtype {tensor.dtype}")
    check_shape(name, tensor, expected)


def _check_zero_point(
    name: str, tensor: torch.Tensor, expected: tuple[int, ...]
) -> None:
    """uint8 zero points, one code ``0..15`` a byte (not packed)."""
    _check_codes(name, tensor, expected)
    largest = int(tensor.max()) if tensor.numel() and not tensor.is_meta else 0
    if largest > 15:
        raise ShapeError(
            f"{name} must hold int4 codes 0..15 (one a byte, unpacked), got values up "
            f"to {largest}"
        )


def _check_scale(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    check_activation_dtype(name, tensor.dtype)
    check_shape(name, tensor, expected)
    check_finite(name, tensor, allow_meta=True)


def check_expert_weights(
    weights: QuantizedExpertWeights, config: MoEConfig, *, num_experts: int
) -> None:
    """Every canonical tensor has the right dtype, shape and device, and values in range.

    Values: zero points are codes ``0..15``, scales and biases finite (not checked
    on the meta device, which holds no values).

    The layout is the README's "Schemes and the canonical layout".
    """
    scheme = weights.scheme
    check_scheme(scheme, config)
    e, f, d = num_experts, config.intermediate_size, config.hidden_size
    gd, gf = scheme.num_groups(d), scheme.num_groups(f)
    _check_codes("w13_qdata", weights.w13_qdata, (e, 2 * f, d // 2))
    _check_codes("w2_qdata", weights.w2_qdata, (e, d, f // 2))
    _check_scale("w13_scale", weights.w13_scale, (e, 2 * f, gd))
    _check_scale("w2_scale", weights.w2_scale, (e, d, gf))
    if weights.w2_scale.dtype != weights.w13_scale.dtype:
        raise DTypeError(
            f"w2_scale must have the dtype of w13_scale ({weights.w13_scale.dtype}), "
            f"got {weights.w2_scale.dtype}"
        )
    for name, zero, shape in (
        ("w13_zero_point", weights.w13_zero_point, (e, 2 * f, gd)),
        ("w2_zero_point", weights.w2_zero_point, (e, d, gf)),
    ):
        if scheme.has_zero_point != (zero is not None):
            want = "a tensor" if scheme.has_zero_point else "None"
            got = "None" if zero is None else "a tensor"
            raise ShapeError(f"{name} must be {want} for {scheme.name}, got {got}")
        if zero is not None:
            _check_zero_point(name, zero, shape)
    _check_biases(weights, config, num_experts=e)
    check_same_device(weights.tensors())


def _check_biases(
    weights: QuantizedExpertWeights, config: MoEConfig, *, num_experts: int
) -> None:
    shapes = {
        "w13_bias": (weights.w13_bias, (num_experts, 2 * config.intermediate_size)),
        "w2_bias": (weights.w2_bias, (num_experts, config.hidden_size)),
    }
    for name, (bias, shape) in shapes.items():
        if config.expert_bias != (bias is not None):
            want = "a tensor" if config.expert_bias else "None"
            got = "None" if bias is None else "a tensor"
            raise ShapeError(
                f"{name} must be {want} with expert_bias={config.expert_bias}, got {got}"
            )
        if bias is not None:
            check_activation_dtype(name, bias.dtype)
            check_shape(name, bias, shape)
            check_finite(name, bias, allow_meta=True)


def check_same_device(tensors: dict[str, torch.Tensor]) -> None:
    """All tensors live on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise DeviceError(f"tensors must be on one device, got {listing}")


def check_device(
    name: str, device: torch.device | str | int, *, allow_meta: bool
) -> torch.device:
    """``device`` as a ``torch.device`` this process can allocate on.

    Raises ``ConfigTypeError`` unless it is a ``str``, ``torch.device`` or ``int`` (an
    index of the current accelerator, as torch reads it), and ``DeviceError`` for a
    name torch does not parse (``"gpu"``), a device type this torch build or machine
    lacks (``"cuda"`` without a GPU), an index past the devices present, or ``meta``
    where values are needed (``allow_meta=False``).
    """
    if isinstance(device, bool):  # an int to isinstance, never a device
        check_type(name, device, (str, torch.device))
    check_type(name, device, (str, torch.device, int))
    try:
        parsed = torch.device(device)
    except RuntimeError as err:
        raise DeviceError(
            f"{name} must name a torch device, got {device!r} ({err})"
        ) from err
    kind = parsed.type
    if kind == "meta" and not allow_meta:
        raise DeviceError(f"{name} must hold values (cpu, cuda, xpu, ...), got meta")
    if kind in ("cpu", "meta") or torch._guards.detect_fake_mode() is not None:
        return parsed  # a FakeTensorMode (tracing for a GPU on a CPU) allocates none
    runtime = getattr(torch, kind, None)  # torch.cuda, torch.xpu, torch.mps, ...
    available = getattr(runtime, "is_available", None)
    if callable(available) and not available():
        raise DeviceError(
            f"{name} must be a device present here, got {device!r}: this torch "
            f"build or machine has no {kind} device"
        )
    count = getattr(runtime, "device_count", None)
    if callable(count) and (parsed.index or 0) >= count():  # index None: the current
        raise DeviceError(
            f"{name} must be a device present here, got {device!r}: {kind} has "
            f"{count()} device(s)"
        )
    return parsed


def checks_on_device(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s values are checked on its device, not on the host.

    CUDA tensors go to ``torch._assert_async``; the others are read back for a
    ``ShapeError``.
    """
    return tensor.device.type == "cuda"


def check_routing(
    routing: Routing, config: MoEConfig, *, num_tokens: int, ids_in_range: bool = True
) -> None:
    """``topk_weights`` float ``(T, K)`` and ``topk_ids`` integer ``(T, K)`` in range.

    The range is checked on the host (``ShapeError``) except for CUDA tensors: there
    ``torch._assert_async`` checks it on the device (no host synchronization, so the
    layer stays capturable in a CUDA graph), and an id out of range raises CUDA's
    device-side assert at the next synchronization instead. ``ids_in_range=False``
    skips the range (ids known to come from a top-k over the experts).
    """
    ids, weights = routing.topk_ids, routing.topk_weights
    expected = (num_tokens, config.top_k)
    check_shape("topk_ids", ids, expected)
    check_shape("topk_weights", weights, expected)
    if ids.dtype not in (torch.int32, torch.int64):
        raise DTypeError(f"topk_ids must be int32 or int64, got dtype {ids.dtype}")
    if not weights.dtype.is_floating_point:
        raise DTypeError(f"topk_weights must be floating, got dtype {weights.dtype}")
    if not ids.numel() or not ids_in_range:
        return
    in_range = f"topk_ids must be in [0, num_experts={config.num_experts})"
    if checks_on_device(ids):
        # No host sync (CUDA-graph capture, no stall): checked on the device; a bad id
        # surfaces as a device-side assert at the next synchronization.
        inside = ids.clamp(0, config.num_experts - 1).eq(ids).all()
        torch._assert_async(inside, in_range)
        return
    if int(ids.min()) < 0 or int(ids.max()) >= config.num_experts:
        raise ShapeError(
            f"{in_range}, got values in [{int(ids.min())}, {int(ids.max())}]"
        )


def check_local_ids(topk_ids: torch.Tensor, num_local_experts: int) -> None:
    """Integer ``topk_ids`` of local experts: ``-1`` (held elsewhere) or ``[0, E)``.

    Raises:
        DTypeError: unless int32 or int64.
        ShapeError: for a value outside ``[-1, num_local_experts)`` (say, a global id
            handed to the weights of one rank).
    """
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise DTypeError(f"topk_ids must be int32 or int64, got dtype {topk_ids.dtype}")
    if topk_ids.numel() and (
        int(topk_ids.min()) < -1 or int(topk_ids.max()) >= num_local_experts
    ):
        raise ShapeError(
            f"topk_ids must be -1 or local expert ids in [0, {num_local_experts}), got "
            f"values in [{int(topk_ids.min())}, {int(topk_ids.max())}]"
        )
