"""Weight layouts: how int4 codes, scales and zero points are laid out in memory.

Pure metadata. Imports only stdlib, attrs and ``core.errors``.
"""

import enum
from typing import Final

import attrs

from core.errors import ConfigError, ConfigTypeError


class PackingFormat(str, enum.Enum):
    """Byte layout of packed int4 weights."""

    UINT8_LOW_FIRST = "uint8_low_first"
    """``qdata`` is uint8 ``(E, N, K/2)``: byte ``j`` of a row holds element ``2j`` in
    its low nibble and ``2j+1`` in its high nibble. A GPTQ-style int32 packed along K
    (LSB first) viewed as uint8 on a little-endian host is byte-for-byte this layout.
    Scales are ``(E, N, K/G)`` in the activation dtype; asymmetric zero points are
    unpacked uint8 codes ``(E, N, K/G)``."""


def _packing(value: "PackingFormat | str") -> "PackingFormat":
    """``value`` as a ``PackingFormat`` (a member or its string value)."""
    try:
        return PackingFormat(value)
    except ValueError:
        names = ", ".join(f"`{p.value}`" for p in PackingFormat)
        raise ConfigError(f"packing must be one of {names}, got {value!r}") from None


def _bool(_inst: object, attribute: "attrs.Attribute[bool]", value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigTypeError(
            f"{attribute.name} must be a bool, got {type(value).__name__} {value!r}"
        )


@attrs.frozen(kw_only=True)
class WeightLayout:
    """The layout of the expert weights held by ``Int4MoE`` (README: canonical layout).

    Attributes:
        packing: how two int4 codes share one byte.
        w13_gate_up_halves: ``True`` when w13 rows ``[0:F]`` are gate and ``[F:2F]`` up.
    """

    packing: PackingFormat = attrs.field(
        default=PackingFormat.UINT8_LOW_FIRST, converter=_packing
    )
    w13_gate_up_halves: bool = attrs.field(default=True, validator=_bool)


CANONICAL_LAYOUT: Final = WeightLayout()
"""The only layout the library stores: every importer converts into it."""
