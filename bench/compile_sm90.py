"""Offline sm_90 compile of the decode kernels: registers and SASS, no GPU needed.

``python bench/compile_sm90.py [mma | wgmma [x]]`` compiles ``_moe_gemv_kernel`` (bytes),
``_moe_gemv_words_kernel`` and ``_moe_gemv_pairs_kernel`` with Triton's own compiler
for an H100/H200 target (``GPUTarget("cuda", 90, 32)``; Triton's wheel bundles
``ptxas``, ``cuobjdump`` and ``nvdisasm``), with the meta-parameters of a Mixtral-8x7B
launch (symmetric group 128, bf16 activations, every size and stride divisible by
16), gated (w13) and not (w2), the paired kernel also with TMA reads
(``GemvTiles.tma``); with ``mma`` instead the Gluon decode GEMM ``_moe_gemm_mma_kernel``
(128 x 128 tiles, 4 warps, at the row blocks and stages of ``MMA_VARIANTS``); with
``wgmma`` the warpgroup kernel ``_moe_gemm_wgmma_kernel`` (64 x 128 tiles, 4 warps,
each MMA waited for, at ``WGMMA_VARIANTS``; ``wgmma x``: its rings with the input
through them, ``GemmTiles.x_shared``). It prints
per variant the registers and stack bytes (spills) a
thread, the shared memory, the SASS instructions of the K loop's body and its most frequent
opcodes (the loop: the longest conditional backward branch; TMA waits spin in
out-of-line blocks that jump back unconditionally). What it numbers is what the GPU
runs, not
how fast: use it to iterate on a kernel's instruction count and register pressure
before spending device time.
"""

# ruff: noqa: T201, TID253
# A command-line script: print is its output; triton is what it runs.

import collections
import inspect
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, CompiledKernel
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.triton._kernels_gemv import _moe_gemv_kernel
from backends.triton._kernels_gemv_pairs import _moe_gemv_pairs_kernel
from backends.triton._kernels_gemv_words import _moe_gemv_words_kernel
from backends.triton._kernels_mma import _moe_gemm_mma_kernel
from backends.triton._kernels_wgmma import _moe_gemm_wgmma_kernel

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
POINTERS = {
    "a_ptr": "*bf16", "w_ptr": "*i32", "scale_ptr": "*bf16", "zero_ptr": "*bf16",
    "c_ptr": "*bf16", "ids_ptr": "*i32", "topk_weights_ptr": "*fp32", "bias_ptr": "*i32",
    "b_ptr": "*u8",
}  # fmt: skip
MMA_POINTERS = {
    **POINTERS, "bias_ptr": "*bf16", "sorted_ptr": "*i32", "block_expert_ptr": "*i32",
    "block_rows_ptr": "*i32",
}  # fmt: skip
Kernel = triton.JITFunction[Callable[..., object]]
VARIANTS: list[tuple[str, Kernel, int, bool, int, int | None]] = [
    # (label, kernel, block_n, prefetch, warps, TMA stages or None)
    ("bytes 16x512 w4", _moe_gemv_kernel, 16, False, 4, None),
    ("words 8x512", _moe_gemv_words_kernel, 8, False, 1, None),
    ("words 8x512 ahead", _moe_gemv_words_kernel, 8, True, 1, None),
    ("paired 8x512 ahead", _moe_gemv_pairs_kernel, 8, True, 1, None),
    ("paired 16x512", _moe_gemv_pairs_kernel, 16, False, 1, None),
    ("paired 8x512 tma 3", _moe_gemv_pairs_kernel, 8, False, 1, 3),
    ("paired 16x512 tma 3", _moe_gemv_pairs_kernel, 16, False, 1, 3),
    ("paired 8x512 tma 3 int", _moe_gemv_pairs_kernel, 8, False, 1, 3),
    ("paired 16x512 tma 3 int", _moe_gemv_pairs_kernel, 16, False, 1, 3),
    ("paired 8x512 tma 3 xahead int", _moe_gemv_pairs_kernel, 8, False, 1, 3),
    ("paired 16x512 tma 3 xahead int", _moe_gemv_pairs_kernel, 16, False, 1, 3),
]
GROUP = 128
MMA_VARIANTS = [  # (block_m, stages, group, copy_steps): the table's, then others measured
    (8, 2, GROUP, 2), (16, 3, GROUP, 1), (8, 1, GROUP, 1), (16, 1, GROUP, 1),
    (8, 3, GROUP, 1), (16, 1, 32, 1), (16, 2, GROUP, 2), (8, 2, GROUP, 4),
]  # fmt: skip
WGMMA_VARIANTS = [  # (block_m, stages, group, copy_steps): the table's, then rings
    (32, 1, GROUP, 1), (32, 2, GROUP, 1), (32, 3, GROUP, 1), (32, 4, GROUP, 1),
    (32, 2, GROUP, 2), (32, 3, GROUP, 2), (32, 2, GROUP, 4), (16, 2, GROUP, 2),
    (16, 3, GROUP, 1), (32, 3, 32, 1),
]  # fmt: skip


