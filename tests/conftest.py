"""Shared fixtures: a seeded generator, device markers that auto-skip, registry snapshot."""

import os
from collections.abc import Iterator

import pytest
import torch

# Without CUDA, Triton kernels run in Triton's CPU interpreter for the whole session,
# whatever TRITON_INTERPRET the shell passed down (an inherited `0` would otherwise turn
# every CPU Triton test into a skip). Triton reads it when a kernel is decorated, so it
# is set here, before any test module imports triton or a kernel: every test file (the
# conformance matrix included) sees the same backends whatever the collection order.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from backends.registry import restore_registry, snapshot_registry


def _has_cuda() -> bool:
    return torch.cuda.is_available()


def _has_xpu() -> bool:
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    del config
    absent = {
        "cuda": None if _has_cuda() else "no CUDA device in this process",
        "xpu": None if _has_xpu() else "no Intel XPU device in this process",
    }
    for item in items:
        for marker, reason in absent.items():
            if reason is not None and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def generator() -> torch.Generator:
    """A seeded CPU generator; pass it explicitly to ``torch.randn``."""
    return torch.Generator().manual_seed(20261202)


@pytest.fixture(autouse=True)
def _registry_snapshot() -> Iterator[None]:
    """Every test sees and leaves the registry as it was."""
    saved = snapshot_registry()
    yield
    restore_registry(saved)
