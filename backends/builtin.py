"""The built-in backends and their priorities (higher is tried first by `auto`).

Each entry is imported lazily by ``registry.lazy_factory``. A backend whose optional
dependency is missing still registers: its ``supports`` then refuses with the reason.
"""

from typing import Final

from backends.registry import lazy_factory, register_backend

# (name, module, class, priority). Order on each device: XPU fused, Triton W4A16,
# Triton emulation, CPU int4, reference (STYLE.md "Backends: Protocol, registry").
BUILTIN_BACKENDS: Final[tuple[tuple[str, str, str, int], ...]] = (
    ("reference", "backends.reference", "ReferenceBackend", 0),
    ("triton-w4a16", "backends.triton", "TritonW4A16Backend", 30),
    ("triton-emulation", "backends.triton", "TritonEmulationBackend", 20),
    ("xpu-fused", "backends.xpu_fused", "XPUFusedBackend", 40),
    ("cpu-int4", "backends.cpu_int4", "CPUInt4Backend", 10),
)


def register_builtin_backends() -> None:
    """Register every built-in backend (idempotent)."""
    for name, module, cls, priority in BUILTIN_BACKENDS:
        register_backend(name, lazy_factory(module, cls), priority=priority)
