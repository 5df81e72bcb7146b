"""One int4 linear projection in the canonical layout, and int32 nibble helpers.

Shared by the checkpoint importers (GPTQ, AWQ, compressed-tensors). Pure; imports only
torch, attrs and core. Shape legend: ``N`` output rows, ``K`` reduction (input) dim,
``G`` groups along K, ``W`` int32 words (8 nibbles each).
"""

import attrs
import torch

from core.errors import ConfigError, DTypeError, ShapeError
from core.packing import pack_int4
from core.scheme import SUPPORTED_GROUP_SIZES

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


def check_leading(
    name: str, tensor: torch.Tensor, ref: str, like: torch.Tensor
) -> None:
    """Raise ``ShapeError`` unless ``tensor`` has ``like``'s leading dims.

    Leading dims: all but the last two (the experts of a stack); ``ref`` names ``like``.
    """
    if tensor.ndim != like.ndim or tensor.shape[:-2] != like.shape[:-2]:
        raise ShapeError(
            f"{name} must have the leading dims of {ref} {tuple(like.shape[:-2])} "
            f"and {like.ndim} dims, got shape {tuple(tensor.shape)}"
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


def group_size_of(
    name: str, in_features: int, num_groups: int, *, declared: int | None = None
) -> int:
    """The group size of ``num_groups`` stored scale groups along ``in_features``.

    A declared size wins: ``-1``, or any size of at least ``in_features``, is one group
    per row; any other must divide ``in_features`` into exactly ``num_groups`` groups.
    Without one, the size is inferred as ``in_features / num_groups`` and accepted only
    when it is ``in_features`` (one group) or a supported size
    (:data:`~core.scheme.SUPPORTED_GROUP_SIZES`): a quantizer whose group ``G`` does not
    divide ``K`` stores ``ceil(K / G)`` groups, and equal groups of another size would
    then be a silent misreading.

    Raises:
        ShapeError: when the declared or implied group size does not divide
            ``in_features``, or there is no group.
        ConfigError: when the declared size is neither positive nor ``-1`` or
            disagrees with ``num_groups``, or the inferred one is not supported.
    """
    if num_groups <= 0:
        raise ShapeError(f"{name} must have at least one group, got {num_groups}")
    if declared is None:
        return _inferred_group_size(name, in_features, num_groups)
    return _declared_group_size(name, declared, in_features, num_groups)


def _declared_group_size(name: str, declared: int, k: int, num_groups: int) -> int:
    if declared == -1 or declared >= k:
        group = k
    elif declared <= 0:
        raise ConfigError(
            f"{name}: group_size must be positive or `-1`, got {declared}"
        )
    elif k % declared:
        raise ShapeError(
            f"{name}: group_size={declared} does not divide the input dim {k}; such "
            "a checkpoint cannot be read exactly"
        )
    else:
        group = declared
    if k // group != num_groups:
        implied = (
            f" (they imply group_size={k // num_groups})" if k % num_groups == 0 else ""
        )
        raise ConfigError(
            f"{name}: quantization_config says group_size={declared}, which needs "
            f"{k // group} groups for input dim {k}, but the scales have "
            f"{num_groups}{implied}"
        )
    return group


def _inferred_group_size(name: str, k: int, num_groups: int) -> int:
    if k % num_groups:
        raise ShapeError(
            f"{name} has {num_groups} groups, which do not divide the input dim {k} "
            "into equal groups; a group size that does not divide the input dim "
            "cannot be read exactly"
        )
    group = k // num_groups
    if num_groups > 1 and group not in SUPPORTED_GROUP_SIZES:
        allowed = ", ".join(f"`{g}`" for g in SUPPORTED_GROUP_SIZES if g > 0)
        raise ConfigError(
            f"{name} has {num_groups} groups along input dim {k}, implying "
            f"group_size={group}, which is not a supported size ({allowed}); a "
            "larger group size that does not divide the input dim stores as many "
            "groups, so the size cannot be inferred: declare group_size"
        )
    return group


def resolve_groups(
    name: str,
    in_features: int,
    num_groups: int,
    *,
    declared: int | None = None,
    g_idx: torch.Tensor | None = None,
    g_idx_name: str = "g_idx",
) -> tuple[int, torch.Tensor | None]:
    """The group size, and with a ``g_idx`` the stored group of each block.

    Without ``g_idx`` this is :func:`group_size_of`. With one, a declared size still
    wins; otherwise the size is where ``g_idx`` first changes, so a partial last group
    is reported as one (not as act-order). See :func:`rows_per_group_from_g_idx`.

    Returns:
        ``(group_size, rows_B)``; ``rows_B`` is ``None`` without ``g_idx``, else int64
        ``(K / group_size,)``: the stored scale group used by each block.

    Raises:
        ShapeError, DTypeError, ConfigError: as the functions named above.
    """
    if g_idx is None:
        return group_size_of(name, in_features, num_groups, declared=declared), None
    check_g_idx(g_idx_name, g_idx, in_features)
    if declared is not None:
        group = group_size_of(name, in_features, num_groups, declared=declared)
    else:
        changes = (g_idx[1:] != g_idx[:-1]).nonzero()
        group = in_features if changes.numel() == 0 else int(changes[0, 0]) + 1
    return group, rows_per_group_from_g_idx(g_idx_name, g_idx, group, num_groups)


def check_g_idx(name: str, g_idx_K: torch.Tensor, in_features: int) -> None:
    """Raise unless ``g_idx_K`` is an integer tensor of shape ``(in_features,)``."""
    dtype = g_idx_K.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise DTypeError(f"{name} must be an integer tensor, got dtype {g_idx_K.dtype}")
    if tuple(g_idx_K.shape) != (in_features,):
        raise ShapeError(
            f"{name} must have shape (K,) = ({in_features},), one entry per input "
            f"column, got {tuple(g_idx_K.shape)}"
        )


def rows_per_group_from_g_idx(
    name: str, g_idx_K: torch.Tensor, group_size: int, num_groups: int
) -> torch.Tensor:
    """The scale row of each block of ``group_size`` columns, from a ``g_idx``.

    ``g_idx[k]`` names the scale row of input column ``k``. It is representable exactly
    in the canonical layout only when every block of ``group_size`` consecutive columns
    uses one scale row (for example the trivial ``k // group_size``, or a relabelling of
    whole blocks) and the blocks need exactly ``num_groups`` rows. True act-order
    (``desc_act``) scatters the groups over the columns: honouring it would need the
    activations permuted, so it is refused.

    Returns:
        int64 ``(K / group_size,)``: the scale row used by each block.

    Raises:
        ShapeError: when ``g_idx`` is not ``(K,)`` or names a row outside
            ``[0, num_groups)``, or when its blocks are equal but ``group_size`` does
            not divide ``K`` (a partial last group).
        ConfigError: when a block mixes scale rows (act-order), naming the first
            such columns, or the blocks disagree with ``num_groups``.
    """
    k = int(g_idx_K.shape[-1])
    check_g_idx(name, g_idx_K, k)
    g_idx_K = g_idx_K.long()
    if k and (int(g_idx_K.min()) < 0 or int(g_idx_K.max()) >= num_groups):
        raise ShapeError(
            f"{name} must name scale rows in [0, {num_groups}), got values "
            f"{int(g_idx_K.min())}..{int(g_idx_K.max())}"
        )
    first_B = g_idx_K[::group_size]
    mixed = (first_B.repeat_interleave(group_size)[:k] != g_idx_K).nonzero()
    if mixed.numel():
        col = int(mixed[0, 0]) // group_size * group_size
        rows = sorted(set(g_idx_K[col : col + group_size].tolist()))
        raise ConfigError(
            f"{name} is an act-order (desc_act) permutation: columns "
            f"{col}..{min(col + group_size, k) - 1} use scale rows {rows[:4]}; only "
            f"g_idx where each block of {group_size} columns shares one scale row can "
            "be represented exactly (re-quantize without act-order, or with static "
            "order)"
        )
    if int(first_B.numel()) != num_groups:
        raise ConfigError(
            f"{name} makes {first_B.numel()} blocks of {group_size} columns, but the "
            f"scales have {num_groups} groups; an act-order (desc_act) g_idx like this "
            "cannot be represented exactly"
        )
    if k % group_size:
        raise ShapeError(
            f"{name}: group size {group_size} does not divide the input dim {k}; a "
            "partial last group cannot be read exactly"
        )
    return first_B


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
