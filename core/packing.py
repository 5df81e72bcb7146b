"""Exact packing of int4 codes into bytes (canonical layout, low nibble first).

Pure functions over tensors. Imports only torch and core.
"""

import torch

from core.errors import DTypeError, ShapeError

_WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack int4 codes two per byte along the last dimension.

    Args:
        codes: integer tensor ``(..., K)`` with values in ``0..15`` and even ``K``.

    Returns:
        uint8 ``(..., K/2)``: element ``2j`` in the low nibble of byte ``j``, ``2j+1``
        in the high nibble.

    Raises:
        DTypeError: if ``codes`` is not an integer tensor.
        ShapeError: if the last dimension is odd, or a code is outside ``0..15``.

    The range check reads the codes' min and max back to the host (one device sync),
    which is fine where this runs: at quantize and checkpoint-import time, never per
    forward call.
    """
    if (
        codes.dtype.is_floating_point
        or codes.dtype.is_complex
        or codes.dtype == torch.bool
    ):
        raise DTypeError(f"codes must be an integer tensor, got dtype {codes.dtype}")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ShapeError(
            f"codes must have an even last dim, got shape {tuple(codes.shape)}"
        )
    if codes.numel():
        # uint16/32/64 have few kernels (no min/max on CPU): widen them first.
        wide = codes.long() if codes.dtype in _WIDE_UNSIGNED else codes
        lo, hi = torch.stack(torch.aminmax(wide)).tolist()
        if lo < 0 or hi > 15:
            raise ShapeError(f"codes must be in 0..15, got values in [{lo}, {hi}]")
    as_u8 = codes.to(torch.uint8)
    return (as_u8[..., 0::2] & 0xF) | ((as_u8[..., 1::2] & 0xF) << 4)


def unpack_int4(qdata: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`.

    Args:
        qdata: uint8 ``(..., K/2)``.

    Returns:
        uint8 codes ``(..., K)`` in ``0..15``.

    Raises:
        DTypeError: if ``qdata`` is not uint8.
    """
    if qdata.dtype != torch.uint8:
        raise DTypeError(f"qdata must be uint8, got dtype {qdata.dtype}")
    low = qdata & 0xF
    high = qdata >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)
