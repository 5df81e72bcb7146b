"""GPTQ (AutoGPTQ / GPTQModel) int4 tensors to the canonical layout. Pure.

GPTQ stores ``qweight`` int32 ``(K/8, N)`` packed along K (element ``8i + j`` of a
column at bits ``4j..4j+3`` of word ``i``), ``scales`` ``(K/G, N)``, ``qzeros`` int32
``(K/G, N/8)`` packed along N, and ``g_idx`` ``(K,)``. Format v1 (the on-disk
``checkpoint_format="gptq"``) stores ``z - 1``; v2 stores ``z``. Value:
``scales[g_idx[k], n] * (q[k, n] - z[g_idx[k], n])``.

v1 and a zero point of 0: GPTQModel writes v1 by subtracting ``0x11111111`` from each
whole word, so a zero point of 0 is stored as 15 and borrows one from the nibble above
(it reads v1 back by adding ``0x11111111``); AutoGPTQ's packer writes ``-1`` over every
nibble above it instead, which cannot be read back. Without a stored 15 both equal
adding one to each nibble.
Shape legend: ``N`` out, ``K`` in, ``G`` groups, ``S`` stored scale rows, ``W`` words.
Imports only torch and core.
"""

from typing import Literal

import torch

from core.errors import ConfigError, ShapeError
from core.formats.projection import (
    Int4Projection,
    check_int32,
    check_leading,
    check_ndim,
    make_projection,
    resolve_groups,
    unpack_words,
)

GPTQFormat = Literal["gptq", "gptq_v2"]
SYMMETRIC_ZERO = 8
_V1_WORD_OFFSET = 0x11111111
"""One added to each nibble of a word, carries included (GPTQModel's v1 -> v2)."""


def gptq_zero_points(
    qzeros_SW: torch.Tensor,
    *,
    checkpoint_format: GPTQFormat | None = "gptq",
    v1_word_carry: bool = False,
    num_columns: int | None = None,
) -> torch.Tensor:
    """Unpack GPTQ ``qzeros`` to true zero points ``(..., S, N)`` as int16.

    Args:
        qzeros_SW: int32 ``(..., S, W)``.
        checkpoint_format: `gptq` (v1, stores ``z - 1``), `gptq_v2` (stores ``z``), or
            ``None`` when nothing says which: then only a symmetric layer can be read
            (every stored code 7 is v1's zero point 8, every code 8 is v2's).
        v1_word_carry: v1 written by GPTQModel's whole-word arithmetic (see the
            module docstring): a stored 15 is then a zero point of 0.
        num_columns: ``N`` when ``N % 8 != 0``: the padding nibbles of the last word
            are dropped before anything reads them; ``None``: ``N = 8 * W``.

    Raises:
        ConfigError: for a v1 stored 15 without ``v1_word_carry``, an unknown format,
            or asymmetric zero points with ``checkpoint_format=None``.
    """
    check_int32("qzeros", qzeros_SW)
    if checkpoint_format not in ("gptq", "gptq_v2", None):
        raise ConfigError(
            f"checkpoint_format must be `gptq` or `gptq_v2`, got {checkpoint_format!r}"
        )
    stored = unpack_words(qzeros_SW).to(torch.int16)[..., :num_columns]
    if checkpoint_format is None:
        checkpoint_format = _symmetric_format(stored)
    if checkpoint_format == "gptq_v2":
        return stored
    if not bool((stored == 15).any()):
        return stored + 1
    if not v1_word_carry:
        raise ConfigError(
            "qzeros must hold GPTQ v1 codes 0-14 unless GPTQModel wrote them, got a "
            "15: that is a zero point of 0 in GPTQModel's whole-word arithmetic (read "
            "so when quantization_config meta.quantizer names gptqmodel) and garbled "
            "by AutoGPTQ's packer (re-export the checkpoint as gptq_v2)"
        )
    carried = (qzeros_SW.to(torch.int64) + _V1_WORD_OFFSET) & 0xFFFFFFFF
    as_int32 = torch.where(carried >= 1 << 31, carried - (1 << 32), carried)
    # A carry only moves up, so the padding nibbles above N change no real one.
    return unpack_words(as_int32.to(torch.int32)).to(torch.int16)[..., :num_columns]


