"""GPTQ (AutoGPTQ / GPTQModel) int4 tensors to the canonical layout. Pure.

GPTQ stores ``qweight`` int32 ``(K/8, N)`` packed along K (element ``8i + j`` of a
column at bits ``4j..4j+3`` of word ``i``), ``scales`` ``(K/G, N)``, ``qzeros`` int32
``(K/G, N/8)`` packed along N, and ``g_idx`` ``(K,)``. Format v1 (the on-disk
``checkpoint_format="gptq"``) stores ``z - 1``; v2 stores ``z``. Value:
``scales[g_idx[k], n] * (q[k, n] - z[g_idx[k], n])``.
Shape legend: ``N`` out, ``K`` in, ``G`` groups, ``S`` stored scale rows, ``W`` words.
Imports only torch and core.
"""

from typing import Literal

import torch

from core.errors import ConfigError, ShapeError
from core.formats.projection import (
    Int4Projection,
    check_int32,
    check_ndim,
    make_projection,
    resolve_groups,
    unpack_words,
)

GPTQFormat = Literal["gptq", "gptq_v2"]
SYMMETRIC_ZERO = 8


def gptq_zero_points(
    qzeros_SW: torch.Tensor, *, checkpoint_format: GPTQFormat = "gptq"
) -> torch.Tensor:
    """Unpack GPTQ ``qzeros`` to true zero points ``(..., S, N)`` as int16.

    v1 adds one to each stored nibble, so a stored 15 means 16, which no 4-bit code can
    hold; that is refused.

    Raises:
        ConfigError: for a v1 stored zero point of 15, or an unknown format.
    """
    check_int32("qzeros", qzeros_SW)
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ConfigError(
            f"checkpoint_format must be `gptq` or `gptq_v2`, got {checkpoint_format!r}"
        )
    zeros = unpack_words(qzeros_SW).to(torch.int16)
    if checkpoint_format == "gptq":
        zeros = zeros + 1
        if bool((zeros > 15).any()):
            raise ConfigError(
                "qzeros holds the GPTQ v1 code 15 (zero point 16), which a 4-bit zero "
                "point cannot represent; re-export the checkpoint as gptq_v2"
            )
    return zeros


def from_gptq(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    qzeros: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    symmetric: bool | None = None,
    checkpoint_format: GPTQFormat = "gptq",
) -> Int4Projection:
    """Convert one GPTQ projection (or a stack with leading dims) exactly.

    Args:
        qweight: int32 ``(..., K/8, N)``.
        scales: ``(..., K/G, N)``.
        qzeros: int32 ``(..., K/G, N/8)``; ``None`` means symmetric (zero point 8).
        g_idx: optional ``(K,)`` scale row of each input column (see
            :func:`~core.formats.projection.rows_per_group_from_g_idx`); without a
            declared group size, the group size is where it first changes.
        group_size: declared group size (``-1``, or at least ``K`` with one scale
            row: one group per row), checked against the shapes; ``None``: from
            ``g_idx`` or the shapes (see
            :func:`~core.formats.projection.group_size_of`).
        symmetric: ``True`` requires every zero point to be 8 and drops them;
            ``None`` drops them when they all are 8; ``False`` keeps them.
        checkpoint_format: `gptq` (v1, stores ``z - 1``) or `gptq_v2`.

    Raises:
        ShapeError, DTypeError, ConfigError: on malformed or unrepresentable input.
    """
    check_int32("qweight", qweight)
    check_ndim("qweight", qweight, 2)
    codes_NK = unpack_words(qweight.transpose(-1, -2))
    n, k = int(codes_NK.shape[-2]), int(codes_NK.shape[-1])
    scale_NS = scales.transpose(-1, -2)
    if scales.ndim != qweight.ndim or scale_NS.shape[-2] != n:
        raise ShapeError(
            f"scales must be (K/G, N) with N={n} from qweight, got {tuple(scales.shape)}"
        )
    stored = int(scale_NS.shape[-1])
    group, rows_B = resolve_groups(
        "scales", k, stored, declared=group_size, g_idx=g_idx, g_idx_name="g_idx"
    )
    zero_NS = _zeros(qzeros, n, stored, checkpoint_format)
    if rows_B is not None:
        scale_NS = scale_NS[..., rows_B]
        zero_NS = None if zero_NS is None else zero_NS[..., rows_B]
    zero_NS = _apply_symmetry(zero_NS, symmetric=symmetric)
    return make_projection(codes_NK, scale_NS, zero_NS, group)


def _zeros(
    qzeros: torch.Tensor | None, n: int, stored: int, checkpoint_format: GPTQFormat
) -> torch.Tensor | None:
    if qzeros is None:
        return None
    zeros_SN = gptq_zero_points(qzeros, checkpoint_format=checkpoint_format)
    if zeros_SN.shape[-2] != stored or zeros_SN.shape[-1] < n:
        raise ShapeError(
            f"qzeros must be (K/G={stored}, N/8={(n + 7) // 8}), got {tuple(qzeros.shape)}"
        )
    return zeros_SN[..., :n].transpose(-1, -2)


def _apply_symmetry(
    zero_NG: torch.Tensor | None, *, symmetric: bool | None
) -> torch.Tensor | None:
    if zero_NG is None or symmetric is False:
        return zero_NG
    all_eight = bool((zero_NG == SYMMETRIC_ZERO).all())
    if symmetric and not all_eight:
        raise ConfigError(
            "symmetric GPTQ must have every zero point equal to 8, got values "
            f"{sorted(set(torch.unique(zero_NG).tolist()))}"
        )
    return None if all_eight else zero_NG
