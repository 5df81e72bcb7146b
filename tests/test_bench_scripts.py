"""The GPU scripts under bench/ import on a CPU: every name they take from the library
still exists, so a refactor cannot leave them broken until the next GPU session.

They run only on a GPU (their ``main``); importing one defines its functions and
constants and allocates nothing. One subprocess imports them all, each as its own
module with bench/ on the path, as ``python bench/x.py`` would.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))

_IMPORT_ALL = """
import importlib, json, sys, traceback
sys.path[:0] = [sys.argv[1], sys.argv[2]]
failed = {}
for name in json.loads(sys.argv[3]):
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""


def test_every_bench_script_imports() -> None:
    assert len(SCRIPTS) >= 10  # the glob found the scripts
    env = os.environ | {"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, str(ROOT / "bench"), str(ROOT),
         json.dumps(SCRIPTS)],
        capture_output=True, text=True, env=env, cwd=ROOT / "bench", timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"bench/{n}.py:\n{tb}" for n, tb in failed.items())
