"""Round-to-nearest int4 quantization and exact dequantization (torchao vocabulary).

Weights are ``(..., N, K)`` with K the reduction dimension; groups run along K.
Shape legend: ``N`` output rows, ``K`` reduction dim here (this file has no top-k),
``G`` groups along K. Imports only torch and core.
"""

import operator

import torch

from core.errors import ConfigError, ShapeError
from core.packing import pack_int4, unpack_int4
from core.scheme import Int4Scheme
from core.validate import check_activation_dtype, check_finite, check_type
from core.weights import QParams, QuantizedExpertWeights

_SYM_OFFSET = 8
# amax / 7.5 with codes clamped to [-8, 7] puts the largest magnitude on the clamp edge,
# a step 7% finer than the amax / 7 convention's. With the exact scale every value is off
# by at most half a step (scale / 2 = amax / 15). The stored scale is rounded to
# scale_dtype (relative error up to u: 2^-8 bf16, 2^-11 fp16, 2^-24 fp32); rounded down,
# values near +amax reach 7.5 / (1 - u) steps, clamp to 7 and are off by up to
# 7.5 / (1 - u) - 7 steps of the stored scale: 0.5294 (bf16), 0.5037 (fp16). The rest
# stay within half a step. Asymmetric: up to 0.5 + 15u / (1 - u) steps (0.5588 bf16).
# All of this up to the float32 rounding of w / scale (below 1e-6 of a step). Subnormal
# scales (fp16 below 2^-14: groups with amax under about 4.6e-4) round by up to half
# their ulp, 2^-25, far more than u; where that rounds down they are stored one ulp up
# (_stored_scale), so no value passes the clamp by more than the bounds above.
_SYM_DIVISOR = 7.5


