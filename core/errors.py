"""Exception hierarchy of int4-moe. Imports nothing from the project.

Every error also subclasses the matching builtin, so callers may catch either
``Int4MoEError`` or ``ValueError`` / ``TypeError`` / ``RuntimeError``.
"""


class Int4MoEError(Exception):
    """Base class of every error raised by int4-moe."""


class ConfigError(Int4MoEError, ValueError):
    """A configuration or scheme value is invalid."""


class ShapeError(Int4MoEError, ValueError):
    """A tensor has the wrong rank, size or layout."""


class DTypeError(Int4MoEError, TypeError):
    """A tensor has the wrong dtype."""


class BackendUnavailableError(Int4MoEError, RuntimeError):
    """No backend (or not the requested one) can run this configuration."""


class DeviceError(Int4MoEError, ValueError):
    """Tensors that must share a device do not."""
