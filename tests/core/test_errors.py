"""Tests of core/errors.py: one base class, every error reachable from ``core``."""

import inspect

import core
import core.errors
from core.errors import Int4MoEError


def _error_classes() -> dict[str, type[Exception]]:
    return {
        name: obj
        for name, obj in vars(core.errors).items()
        if inspect.isclass(obj) and issubclass(obj, Exception)
    }


def test_every_error_is_exported_from_core() -> None:
    classes = _error_classes()
    assert "NotLoadedError" in classes
    missing = sorted(n for n, c in classes.items() if getattr(core, n, None) is not c)
    assert not missing, f"not importable from core: {missing}"


def test_every_error_is_an_int4moe_error() -> None:
    assert all(issubclass(c, Int4MoEError) for c in _error_classes().values())