def _grouped(w_NK: torch.Tensor, scheme: Int4Scheme) -> torch.Tensor:
    """View ``(..., N, K)`` as ``(..., N, G, K/G)``."""
    k = int(w_NK.shape[-1])
    groups = scheme.num_groups(k, name="weight last dim")
    return w_NK.reshape(*w_NK.shape[:-1], groups, k // groups)


def choose_qparams(
    w_NK: torch.Tensor, scheme: Int4Scheme, *, scale_dtype: torch.dtype
) -> QParams:
    """Choose per-group scales (and zero points) for ``w_NK``.

    Computed in float32; the scale is rounded to ``scale_dtype`` here, so codes chosen
    by :func:`quantize` see the scale exactly as it will be stored.

    Args:
        w_NK: floating ``(..., N, K)``.
        scheme: symmetric or asymmetric, and the group size.
        scale_dtype: dtype of the stored scales.

    Returns:
        ``QParams`` with ``scale`` ``(..., N, G)`` and, for asymmetric, uint8 zero points.

    Raises:
        ShapeError: where ``w_NK`` holds NaN or inf as float32 (float64 values past
            float32's range among them; found on per-group reductions, which both
            make non-finite), or ``scale_dtype`` cannot hold a group's scale
            (overflow to inf, or a nonzero group's scale rounding to 0).
        DTypeError: when ``scale_dtype`` is not float32, float16 or bfloat16.
        ConfigTypeError: when ``scheme`` is not an ``Int4Scheme``.
    """
    _check_scheme_and_scale_dtype(scheme, scale_dtype)
    grouped = _grouped(w_NK.float(), scheme)
    if not scheme.has_zero_point:
        scale = grouped.abs().amax(dim=-1) / _SYM_DIVISOR
        _check_finite_groups(scale)
        return QParams(scale=_stored_scale(scale, scale_dtype))
    # The range always includes 0 so the zero point is a valid code in 0..15.
    lo = grouped.amin(dim=-1).clamp(max=0.0)
    hi = grouped.amax(dim=-1).clamp(min=0.0)
    _check_finite_groups(hi + lo)  # opposite signs: finite weights cannot overflow it
    scale = _stored_scale((hi - lo) / scheme.qmax, scale_dtype)
    safe = _safe_scale(scale)
    zero = torch.round(-lo / safe).clamp(scheme.qmin, scheme.qmax).to(torch.uint8)
    return QParams(scale=scale, zero_point=zero)


def _check_scheme_and_scale_dtype(scheme: Int4Scheme, scale_dtype: torch.dtype) -> None:
    """Before any work: the scales the layer and backends accept (no float64)."""
    check_type("scheme", scheme, Int4Scheme)
    check_activation_dtype("scale_dtype", scale_dtype)


def _check_finite_groups(reduced: torch.Tensor) -> None:
    """Raise ``ShapeError`` where a group's float32 reduction is NaN or inf.

    ``reduced`` is ``(..., N, G)``: ``amax |w| / 7.5`` (symmetric) or ``amax + amin``
    with the range held to include 0 (asymmetric). Both carry a NaN through and turn
    an inf weight into NaN or inf, and neither overflows for finite weights, so this
    small check finds what a pass over the float32 weights would (a NaN code cast to
    uint8 is undefined; it quantized silently before).
    """
    if reduced.is_meta or not reduced.numel():
        return
    bad = ~torch.isfinite(reduced)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ShapeError(
            "w_NK must be finite in float32, got NaN or inf in (..., row, group) "
            f"{where} ({int(bad.sum())} of {reduced.numel()} groups)"
        )


def _stored_scale(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """float32 ``scale`` rounded to ``scale_dtype``, where that keeps every group.

    A subnormal of ``scale_dtype`` that rounded down is stored one ulp up (its rounding
    can reach a third of the value), so no group's largest value passes the clamp.

    Raises:
        ShapeError: where a scale overflows ``scale_dtype`` (its weights would
            dequantize to inf/NaN) or a nonzero group's scale rounds to 0 (its weights
            would all become 0), e.g. weights of 1e6 or 1e-8 with fp16 scales.
    """
    stored = scale.to(scale_dtype)
    if scale.is_meta or not scale.numel():
        return stored
    lost = torch.isinf(stored) | ((stored == 0) & (scale > 0))
    if bool(lost.any()):
        info = torch.finfo(scale_dtype)
        nonzero = scale[scale > 0]
        raise ShapeError(
            f"weights need group scales from {info.tiny * info.eps:.3g} to "
            f"{info.max:.3g} to be stored in scale_dtype {scale_dtype}, got scales "
            f"from {float(nonzero.min()):.3g} to {float(nonzero.max()):.3g}; use "
            "bfloat16 or float32 scales, or rescale the weights"
        )
    # A subnormal rounds by up to half of a fixed ulp (1.49 x fp16's smallest subnormal
    # stores as 1 x it): where it rounded down, one ulp up, so amax / stored stays <= 7.5.
    below = (stored.abs() < torch.finfo(scale_dtype).tiny) & (stored.float() < scale)
    if bool(below.any()):
        up = torch.nextafter(stored, torch.full_like(stored, float("inf")))
        stored = torch.where(below, up, stored)
    return stored


def _safe_scale(scale: torch.Tensor) -> torch.Tensor:
    """float32 scale with zeros replaced by one (an all-zero group quantizes to zero)."""
    as_f32 = scale.float()
    return torch.where(as_f32 == 0, torch.ones_like(as_f32), as_f32)


def quantize(w_NK: torch.Tensor, qparams: QParams, scheme: Int4Scheme) -> torch.Tensor:
    """Round ``w_NK`` to int4 codes with the given parameters.

    ``w_NK`` must be finite (``choose_qparams`` refuses NaN and inf; here a NaN
    would give an undefined code).

    Returns:
        uint8 codes ``(..., N, K)`` in ``0..15`` (unpacked).

    Raises:
        ConfigError: when ``qparams`` has a zero point and ``scheme`` is symmetric,
            or none and it is asymmetric.
    """
    _check_qparams_scheme(qparams, scheme)
    grouped = _grouped(w_NK.float(), scheme)
    step = _safe_scale(qparams.scale).unsqueeze(-1)
    if qparams.zero_point is None:
        codes = (
            torch.round(grouped / step).clamp(-_SYM_OFFSET, _SYM_OFFSET - 1)
            + _SYM_OFFSET
        )
    else:
        zero = qparams.zero_point.float().unsqueeze(-1)
        codes = (torch.round(grouped / step) + zero).clamp(scheme.qmin, scheme.qmax)
    return codes.to(torch.uint8).reshape(w_NK.shape)


def dequantize(
    codes_NK: torch.Tensor,
    qparams: QParams,
    scheme: Int4Scheme,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Exact dequantization ``(q - z) * scale`` computed in float32, cast to ``dtype``.

    Args:
        codes_NK: uint8 codes ``(..., N, K)``.
        qparams: ``scale`` ``(..., N, G)`` and optional ``zero_point``.
        scheme: the scheme the codes follow.
        dtype: output dtype.

    Raises:
        ConfigError: when ``qparams`` has a zero point and ``scheme`` is symmetric,
            or none and it is asymmetric.
    """
    _check_qparams_scheme(qparams, scheme)
    grouped = _grouped(codes_NK, scheme).float()
    zero = (
        torch.full_like(qparams.scale, _SYM_OFFSET, dtype=torch.float32)
        if qparams.zero_point is None
        else qparams.zero_point.float()
    )
    values = (grouped - zero.unsqueeze(-1)) * qparams.scale.float().unsqueeze(-1)
    return values.reshape(codes_NK.shape).to(dtype)


def _check_qparams_scheme(qparams: QParams, scheme: Int4Scheme) -> None:
    """A zero point exactly where ``scheme`` is asymmetric."""
    has_zero = qparams.zero_point is not None
    if has_zero != scheme.has_zero_point:
        want = "a tensor" if scheme.has_zero_point else "None"
        got = "a tensor" if has_zero else "None"
        raise ConfigError(
            f"qparams.zero_point must be {want} for {scheme.name}, got {got}"
        )


def dequantize_packed(
    qdata_NP: torch.Tensor,
    qparams: QParams,
    scheme: Int4Scheme,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """:func:`dequantize` of packed ``(..., N, K/2)`` bytes."""
    return dequantize(unpack_int4(qdata_NP), qparams, scheme, dtype=dtype)


def quantize_tensor(
    w_NK: torch.Tensor, scheme: Int4Scheme, *, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, QParams]:
    """choose_qparams, quantize and pack one ``(..., N, K)`` tensor.

    Returns:
        packed uint8 ``(..., N, K/2)`` and its ``QParams``.
    """
    qparams = choose_qparams(w_NK, scheme, scale_dtype=scale_dtype)
    return pack_int4(quantize(w_NK, qparams, scheme)), qparams


def _check_expert_shapes(w13_weight: torch.Tensor, w2_weight: torch.Tensor) -> None:
    """``w13_weight (E, 2F, D)`` and ``w2_weight (E, D, F)`` agree on E, D and F."""
    w13, w2 = tuple(w13_weight.shape), tuple(w2_weight.shape)
    if len(w13) != 3 or len(w2) != 3:
        raise ShapeError(
            "w13_weight and w2_weight must be 3-D (E, 2F, D) and (E, D, F), got shapes "
            f"{w13} and {w2}"
        )
    e, d, f = w13[0], w13[2], w2[2]
    if w2[:2] != (e, d):
        raise ShapeError(
            f"w2_weight must have shape (E, D, F) with E={e} and D={d} like w13_weight "
            f"{w13}, got {w2}"
        )
    if w13[1] != 2 * f:
        raise ShapeError(
            f"w13_weight must have 2F={2 * f} rows for w2_weight {w2} (F={f}), "
            f"got shape {w13}"
        )


def quantize_expert_weights(
    w13_weight: torch.Tensor,
    w2_weight: torch.Tensor,
    scheme: Int4Scheme,
    *,
    scale_dtype: torch.dtype = torch.bfloat16,
) -> QuantizedExpertWeights:
    """Quantize float expert weights into the canonical layout.

    Args:
        w13_weight: ``(E, 2F, D)``, gate rows ``[0:F]``, up rows ``[F:2F]``.
        w2_weight: ``(E, D, F)``.
        scheme: int4 scheme.
        scale_dtype: dtype of the stored scales (the activation dtype).

    The results are contiguous and carry no autograd history (the weights are read
    detached, whether or not they require grad).

    Raises:
        ShapeError: on wrong ranks, sizes that do not agree between ``w13_weight`` and
            ``w2_weight``, sizes the group size does not divide, NaN/inf values, or
            group scales that ``scale_dtype`` cannot hold (``choose_qparams``).
        DTypeError: when a weight is not floating, or ``scale_dtype`` is not float32,
            float16 or bfloat16.
        ConfigTypeError: when ``scheme`` is not an ``Int4Scheme``.
    """
    _check_scheme_and_scale_dtype(scheme, scale_dtype)
    _check_expert_shapes(w13_weight, w2_weight)
    for name, weight in (("w13_weight", w13_weight), ("w2_weight", w2_weight)):
        # as quantized: float64 values past float32's range are inf there
        if weight.dtype == torch.float64:
            check_finite(f"{name} (as float32)", weight.float())
        else:
            check_finite(name, weight)
    with torch.no_grad():  # codes and scales are data, not a graph back to the floats
        w13_qdata, w13 = quantize_tensor(
            w13_weight.detach(), scheme, scale_dtype=scale_dtype
        )
        w2_qdata, w2 = quantize_tensor(
            w2_weight.detach(), scheme, scale_dtype=scale_dtype
        )

    def dense(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.contiguous()

    return QuantizedExpertWeights(
        w13_qdata=w13_qdata.contiguous(),
        w13_scale=w13.scale.contiguous(),
        w13_zero_point=dense(w13.zero_point),
        w2_qdata=w2_qdata.contiguous(),
        w2_scale=w2.scale.contiguous(),
        w2_zero_point=dense(w2.zero_point),
        scheme=scheme,
    )


def dequantize_expert_weights(
    weights: QuantizedExpertWeights, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantize every expert: ``(E, 2F, D)`` and ``(E, D, F)`` in ``dtype``.

    This materializes all experts; prefer :func:`dequantize_expert` in loops.
    """
    scheme = weights.scheme
    w13 = dequantize_packed(weights.w13_qdata, weights.w13, scheme, dtype=dtype)
    w2 = dequantize_packed(weights.w2_qdata, weights.w2, scheme, dtype=dtype)
    return w13, w2


def dequantize_expert(
    weights: QuantizedExpertWeights, expert: int, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantize one expert: ``(2F, D)`` and ``(D, F)`` in ``dtype``.

    Raises:
        ConfigError: unless ``expert`` is an integer in ``[0, E)`` (anything
            ``operator.index`` takes, a numpy or 0-d tensor integer too, but not a
            bool; a negative index would pick an expert from the end).
    """
    try:
        index = None if isinstance(expert, bool) else operator.index(expert)
    except TypeError:
        index = None
    if index is None or not 0 <= index < weights.num_experts:
        raise ConfigError(
            f"expert must be an int in [0, {weights.num_experts}), got {expert!r}"
        )
    expert = index

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[expert]

    scheme = weights.scheme
    w13 = QParams(
        scale=weights.w13_scale[expert], zero_point=pick(weights.w13_zero_point)
    )
    w2 = QParams(scale=weights.w2_scale[expert], zero_point=pick(weights.w2_zero_point))
    return (
        dequantize_packed(weights.w13_qdata[expert], w13, scheme, dtype=dtype),
        dequantize_packed(weights.w2_qdata[expert], w2, scheme, dtype=dtype),
    )
