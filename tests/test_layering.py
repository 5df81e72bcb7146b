"""AST check of the dependency direction: core -> {torch, attrs, stdlib}; heavy imports lazy."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE_ALLOWED = {"torch", "attrs", "core", "typing_extensions"}
HEAVY = {"triton", "intel_extension_for_pytorch", "vllm_xpu_kernels"}


def _imports(path: Path, *, top_level_only: bool) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module.split(".")[0])
    return names


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _files("core"), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_only_torch_attrs_stdlib(path: Path) -> None:
    bad = [
        name
        for name in _imports(path, top_level_only=False)
        if name not in CORE_ALLOWED and name not in sys.stdlib_module_names
    ]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize(
    "path", _files("backends"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_backends_import_heavy_packages_lazily(path: Path) -> None:
    if path.name.startswith("_kernels"):  # @triton.jit: module-level import (STYLE.md)
        return
    top = set(_imports(path, top_level_only=True))
    assert not top & HEAVY, (
        f"{path.relative_to(ROOT)} imports {top & HEAVY} at module level"
    )
    assert "modules" not in top


def test_nothing_imports_modules_but_users() -> None:
    for package in ("core", "backends"):
        for path in _files(package):
            assert "modules" not in _imports(path, top_level_only=False), path


def test_layering_sees_files() -> None:
    assert len(_files("core")) >= 10
    assert len(_files("backends")) >= 4