def _symmetric_format(stored: torch.Tensor) -> GPTQFormat:
    """v1 when every stored code is 7, v2 when every one is 8; else refuse."""
    if bool((stored == SYMMETRIC_ZERO - 1).all()):
        return "gptq"
    if bool((stored == SYMMETRIC_ZERO).all()):
        return "gptq_v2"
    raise ConfigError(
        "checkpoint_format must be known for GPTQ qzeros whose zero points are not "
        "all the symmetric 8 (v1 stores z - 1, v2 z: they read one apart), got none: "
        "pass "
        "quantization_config={'quant_method': 'gptq', 'checkpoint_format': 'gptq' or "
        "'gptq_v2'} (a state dict of a model loaded through GPTQModel is v2 when its "
        "kernel works in v2, which GPTQModel's log says)"
    )


def from_gptq(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    qzeros: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    symmetric: bool | None = None,
    checkpoint_format: GPTQFormat | None = "gptq",
    v1_word_carry: bool = False,
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
        checkpoint_format: `gptq` (v1, stores ``z - 1``), `gptq_v2`, or ``None``
            when not known (symmetric zero points only; see :func:`gptq_zero_points`).
        v1_word_carry: v1 written by GPTQModel (see :func:`gptq_zero_points`).

    Raises:
        ShapeError, DTypeError, ConfigError: on malformed or unrepresentable input.
    """
    check_int32("qweight", qweight)
    check_ndim("qweight", qweight, 2)
    codes_NK = unpack_words(qweight.transpose(-1, -2))
    n, k = int(codes_NK.shape[-2]), int(codes_NK.shape[-1])
    # ndim first: a 1-D scales has no dim -2 to transpose.
    if scales.ndim != qweight.ndim or scales.shape[-1] != n:
        raise ShapeError(
            f"scales must be (K/G, N) with N={n} from qweight, got {tuple(scales.shape)}"
        )
    scale_NS = scales.transpose(-1, -2)
    check_leading("scales", scales, "qweight", qweight)
    stored = int(scale_NS.shape[-1])
    group, rows_B = resolve_groups(
        "scales", k, stored, declared=group_size, g_idx=g_idx, g_idx_name="g_idx"
    )
    if qzeros is None and symmetric is False:
        raise ConfigError(
            "symmetric=False (an asymmetric GPTQ checkpoint) needs qzeros, got None"
        )
    if qzeros is not None:
        check_leading("qzeros", qzeros, "qweight", qweight)
    zero_NS = _zeros(qzeros, n, stored, checkpoint_format, v1_word_carry=v1_word_carry)
    if rows_B is not None:
        scale_NS = scale_NS[..., rows_B]
        zero_NS = None if zero_NS is None else zero_NS[..., rows_B]
    zero_NS = _apply_symmetry(zero_NS, symmetric=symmetric)
    return make_projection(codes_NK, scale_NS, zero_NS, group)


def _zeros(
    qzeros: torch.Tensor | None,
    n: int,
    stored: int,
    checkpoint_format: GPTQFormat | None,
    *,
    v1_word_carry: bool,
) -> torch.Tensor | None:
    if qzeros is None:
        return None
    # Shape first: the format is read from the N real zero points, not the padding.
    if qzeros.shape[-2] != stored or qzeros.shape[-1] != (n + 7) // 8:
        raise ShapeError(
            f"qzeros must be (K/G={stored}, N/8={(n + 7) // 8}), got {tuple(qzeros.shape)}"
        )
    zeros_SN = gptq_zero_points(
        qzeros,
        checkpoint_format=checkpoint_format,
        v1_word_carry=v1_word_carry,
        num_columns=n,
    )
    return zeros_SN.transpose(-1, -2)


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
