"""The README stays true: its test command is what CI runs, and its Python examples run."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


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


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_examples_run(index: int) -> None:
    exec(compile(_blocks("python")[index], f"README.md python block {index}", "exec"), {})
