"""Weight layouts: how int4 codes, scales and zero points are laid out in memory.

Pure metadata. Imports only stdlib and attrs.
"""

import enum
from typing import Final

import attrs


class PackingFormat(str, enum.Enum):
    """Byte layout of packed int4 weights."""

    UINT8_LOW_FIRST = "uint8_low_first"
    """``qdata`` is uint8 ``(E, N, K/2)``: byte ``j`` of a row holds element ``2j`` in
    its low nibble and ``2j+1`` in its high nibble. A GPTQ-style int32 packed along K
    (LSB first) viewed as uint8 on a little-endian host is byte-for-byte this layout.
    Scales are ``(E, N, K/G)`` in the activation dtype; asymmetric zero points are
    unpacked uint8 codes ``(E, N, K/G)``."""


@attrs.frozen(kw_only=True)
class WeightLayout:
    """The layout of the expert weights held by ``Int4MoE`` (FORMATS.md section 2).

    Attributes:
        packing: how two int4 codes share one byte.
        w13_gate_up_halves: ``True`` when w13 rows ``[0:F]`` are gate and ``[F:2F]`` up.
    """

    packing: PackingFormat = attrs.field(
        default=PackingFormat.UINT8_LOW_FIRST, converter=PackingFormat
    )
    w13_gate_up_halves: bool = attrs.field(
        default=True, validator=attrs.validators.instance_of(bool)
    )


CANONICAL_LAYOUT: Final = WeightLayout()
"""The only layout the library stores: every importer converts into it."""
