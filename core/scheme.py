"""Int4 quantization schemes: symmetric or asymmetric, and the group size.

Pure metadata (attrs, frozen, hashable). Imports only stdlib, attrs and torch.
"""

import enum
from typing import Final

import attrs

from core.errors import ConfigError, ConfigTypeError, ShapeError

SUPPORTED_GROUP_SIZES: Final = (32, 64, 128, 256, -1)


class Int4Mapping(str, enum.Enum):
    """How a 4-bit code ``q`` in ``0..15`` maps to a real value."""

    SYMMETRIC = "symmetric"
    """``w = (q - 8) * scale``: no stored zero point (it is implicitly 8)."""

    ASYMMETRIC = "asymmetric"
    """``w = (q - z) * scale`` with one stored 4-bit zero point ``z`` per group."""


def _to_mapping(value: "Int4Mapping | str") -> Int4Mapping:
    """Converter: an ``Int4Mapping`` or its string value, else ``ConfigError``."""
    raw: object = value  # untyped callers can pass anything
    if isinstance(raw, Int4Mapping):
        return raw
    allowed = ", ".join(f"`{m.value}`" for m in Int4Mapping)
    if not isinstance(raw, str):
        raise ConfigTypeError(
            f"mapping must be an Int4Mapping or one of {allowed}, "
            f"got {type(raw).__name__} {raw!r}"
        )
    if raw not in {m.value for m in Int4Mapping}:
        raise ConfigError(f"mapping must be one of {allowed}, got {raw!r}")
    return Int4Mapping(raw)


def _check_group_size(_inst: object, _attr: object, value: object) -> None:
    # `type(...) is int`: 32.0 == 32 (and True == 1) would pass the membership test.
    if type(value) is not int:
        raise ConfigTypeError(
            f"group_size must be an int, got {type(value).__name__} {value!r}"
        )
    if value not in SUPPORTED_GROUP_SIZES:
        allowed = ", ".join(f"`{g}`" for g in SUPPORTED_GROUP_SIZES)
        raise ConfigError(f"group_size must be one of {allowed}, got {value!r}")


@attrs.frozen(kw_only=True)
class Int4Scheme:
    """An int4 weight-only quantization scheme.

    Attributes:
        mapping: symmetric (implicit zero point 8) or asymmetric (stored zero point);
            an ``Int4Mapping`` or its value, `symmetric` or `asymmetric`.
        group_size: consecutive reduction-dimension elements that share one scale;
            ``-1`` means one group per output row. An int (not ``32.0``) in
            `32`, `64`, `128`, `256`, `-1`.

    Raises:
        ConfigError: on an unknown mapping or group size (``ConfigTypeError``, also a
            ``TypeError``, when the value has the wrong type).
    """

    mapping: Int4Mapping = attrs.field(
        default=Int4Mapping.SYMMETRIC, converter=_to_mapping
    )
    group_size: int = attrs.field(default=32, validator=_check_group_size)

    @property
    def qmin(self) -> int:
        """Smallest stored code."""
        return 0

    @property
    def qmax(self) -> int:
        """Largest stored code."""
        return 15

    @property
    def has_zero_point(self) -> bool:
        """Whether zero points are stored (asymmetric schemes)."""
        return self.mapping is Int4Mapping.ASYMMETRIC

    @property
    def name(self) -> str:
        """Short readable id such as ``int4_sym_g32`` or ``int4_asym_g-1``."""
        kind = "sym" if self.mapping is Int4Mapping.SYMMETRIC else "asym"
        return f"int4_{kind}_g{self.group_size}"

    def group_size_for(self, reduction_size: int) -> int:
        """The effective group size along a reduction dimension of this size."""
        return reduction_size if self.group_size == -1 else self.group_size

    def num_groups(self, reduction_size: int, *, name: str = "reduction dim") -> int:
        """Groups along a reduction dimension; raises if it does not divide.

        Raises:
            ShapeError: when ``reduction_size`` is odd or not a multiple of the group size.
        """
        if reduction_size <= 0 or reduction_size % 2:
            raise ShapeError(
                f"{name} must be a positive even number, got {reduction_size}"
            )
        group = self.group_size_for(reduction_size)
        if reduction_size % group:
            raise ShapeError(
                f"{name}={reduction_size} must be divisible by group_size={group}"
            )
        return reduction_size // group


INT4_SYM: Final = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=-1)
"""Symmetric, one group per row (vLLM ``kInt4Static`` with channel-wise groups)."""
INT4_ASYM: Final = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=-1)
"""Asymmetric, one group per row."""
INT4_SYM_G32: Final = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=32)
"""Symmetric, group 32 (vLLM ``kInt4Static32``)."""
INT4_ASYM_G32: Final = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=32)
"""Asymmetric, group 32 (vLLM ``kInt4Static32Asym``)."""
INT4_SYM_G128: Final = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=128)
"""Symmetric, group 128 (the usual GPTQ / AWQ / compressed-tensors choice)."""
INT4_ASYM_G128: Final = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=128)
"""Asymmetric, group 128."""
