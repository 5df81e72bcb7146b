"""Every kernel launch of the Triton backends compiles for sm_90 under the installed
Triton, on a CPU: ``bench/compile_launches.py`` records the launches ``fused_moe``
makes for real model shapes with the device checks answering as on an H100/H200,
then compiles each with Triton's own compiler and bundled ``ptxas``. The interpreter
tests cannot see this: they never compile, and the Gluon kernel, the inline PTX, TMA
and PDL run only on a GPU (a Gluon builtin renamed between Triton 3.6 and 3.7 failed
exactly there). It runs in a subprocess: the script needs the interpreter off, which
the rest of the suite has on.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from backends.triton._launch import gluon_kernels

ROOT = Path(__file__).resolve().parents[2]
KERNELS = (
    "_count_experts_kernel", "_align_blocks_kernel", "_moe_gemm_kernel",
    "_moe_gemm_mma_kernel", "_moe_gemv_kernel", "_moe_gemv_words_kernel",
    "_moe_gemv_pairs_kernel", "_moe_gemv16_kernel", "_reduce_topk_kernel",
    "_activate_splits_kernel", "_dequant_kernel", "_route_topk_kernel",
)  # fmt: skip
"""Every kernel of backends/triton: each must be among the launches compiled."""


def test_the_kernel_list_is_every_kernel() -> None:
    found = {
        match
        for path in (ROOT / "backends" / "triton").glob("_kernels*.py")
        for match in re.findall(r"^def (_\w+_kernel)\(", path.read_text(), re.M)
    }
    assert found == set(KERNELS)


def test_every_launch_compiles_for_sm90() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compile_launches.py")],
        capture_output=True, text=True, cwd=ROOT, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    compiled = int(last.split()[0])
    assert last.endswith("0 failed"), last
    assert compiled >= 80, last  # the cases reach every kernel in several forms
    for kernel in KERNELS:
        assert f"ok {kernel} " in done.stdout, kernel


def test_without_the_gluon_kernel_the_word_kernel_takes_its_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before Triton 3.6 the Gluon kernel does not import: ``gluon_kernels`` says so
    (and ``mma_target`` with it) instead of the first decode GEMM raising."""
    gluon_kernels.cache_clear()
    try:
        assert gluon_kernels()
        monkeypatch.setitem(sys.modules, "backends.triton._kernels_mma", None)
        gluon_kernels.cache_clear()
        assert not gluon_kernels()
    finally:
        monkeypatch.undo()
        gluon_kernels.cache_clear()
    assert gluon_kernels()