def _signature(
    params: list[str],
    constants: Mapping[str, object],
    pointers: dict[str, str],
    desc: str | None = None,
) -> tuple[dict[str, str], dict[tuple[int, ...], list[list[object]]]]:
    """Triton types of a kernel's parameters, and 16-divisibility of the non-floats.

    ``desc``: the type of ``w_desc`` (a tensor descriptor), if it is a parameter.
    """
    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    for i, name in enumerate(params):
        if name in constants:
            signature[name] = "constexpr"
        elif name == "w_desc" and desc is not None:
            signature[name] = desc
        else:
            signature[name] = pointers.get(
                name, "fp32" if name in ("alpha", "limit") else "i32"
            )
            if signature[name] != "fp32":
                attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, attrs


def compile_gemv(
    kernel: Kernel,
    *,
    gated: bool,
    block_n: int,
    prefetch: bool,
    warps: int,
    tma: int | None = None,
    int_dot: bool = False,
    x_ahead: bool = False,
) -> CompiledKernel:
    """The kernel compiled for sm_90 with 512-column steps.

    ``tma``: the paired kernel's TMA reads, pipelined this many stages deep;
    ``int_dot``: its integer products (``GemvTiles.int_dot``); ``x_ahead``: its
    inputs, scales and zero points a step ahead (``GemvTiles.inputs_ahead``).
    """
    params = list(inspect.signature(kernel.fn).parameters)
    constants = {
        "A_DIV": 2 if gated else 1, "GROUP": GROUP, "HAS_ZP": False, "GATED": gated,
        "ACT": 0, "WEIGHT_ROWS": False, "HAS_BIAS": False, "BLOCK_N": block_n,
        "BLOCK_K": 512, "EVEN": True, "PREFETCH": prefetch, "LOOP_STAGES": tma,
        "ASM": True, "NG": 4, "PDL_WAIT": False, "PDL_NEXT": False,
        "TMA": tma is not None, "INT_DOT": int_dot, "X_AHEAD": x_ahead,
    }  # fmt: skip
    if tma is None:
        constants["w_desc"] = None
    desc = f"tensordesc<i32[{block_n}, 64]>"  # _words_descriptor's block, 512 codes
    signature, attrs = _signature(params, constants, POINTERS, desc)
    consts: dict[tuple[int, ...], object] = {
        (params.index(k),): v for k, v in constants.items() if k in params
    }
    source = ASTSource(kernel, signature, consts, attrs)
    return triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
    )


