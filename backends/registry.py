"""Backend registry and pure selection over a DeviceInfo value.

The registry is the only mutable module-level state of the library; change it only
through ``register_backend``. Factories take no arguments and import heavy
dependencies lazily, so a backend costs nothing until it is built.
"""

import importlib
import logging
from collections.abc import Callable

import attrs
import torch

from backends.base import DeviceInfo, MoEBackend
from core.config import MoEConfig
from core.errors import BackendUnavailableError, ConfigError
from core.layout import CANONICAL_LAYOUT as _CANONICAL, WeightLayout
from core.scheme import Int4Scheme

logger = logging.getLogger(__name__)

BackendFactory = Callable[[], MoEBackend]


@attrs.frozen(kw_only=True)
class _Entry:
    factory: BackendFactory
    priority: int


_REGISTRY: dict[str, _Entry] = {}


def register_backend(name: str, factory: BackendFactory, *, priority: int) -> None:
    """Register (or replace) a backend factory under ``name``.

    Args:
        name: registry name, as users pass it to ``Int4MoE(backend=...)``.
        factory: zero-argument callable building the backend.
        priority: higher is tried first by ``select_backend(prefer="auto")``.
    """
    if not name or name == "auto":
        raise ConfigError(
            f"name must be a non-empty string other than `auto`, got {name!r}"
        )
    _REGISTRY[name] = _Entry(factory=factory, priority=priority)


def unregister_backend(name: str) -> None:
    """Remove a backend (tests and plug-ins that want to hide one)."""
    _REGISTRY.pop(name, None)


def snapshot_registry() -> dict[str, object]:
    """An opaque copy of the registry, for ``restore_registry`` (tests)."""
    return dict(_REGISTRY)


def restore_registry(snapshot: dict[str, object]) -> None:
    """Restore a registry taken with ``snapshot_registry``."""
    _REGISTRY.clear()
    for name, entry in snapshot.items():
        assert isinstance(entry, _Entry)
        _REGISTRY[name] = entry


def available_backends() -> tuple[str, ...]:
    """Registered names, highest priority first."""
    return tuple(sorted(_REGISTRY, key=lambda n: (-_REGISTRY[n].priority, n)))


def create_backend(name: str) -> MoEBackend:
    """Build the backend registered as ``name``.

    Raises:
        BackendUnavailableError: if no backend has that name.
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        known = ", ".join(f"`{n}`" for n in available_backends())
        raise BackendUnavailableError(
            f"backend must be `auto` or one of {known}, got {name!r}"
        )
    return entry.factory()


def lazy_factory(module: str, attribute: str) -> BackendFactory:
    """A factory importing ``module`` only when the backend is first built."""

    def build() -> MoEBackend:
        backend_cls: Callable[[], MoEBackend] = getattr(
            importlib.import_module(module), attribute
        )
        return backend_cls()

    return build


def explain_backends(
    config: MoEConfig,
    scheme: Int4Scheme,
    layout: WeightLayout,
    device: DeviceInfo,
    *,
    dtype: torch.dtype,
) -> list[str]:
    """``"name: ok"``, ``"name: ok by name only (<reason>)"`` or ``"name: <reason>"``.

    One line for every registered backend; "by name only" where ``auto`` passes a
    backend by although it could run (``Support.explicit_only``).
    """
    lines = []
    for name in available_backends():
        support = create_backend(name).supports(
            config, scheme, layout, device, dtype=dtype
        )
        if not support.ok:
            verdict = support.reason
        elif support.explicit_only:
            verdict = f"ok by name only ({support.reason})"
        else:
            verdict = "ok"
        lines.append(f"{name}: {verdict}")
    return lines


def is_known_backend(name: str) -> bool:
    """Whether ``name`` is `auto` or a registered backend."""
    return name == "auto" or name in _REGISTRY


def check_backend_name(
    name: str,
    config: MoEConfig,
    scheme: Int4Scheme,
    device: DeviceInfo,
    *,
    dtype: torch.dtype,
) -> None:
    """Raise unless ``name`` is `auto` or registered, listing each backend's verdict.

    Raises:
        BackendUnavailableError: for an unknown name.
    """
    if is_known_backend(name):
        return
    verdicts = explain_backends(config, scheme, _CANONICAL, device, dtype=dtype)
    raise BackendUnavailableError(
        f"backend must be `auto` or one of the registered backends, got {name!r}. "
        f"On {device.type} with {dtype}: " + "; ".join(verdicts)
    )


def select_backend(
    config: MoEConfig,
    scheme: Int4Scheme,
    layout: WeightLayout,
    device: DeviceInfo,
    *,
    dtype: torch.dtype,
    prefer: str = "auto",
) -> MoEBackend:
    """Choose the backend for a layer.

    An explicit ``prefer`` must support the request, or this raises with its reason.
    ``"auto"`` walks the registry by priority and returns the first that supports it.

    Raises:
        BackendUnavailableError: naming each backend tried and why it refused.
    """
    names = available_backends() if prefer == "auto" else (prefer,)
    reasons: list[str] = []
    for name in names:
        backend = create_backend(name)
        support = backend.supports(config, scheme, layout, device, dtype=dtype)
        if support.ok and not (support.explicit_only and prefer == "auto"):
            return backend
        logger.debug("backend %s refused: %s", name, support.reason)
        reasons.append(f"{name}: {support.reason}")
    who = (
        "no registered backend can"
        if prefer == "auto"
        else f"backend {prefer!r} cannot"
    )
    raise BackendUnavailableError(
        f"{who} run {scheme.name} with {dtype} on {device.type}: " + "; ".join(reasons)
    )
