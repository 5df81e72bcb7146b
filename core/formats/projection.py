"""One int4 linear projection in the canonical layout, and int32 nibble helpers.

Shared by the checkpoint importers (GPTQ, AWQ, compressed-tensors). Pure; imports only
torch, attrs and core. Shape legend: ``N`` output rows, ``K`` reduction (input) dim,
``G`` groups along K, ``W`` int32 words (8 nibbles each).
"""

import attrs
import torch

from core.errors import ConfigError, DTypeError, ShapeError
from core.packing import pack_int4

NIBBLES_PER_WORD = 8


@attrs.frozen(kw_only=True, eq=False)
class Int4Projection:
    """One quantized linear map ``y = x @ W.T`` (or a stack of them) in canonical form.

    Attributes:
        qdata: uint8 ``(..., N, K/2)``; byte ``j`` holds element ``2j`` in the low nibble.
        scale: ``(..., N, K/group_size)`` floating scales, as stored in the checkpoint.
        zero_point: uint8 ``(..., N, K/group_size)`` codes ``0..15`` or ``None``
            (symmetric: implicit 8). Value of a code ``q``: ``(q - z) * scale``.
        group_size: consecutive K elements sharing one scale (``K`` for per-channel).
    """

    qdata: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None
    group_size: int

    @property
    def out_features(self) -> int:
        """``N``."""
        return int(self.qdata.shape[-2])

    @property
    def in_features(self) -> int:
        """``K``."""
        return 2 * int(self.qdata.shape[-1])


def check_int32(name: str, tensor: torch.Tensor) -> None:
    """Raise ``DTypeError`` unless ``tensor`` is int32 (the packed word type)."""
    if tensor.dtype != torch.int32:
        raise DTypeError(f"{name} must be int32 packed words, got dtype {tensor.dtype}")


def check_ndim(name: str, tensor: torch.Tensor, ndim: int) -> None:
    """Raise ``ShapeError`` unless ``tensor`` has at least ``ndim`` dimensions."""
    if tensor.ndim < ndim:
        raise ShapeError(
            f"{name} must have at least {ndim} dims, got shape {tuple(tensor.shape)}"
        )


def unpack_words(
    words_W: torch.Tensor, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """Split int32 words along the last dim into 4-bit codes, least significant first.

    Uses shifts, so the result does not depend on the host byte order.

    Args:
        words_W: int32 ``(..., W)``.
        order: optional position of each element inside a word: element ``j`` of a
            word is taken from nibble ``order[j]`` (AWQ's interleave); default identity.

    Returns:
        uint8 codes ``(..., 8 * W)``.
    """
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words_W.device)
    nibbles = (words_W.unsqueeze(-1) >> shifts) & 0xF
    if order is not None:
        nibbles = nibbles[..., list(order)]
    return nibbles.to(torch.uint8).flatten(-2)


def pack_words(
    codes_K: torch.Tensor, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """Inverse of :func:`unpack_words`: codes ``(..., 8 * W)`` to int32 ``(..., W)``."""
    if codes_K.shape[-1] % NIBBLES_PER_WORD:
        raise ShapeError(
            "codes must have a last dim divisible by 8, got shape "
            f"{tuple(codes_K.shape)}"
        )
    grouped = codes_K.to(torch.int64).reshape(*codes_K.shape[:-1], -1, NIBBLES_PER_WORD)
    if order is not None:
        inverse = sorted(range(NIBBLES_PER_WORD), key=lambda j: order[j])
        grouped = grouped[..., inverse]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=codes_K.device)
    word = (grouped << shifts).sum(dim=-1)
    # Reinterpret the unsigned 32-bit pattern as int32 (two's complement).
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def group_size_of(name: str, in_features: int, num_groups: int) -> int:
    """The group size implied by ``num_groups`` scales along ``in_features``.

    Raises:
        ShapeError: when the groups do not split ``in_features`` evenly.
    """
    if num_groups <= 0 or in_features % num_groups:
        raise ShapeError(
            f"{name} has {num_groups} groups, which do not divide the input dim "
            f"{in_features} into equal groups"
        )
    return in_features // num_groups


def check_group_size(name: str, group_size: int | None, in_features: int) -> None:
    """A declared group size (``-1``/``None``: whole row) must divide ``in_features``."""
    if group_size is None or group_size == -1:
        return
    if group_size <= 0 or in_features % group_size:
        raise ShapeError(
            f"{name}: group_size={group_size} does not divide the input dim "
            f"{in_features}; such a checkpoint cannot be read exactly"
        )


def check_declared_group(name: str, declared: int | None, actual: int, k: int) -> None:
    """The group size from the config must match the one implied by the shapes."""
    check_group_size(name, declared, k)
    want = k if declared in (None, -1) else declared
    if declared is not None and want != actual:
        raise ConfigError(
            f"{name}: quantization_config says group_size={declared}, but the scales "
            f"imply group_size={actual} for input dim {k}"
        )


def rows_per_group_from_g_idx(
    name: str, g_idx_K: torch.Tensor, group_size: int, num_groups: int
) -> torch.Tensor:
    """The scale row of each block of ``group_size`` columns, from a ``g_idx``.

    ``g_idx[k]`` names the scale row of input column ``k``. It is representable exactly
    in the canonical layout only when every block of ``group_size`` consecutive columns
    uses one scale row (for example the trivial ``k // group_size``, or a relabelling of
    whole blocks). True act-order (``desc_act``) scatters the groups over the columns:
    honouring it would need the activations permuted, so it is refused.

    Returns:
        int64 ``(K / group_size,)``: the scale row used by each block.

    Raises:
        ConfigError: when a block mixes scale rows, naming the first such column.
    """
    k = int(g_idx_K.shape[-1])
    if g_idx_K.ndim != 1 or k % group_size:
        raise ShapeError(
            f"{name} must be 1-D with a length divisible by group_size={group_size}, "
            f"got shape {tuple(g_idx_K.shape)}"
        )
    blocks = g_idx_K.long().reshape(k // group_size, group_size)
    first = blocks[:, :1]
    bad = (blocks != first).any(dim=1) | (first[:, 0] < 0) | (first[:, 0] >= num_groups)
    if bool(bad.any()):
        block = int(bad.nonzero()[0])
        col = block * group_size
        raise ConfigError(
            f"{name} is an act-order (desc_act) permutation: columns "
            f"{col}..{col + group_size - 1} use scale rows "
            f"{sorted(set(blocks[block].tolist()))[:4]}; only g_idx where each block of "
            f"{group_size} columns shares one scale row in [0, {num_groups}) can be "
            "represented exactly (re-quantize without act-order, or with static order)"
        )
    return first[:, 0]


def make_projection(
    codes_NK: torch.Tensor,
    scale_NG: torch.Tensor,
    zero_NG: torch.Tensor | None,
    group_size: int,
) -> Int4Projection:
    """Pack unpacked codes ``(..., N, K)`` into an :class:`Int4Projection`."""
    if not scale_NG.dtype.is_floating_point:
        raise DTypeError(f"scales must be floating, got dtype {scale_NG.dtype}")
    if codes_NK.shape[-1] % 2:
        raise ShapeError(
            f"input dim must be even to pack two codes per byte, got {codes_NK.shape[-1]}"
        )
    return Int4Projection(
        qdata=pack_int4(codes_NK).contiguous(),
        scale=scale_NG.contiguous(),
        zero_point=None if zero_NG is None else zero_NG.to(torch.uint8).contiguous(),
        group_size=group_size,
    )
