"""Exception hierarchy of int4-moe. Imports nothing from the project.

Every error also subclasses the matching builtin, so callers may catch either
``Int4MoEError`` or ``ValueError`` / ``TypeError`` / ``RuntimeError``.
"""


class Int4MoEError(Exception):
    """Base class of every error raised by int4-moe."""


class ConfigError(Int4MoEError, ValueError):
    """A configuration or scheme value is invalid."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration or scheme value has the wrong Python type (``32.0`` for an int).

    Also a ``TypeError``, the builtin for a wrong type, and a ``ConfigError``.
    """


class ShapeError(Int4MoEError, ValueError):
    """A tensor has the wrong rank, size or layout, or values outside their range.

    Out-of-range values are NaN/inf where finite weights are needed and int4 codes
    outside ``0..15``.
    """


class DTypeError(Int4MoEError, TypeError):
    """A tensor has the wrong dtype."""


class BackendUnavailableError(Int4MoEError, RuntimeError):
    """No backend (or not the requested one) can run this configuration."""


class DeviceError(Int4MoEError, ValueError):
    """Tensors that must share a device do not."""


class NotLoadedError(Int4MoEError, RuntimeError):
    """A module's buffers were never filled (``Int4MoE(config)`` without a load)."""


class PreparedTypeError(Int4MoEError, TypeError):
    """A backend was handed the prepared form of another backend (``check_prepared``)."""


class UnsupportedError(Int4MoEError, RuntimeError):
    """An operation int4-moe does not implement (a second derivative of the layer)."""
