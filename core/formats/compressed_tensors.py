"""compressed-tensors ``pack_quantized`` int4 (llm-compressor) to and from canonical.

Stored per projection: ``weight_packed`` int32 ``(N, ceil(K/8))`` packed along K, least
significant nibble first; ``weight_scale`` ``(N, K/G)``; ``weight_zero_point`` int32
``(ceil(N/8), K/G)`` packed along the **output** dim (asymmetric only);
``weight_shape`` ``[N, K]``; optionally ``weight_g_idx`` ``(K,)`` (``actorder="group"``).
Codes and zero points carry the +8 offset of signed int4, so a stored nibble is our
code as is: ``(q - z) * scale`` (symmetric: ``z = 8``). Padding nibbles are zero.
Shape legend: ``N`` out, ``K`` in, ``G`` groups, ``W`` words. Imports torch and core.
"""

import torch
import torch.nn.functional as F

from core.errors import ConfigError, DTypeError, ShapeError
from core.formats.experts import split_experts
from core.formats.projection import (
    NIBBLES_PER_WORD,
    Int4Projection,
    check_int32,
    check_leading,
    check_ndim,
    make_projection,
    pack_words,
    resolve_groups,
    unpack_words,
)
from core.packing import unpack_int4
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights


def _shape_of(weight_packed: torch.Tensor, weight_shape: torch.Tensor | None) -> int:
    """The true input dim ``K`` (packing pads K up to a multiple of 8)."""
    words = int(weight_packed.shape[-1])
    if weight_shape is None:
        return NIBBLES_PER_WORD * words
    dims = [int(v) for v in weight_shape.flatten().tolist()]
    n, k = dims[-2:] if len(dims) >= 2 else (-1, -1)
    if n != weight_packed.shape[-2] or -(-k // NIBBLES_PER_WORD) != words:
        raise ShapeError(
            f"weight_shape {dims} does not match weight_packed of shape "
            f"{tuple(weight_packed.shape)} (N rows, ceil(K/8) words)"
        )
    return k


def from_compressed_tensors(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None = None,
    weight_shape: torch.Tensor | None = None,
    weight_g_idx: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
) -> Int4Projection:
    """Convert one ``pack_quantized`` projection (or a stack with leading dims) exactly.

    Args:
        weight_packed: int32 ``(..., N, ceil(K/8))``.
        weight_scale: ``(..., N, K/G)`` (``G = K`` for the channel strategy).
        weight_zero_point: int32 ``(..., ceil(N/8), K/G)`` or ``None`` (symmetric).
        weight_shape: ``[..., N, K]``; without it ``K = 8 * weight_packed.shape[-1]``.
        weight_g_idx: optional ``(K,)`` group of each input column (``actorder="group"``).
        group_size: declared group size (``-1``, or at least ``K`` with one scale
            column: one group per row), checked against the shapes; ``None``: from
            ``weight_g_idx`` or the shapes (see
            :func:`~core.formats.projection.group_size_of`).

    Raises:
        ShapeError, DTypeError, ConfigError: on malformed or unrepresentable input.
    """
    check_int32("weight_packed", weight_packed)
    check_ndim("weight_packed", weight_packed, 2)
    k = _shape_of(weight_packed, weight_shape)
    n = int(weight_packed.shape[-2])
    codes_NK = unpack_words(weight_packed)[..., :k]
    if weight_scale.ndim != weight_packed.ndim or weight_scale.shape[-2] != n:
        raise ShapeError(
            f"weight_scale must be (N={n}, K/G), got shape {tuple(weight_scale.shape)}"
        )
    check_leading("weight_scale", weight_scale, "weight_packed", weight_packed)
    if weight_zero_point is not None:
        check_leading(
            "weight_zero_point", weight_zero_point, "weight_packed", weight_packed
        )
    stored = int(weight_scale.shape[-1])
    group, rows_B = resolve_groups(
        "weight_scale",
        k,
        stored,
        declared=group_size,
        g_idx=weight_g_idx,
        g_idx_name="weight_g_idx",
    )
    zero_NS = None if weight_zero_point is None else _unpack_zero(weight_zero_point, n)
    if zero_NS is not None and zero_NS.shape[-1] != stored:
        raise ShapeError(
            f"weight_zero_point must be (ceil(N/8), K/G={stored}), got shape "
            f"{tuple(weight_zero_point.shape) if weight_zero_point is not None else ()}"
        )
    scale_NS = weight_scale
    if rows_B is not None:
        scale_NS = scale_NS[..., rows_B]
        zero_NS = None if zero_NS is None else zero_NS[..., rows_B]
    return make_projection(codes_NK, scale_NS, zero_NS, group)


def _unpack_zero(weight_zero_point: torch.Tensor, n: int) -> torch.Tensor:
    if weight_zero_point.dtype == torch.int8:
        raise DTypeError(
            "weight_zero_point must be int32 packed words, got int8: zero points "
            "stored unpacked, as compressed-tensors wrote them before it packed them "
            "(April 2025), are not read; re-save the checkpoint with a current "
            "compressed-tensors"
        )
    check_int32("weight_zero_point", weight_zero_point)
    check_ndim("weight_zero_point", weight_zero_point, 2)
    zeros_SN = unpack_words(weight_zero_point.transpose(-1, -2))
    if zeros_SN.shape[-1] < n or zeros_SN.shape[-1] - n >= NIBBLES_PER_WORD:
        raise ShapeError(
            f"weight_zero_point must pack N={n} rows into ceil(N/8) words, got shape "
            f"{tuple(weight_zero_point.shape)}"
        )
    return zeros_SN[..., :n].transpose(-1, -2)


def _pack_along_last(codes: torch.Tensor) -> torch.Tensor:
    pad = -codes.shape[-1] % NIBBLES_PER_WORD
    return pack_words(F.pad(codes.to(torch.int32), (0, pad)))


def to_compressed_tensors(projection: Int4Projection) -> dict[str, torch.Tensor]:
    """Export one projection (or a stack) as compressed-tensors ``pack_quantized``.

    Returns:
        ``weight_packed``, ``weight_scale``, ``weight_shape`` (int64 ``[..., N, K]``)
        and, when the projection has zero points, ``weight_zero_point``; the names a
        ``pack-quantized`` checkpoint uses under ``<module>.``.
    """
    codes_NK = unpack_int4(projection.qdata)
    out = {
        "weight_packed": _pack_along_last(codes_NK).contiguous(),
        "weight_scale": projection.scale.contiguous(),
        "weight_shape": torch.tensor(tuple(codes_NK.shape), dtype=torch.int64),
    }
    if projection.zero_point is not None:
        zero_GN = projection.zero_point.transpose(-1, -2)
        out["weight_zero_point"] = (
            _pack_along_last(zero_GN).transpose(-1, -2).contiguous()
        )
    return out


def export_expert_weights(
    weights: QuantizedExpertWeights,
    *,
    prefix: str = "experts",
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> dict[str, torch.Tensor]:
    """Export canonical experts as per-expert, per-projection ``pack_quantized`` tensors.

    Args:
        weights: canonical expert weights.
        prefix: name prefix of the experts, e.g. ``model.layers.0.mlp.experts``.
        names: gate, up and down projection names (``("w1", "w3", "w2")`` for Mixtral).

    Returns:
        ``{f"{prefix}.{e}.{proj}.weight_packed": ..., ...}`` for every expert.

    Raises:
        ConfigError: the experts have biases (``w13_bias``/``w2_bias``, gpt-oss), which
            this per-projection format has no tensors for here and the checkpoint
            loaders do not read back; save ``Int4MoE.state_dict()`` (int4-moe's own
            format) instead.
    """
    if weights.w13_bias is not None or weights.w2_bias is not None:
        raise ConfigError(
            "export_expert_weights does not export expert biases (w13_bias, "
            "w2_bias), got weights with them; save Int4MoE.state_dict() (int4-moe's "
            "own format, which keeps them) instead"
        )
    w13, w2 = split_experts(weights)
    f = weights.intermediate_size
    halves = (slice(0, f), slice(f, 2 * f))
    out: dict[str, torch.Tensor] = {}
    for e in range(weights.num_experts):
        parts = [_rows(w13, e, rows) for rows in halves] + [_rows(w2, e, slice(None))]
        for proj, part in zip(names, parts, strict=True):
            for key, tensor in to_compressed_tensors(part).items():
                out[f"{prefix}.{e}.{proj}.{key}"] = tensor
    return out


def _rows(projection: Int4Projection, expert: int, rows: slice) -> Int4Projection:
    zero = projection.zero_point
    return Int4Projection(
        qdata=projection.qdata[expert, rows],
        scale=projection.scale[expert, rows],
        zero_point=None if zero is None else zero[expert, rows],
        group_size=projection.group_size,
    )


def quantization_config(
    scheme: Int4Scheme, *, ignore: tuple[str, ...] = ()
) -> dict[str, object]:
    """A ``quantization_config`` for ``config.json`` describing ``scheme``.

    Whole-row groups map to the ``channel`` strategy, others to ``group``.
    """
    channel = scheme.group_size == -1
    weights: dict[str, object] = {
        "num_bits": 4,
        "type": "int",
        "symmetric": not scheme.has_zero_point,
        "strategy": "channel" if channel else "group",
        "group_size": None if channel else scheme.group_size,
        "dynamic": False,
        "actorder": None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": list(ignore),
    }
