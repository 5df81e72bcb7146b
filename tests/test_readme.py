"""The README stays true: its test command is what CI runs, and its Python examples run."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _quickstart_blocks() -> list[str]:
    """Python blocks of the Quickstart (the others need files or downloads)."""
    section = README.split("## Quickstart")[1].split("\n## ")[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_exactly_two_fresh_machine_commands() -> None:
    section = README.split("## Two commands for a fresh machine")[1].split("\n## ")[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(commands) == 2
    assert all(c.count("\n") == 1 for c in commands), "each command is one line"
    assert "int4-moe demo" in commands[0]


def test_ci_runs_the_readme_test_command() -> None:
    section = README.split("## Two commands for a fresh machine")[1]
    test_command = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[1].strip()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


@pytest.mark.parametrize("index", range(len(_quickstart_blocks())))
def test_quickstart_runs(index: int) -> None:
    exec(
        compile(_quickstart_blocks()[index], f"README.md quickstart {index}", "exec"),
        {},
    )


def test_quickstart_exists() -> None:
    assert _quickstart_blocks()
