"""The public API under a consumer's ``mypy --strict`` with this project vendored.

A project that puts this repository (and its ``typings/``) on ``MYPYPATH`` instead of
installing it gets our files checked as its own, without our ``pyproject.toml``: the
kernel files carry their relaxations inline (``# mypy:`` comments), so the check of
``check_public_api.py`` from another folder, with no configuration, finds nothing.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_strict_mypy_of_a_vendoring_project_is_clean(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    user = tmp_path / "user_code.py"
    shutil.copy(ROOT / "tests" / "typing" / "check_public_api.py", user)
    env = {**os.environ, "MYPYPATH": f"{ROOT}{os.pathsep}{ROOT / 'typings'}"}
    run = subprocess.run(  # our own interpreter on our own file
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            os.devnull,
            "--config-file",
            "",
            user.name,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