def compile_mma(
    *,
    gated: bool,
    block_m: int,
    stages: int,
    group: int,
    copy_steps: int = 1,
    x_shared: bool = False,
    pdl: bool = False,
    wgmma: bool = False,
) -> CompiledKernel:
    """The Gluon decode GEMM compiled for sm_90: 128 x 128 tiles, 4 warps, K % 32 == 0.

    ``wgmma``: the warpgroup kernel instead, 64 x 128 tiles on 4 warps (the table's),
    each MMA waited for; ``x_shared`` there: the input through the ring (``X_RING``).
    """
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel: Kernel = _moe_gemm_wgmma_kernel if wgmma else _moe_gemm_mma_kernel
    params = list(inspect.signature(kernel.fn).parameters)
    constants = {
        "A_DIV": 2 if gated else 1, "GROUP": group, "HAS_ZP": False, "GATED": gated,
        "ACT": 0, "WEIGHT_ROWS": False, "HAS_BIAS": False,
        "BLOCK_N": 64 if wgmma else 128, "BLOCK_M": block_m, "CT": gl.bfloat16,
        "POST_SCALE": group >= 128, "WARPS": 4, "STAGES": stages,
        "COPY_STEPS": copy_steps, "K32": True, "PDL": pdl,
    }  # fmt: skip
    constants["LOGICAL_OUT"] = False
    wg = {"ASYNC": False, "X_RING": x_shared}
    constants |= wg if wgmma else {"X_SHARED": x_shared}
    signature, attrs = _signature(params, constants, MMA_POINTERS)
    source = GluonASTSource(kernel, signature, constants, attrs)
    return triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}
    )


def describe(compiled: CompiledKernel) -> str:
    """Registers, the K loop's SASS count and its most frequent opcodes."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        binary = compiled.asm["cubin"]
        assert isinstance(binary, bytes)  # the binary stage; the others are text
        cubin.write_bytes(binary)
        usage = subprocess.run(
            [BIN / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True,
            check=True,
        ).stdout  # fmt: skip
        sass = subprocess.run(
            [BIN / "nvdisasm", "-c", cubin], capture_output=True, text=True, check=True
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    lines = sass.splitlines()
    body: list[str] = []
    for end, line in enumerate(lines):  # the longest conditional backward branch's body
        branch = re.search(r"@!?U?P\w+\s+BRA `\((\.L_x_\d+)\)", line)
        if branch is None:
            continue
        starts = [
            i for i, text in enumerate(lines[:end]) if text.startswith(branch[1] + ":")
        ]
        if starts and end - starts[0] > len(body):
            body = [
                t
                for t in lines[starts[0] : end + 1]
                if re.match(r"\s+/\*[0-9a-f]+\*/", t)
            ]
    ops = collections.Counter(
        m[1]
        for t in body
        if (m := re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]+)", t))
    )
    common = " ".join(f"{op}:{n}" for op, n in ops.most_common(8))
    spill = stack[1] if stack else "?"
    head = f"regs {regs[1] if regs else '?':>3} stack {spill:>3}"
    head += f" smem {compiled.metadata.shared:>5}"
    return f"{head} loop {len(body):4d} SASS  {common}"


def main() -> None:
    """One line per variant and projection."""
    if sys.argv[1:2] in (["mma"], ["wgmma"]):
        wgmma = sys.argv[1] == "wgmma"
        x_ring = wgmma and sys.argv[2:3] == ["x"]  # wgmma x: the input's ring
        for block_m, stages, group, copy in WGMMA_VARIANTS if wgmma else MMA_VARIANTS:
            if x_ring and stages == 1:
                continue
            for gated in (True, False):
                compiled = compile_mma(
                    gated=gated, block_m=block_m, stages=stages, group=group,
                    copy_steps=copy, wgmma=wgmma, x_shared=x_ring,
                )  # fmt: skip
                name = (
                    f"{sys.argv[1]}{' x' if x_ring else ''} bm{block_m} "
                    f"st{stages}x{copy} g{group} {'w13 gated' if gated else 'w2'}"
                )
                print(f"{name:30s} {describe(compiled)}", flush=True)
        return
    for label, kernel, block_n, prefetch, warps, tma in VARIANTS:
        for gated in (True, False):
            compiled = compile_gemv(
                kernel, gated=gated, block_n=block_n, prefetch=prefetch, warps=warps,
                tma=tma, int_dot=label.endswith(" int"), x_ahead="xahead" in label,
            )  # fmt: skip
            name = f"{label} {'w13 gated' if gated else 'w2'}"
            print(f"{name:30s} {describe(compiled)}", flush=True)


if __name__ == "__main__":
    main()
