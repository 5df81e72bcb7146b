"""Every kernel launch of the Triton backends compiles for sm_90 under the installed
Triton, on a CPU: ``bench/compile_launches.py`` records the launches ``fused_moe``
makes for real model shapes with the device checks answering as on an H100/H200,
then compiles each with Triton's own compiler and bundled ``ptxas``. The interpreter
tests cannot see this: they never compile, and the Gluon kernel, the inline PTX, TMA
and PDL run only on a GPU (a Gluon builtin renamed between Triton 3.6 and 3.7 failed
exactly there). It runs in a subprocess: the script needs the interpreter off, which
the rest of the suite has on.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backends.triton._launch import gluon_kernels

ROOT = Path(__file__).resolve().parents[2]
KERNELS = (
    "_count_experts_kernel", "_align_blocks_kernel", "_moe_gemm_kernel",
    "_moe_gemm_mma_kernel", "_moe_gemm_wgmma_kernel", "_moe_gemv_kernel", "_moe_gemv_words_kernel",
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


_SWIGLU_PTX = """
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
from backends.triton._kernels import _activate_splits_kernel as kernel
sig = {"part_ptr": "*fp32", "ids_ptr": "*i64", "out_ptr": "*bf16", "F": "i32",
       "alpha": "fp32", "limit": "fp32", "expert_lo": "i32", "expert_hi": "i32",
       "stride_ps": "i32", "stride_pm": "i32", "stride_om": "i32", "ACT": "constexpr",
       "SPLIT": "constexpr", "BLOCK_F": "constexpr", "PDL": "constexpr"}
names = list(sig)
consts = {(names.index("ACT"),): 3, (names.index("SPLIT"),): 1,
          (names.index("BLOCK_F"),): 128, (names.index("PDL"),): False}
ptx = triton.compile(ASTSource(kernel, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("\\n".join(re.findall(r"\\b(?:min|max)\\.[\\w.]*f32", ptx)))
"""


def test_swigluoai_clamps_keep_nan_on_the_gpu() -> None:
    """PTX ``min.f32`` / ``max.f32`` return the operand that is not NaN: the clamp of a
    NaN gate or up would give ``limit`` (the interpreter's numpy keeps NaN, so only
    the compiled code shows it). torch's clamp keeps NaN; so must ``min.NaN.f32``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _SWIGLU_PTX, str(ROOT)],
        capture_output=True, text=True, cwd=ROOT, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ops = done.stdout.split()
    assert len(ops) == 3, ops  # the gate's min, the up's max and min
    assert all(".NaN." in op for op in ops), ops


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
