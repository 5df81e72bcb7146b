"""STYLE.md's hard size budgets, by AST over every Python file of the repository.

A file must not exceed 500 lines, a function body (without its docstring) 60, and a
function takes at most 5 parameters before ``*`` (``self`` and ``cls`` not counted)
except kernels, tests and where torch calls it positionally (``POSITIONAL``).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "backends", "modules", "bench", "tests", "typings")
MAX_FILE_LINES = 500
MAX_BODY_LINES = 60
MAX_POSITIONAL = 5
POSITIONAL = {
    ("tests/backends/fake_xpu_provider.py", "apply"),  # the XPU kernel's contract
    ("modules/backward.py", "forward"),  # torch.autograd.Function.apply's arguments
    ("modules/custom_op.py", "forward_op"),  # the custom op's schema
    ("modules/custom_op.py", "_forward_fake"),  # the same schema, for fake tensors
}
"""Functions whose parameters torch (or an external kernel contract) passes
positionally. Tests (``test_*``) are exempt too: pytest passes their fixtures."""
JIT = ("triton.jit", "gluon.jit")
"""Kernel code: Triton and Gluon functions take their operands positionally."""


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end (0 if none)."""
    body = node.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    end = node.end_lineno or body[-1].lineno
    return end - body[0].lineno + 1


def _positional(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    return len([n for n in names if n not in ("self", "cls")])


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_sizes_stay_within_the_budgets(path: Path) -> None:
    text = path.read_text()
    name = str(path.relative_to(ROOT))
    lines = len(text.splitlines())
    assert lines <= MAX_FILE_LINES, f"{name} has {lines} lines (at most 500)"
    for node in _functions(ast.parse(text, filename=name)):
        body = _body_lines(node)
        assert body <= MAX_BODY_LINES, f"{name}:{node.lineno} {node.name}: {body} lines"
        kernel = any(
            ast.unparse(d).endswith(JIT) or ast.unparse(d) in ("jit", "gluon.jit")
            for d in node.decorator_list
        )
        test = name.startswith("tests/") and node.name.startswith("test_")
        if kernel or test or (name, node.name) in POSITIONAL:
            continue
        count = _positional(node)
        assert count <= MAX_POSITIONAL, (
            f"{name}:{node.lineno} {node.name}: {count} parameters before * "
            "(at most 5: make the rest keyword-only or an attrs object)"
        )


def test_the_budgets_see_a_long_function() -> None:
    """The AST measure counts a body past its docstring, and refuses 61 lines."""
    src = 'def f(a, b, c, d, e, g):\n    """Doc."""\n' + "    x = 1\n" * 61
    (node,) = _functions(ast.parse(src))
    assert _body_lines(node) == 61
    assert _positional(node) == 6
