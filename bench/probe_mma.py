"""The Gluon MMA GEMM (``GemmTiles.mma``) against the table's GEMM, side by side.

Run on the GPU from the repository root: ``python bench/probe_mma.py [model ...]``
(``PROBE_M=16,64`` for other sizes). For each model shape and M (default 4, 16, 64
and 256) it times triton-w4a16 as the table runs it (``auto``: the GEMV where
chosen), its ``gemm`` path with the table's tiles (``pick_tiles``), and the ``gemm``
path run by the Gluon kernel at the row blocks and (column tile, warps) of
``SHAPES`` (``PROBE_SET=2``: ``SHAPES_2`` and a doubled w2 split; ``PROBE_SET=3``:
``num_stages`` 1-4; ``PROBE_SET=5``: ``COPY_GROUPS``; ``PROBE_SET=6``: 8-row blocks,
a 2-stage ring of 2-step copy groups, the w2 split as the table's, doubled and
halved; ``PROBE_SET=7``: 64-column tiles of 2 or 4 warps, 2- or 4-step copy groups;
``PROBE_SET=8``: the table's tiles with w13's K split 1, 2 or 4 ways and the w2 split
as the table's, doubled and quadrupled; ``PROBE_SET=9``: both row-block forms of the
Gluon kernel, each with w13 split 1, 2 or 4 ways and the w2 split as the table's or
doubled; ``PROBE_SET=11``: the activation through the ring, ``GemmTiles.x_shared``,
in 8-, 16- and 32-row blocks; ``PROBE_SET=12``: the table's splits in 16-row blocks
with ``x_shared``; ``PROBE_SET=13``: the table's tiles with ``MoETiles.pdl`` as the
table has it and flipped, each twice; the sweep that chose the table's form ran
``bench/probe_pdl.py`` of commit f3ab058, since removed; ``PROBE_SET=14``: 64-column
tiles with the input through the ring in 16- and 32-row blocks, w13 unsplit, the w2
split as the table's and halved; ``PROBE_SET=15``: the table's form with w13 split 1-3
and w2 split 2-8 ways, odd splits included, for the waves of few busy experts;
``PROBE_SET=16``: the warpgroup-MMA kernel, ``GemmTiles.wgmma``, in 16- and 32-row
blocks (32 and 64 where the table's blocks are larger) of 64 x 128 on 4 warps and
128 x 128 on 8, w13 unsplit, the w2 split as
the table's and halved; ``WGMMA_SYNC=1``: each MMA waited for before the next
dequantization); ``PROBE_SET=17``: the warpgroup kernel in 16- and 32-row blocks of
64 x 128 on 4 warps and 128 x 128 on 8, each async and sync (a key ending in
``sync``) in the same process, the w2 split as the table's; ``PROBE_SET=18``: the
warpgroup kernel (64 x 128, 4 warps, sync) in 32-row blocks with its words one step
ahead in registers or through a cp.async ring of 2-4 stages of one step or 2-3 of
2-step groups (``WGMMA_RINGS``; three of them in 16-row blocks), the w2 split and PDL
as the table's; ``PROBE_SET=19``: the warpgroup kernel with 2- and 4-step copy groups
(``WGMMA_GROUPS``); ``PROBE_SET=20``: the table's warpgroup forms (both decode forms
and ``wgmma_tiles``) where the table does not take them, against the table;
``PROBE_SET=21``: the warpgroup kernel in 16-row blocks of 2 or 3 stages
(``WGMMA_SMALL_FORMS``) at 9-16 pairs an expert; ``PROBE_SET=22``: the warpgroup
kernel in 32-row blocks of 3 or 4 stages with the w2 split 1, 2 or 4 ways;
``PROBE_SET=23``: its 32-row gated w13 of 2 or 3 stages, launched as the library does
and with ``maxnreg=128`` (keys with ``nreg128``; ``_cap_registers``);
``PROBE_SET=24``: the warpgroup kernel's w2 in 128 x 128 tiles of 8 warps;
``PROBE_SET=25``: the warpgroup kernel's input through its ring in logical K order
(``x_shared``), w2 alone and both GEMMs, at several ring depths;
``PROBE_ROUTES=n``: each
model and M on n routing draws;
under CUDA-graph replay at M <= 64 (every M with ``PROBE_GRAPH=1``) and eagerly
above, each output
checked against the float32 reference first; ms and multiples of the floor.
``python bench/probe_mma.py host``: host time of an eager Qwen3-30B-A3B M = 64
forward and a cProfile of it, the table's tiles against the Triton word GEMM
(``host16``: at M = 16, triton-w4a16 as the table runs it against triton-emulation).
``ncu --profile-from-start off ... python bench/probe_mma.py ncu``: one forward of each
``NCU_CELLS`` cell (the environment's ``model:M,model:M`` if set) inside
``torch.cuda.profiler`` start / stop, for Nsight Compute.

The logs in bench/sweeps/probe_mma*_h200.log were written as the kernel and the table
evolved: in probe_mma1 and probe_mma2 the table's decode row was still the Triton word
GEMM; from probe_mma3 on it is the Gluon kernel (so ``table gemm`` is the Gluon kernel).
"""

# ruff: noqa: D103, T201
# A GPU script, not library code: print is its output.

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    MODELS,
    int4_layer,
    probe_inputs,
    probe_models,
    probe_variant,
    route,
)
from probe_mma_sets import variants, words

from backends.triton import _launch
from backends.triton._fused import fused_moe, pick_tiles
from backends.triton._launch import ExpertMatrix
from backends.triton._tiles import MoETiles


def _host_profile(label: str, fn: Callable[[], torch.Tensor], top: int) -> None:
    """Print ``fn``'s host time a call (200 calls after 20 warm-ups) and a cProfile."""
    import cProfile
    import pstats
    import time

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        fn()
    host_us = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    print(f"{label}: host {host_us:.1f} us a forward", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def host(name: str, m: int) -> None:
    """Eager forward time and a profile of the host side, table tiles and mma."""
    e, k, d, _ = MODELS[name]
    cfg, _, w13, w2 = int4_layer(name)
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    r = route(m, e, k)
    default = pick_tiles(m * k, w13, w2)
    words_table = MoETiles(
        block_m=16, w13=words(default.w13, mma=False, block_n=64),
        w2=words(default.w2, mma=False, block_n=64),
    )  # fmt: skip
    for label, tiles in (("table", default), ("words", words_table)):

        def fn(t: MoETiles = tiles) -> torch.Tensor:
            return fused_moe(x, w13, w2, r, cfg, tiles=t, path="gemm")

        _host_profile(f"{name} M={m} {label} ({tiles.w13.mma})", fn, 12)


def host16() -> None:
    """Eager host time and cProfile at Qwen3-30B-A3B M = 16: w4a16 against emulation."""
    from bench_gpu import dense_bf16

    e, k, d, _ = MODELS["qwen3-30b-a3b"]
    cfg, q, w13, w2 = int4_layer("qwen3-30b-a3b")
    b13, b2 = dense_bf16(q)
    d13, d2 = ExpertMatrix(data=b13), ExpertMatrix(data=b2)
    x = torch.randn(16, d, device="cuda").to(torch.bfloat16)
    r = route(16, e, k)
    for label, pair in (("w4a16", (w13, w2)), ("emulation", (d13, d2))):

        def fn(p: tuple[ExpertMatrix, ExpertMatrix] = pair) -> torch.Tensor:
            return fused_moe(x, p[0], p[1], r, cfg)

        _host_profile(f"qwen3-30b-a3b M=16 {label}", fn, 15)


NCU_CELLS = (("deepseek-v3", 64), ("mixtral-8x7b", 16), ("mixtral-8x7b", 64),
             ("qwen3-235b-a22b", 64), ("deepseek-v3", 1))  # fmt: skip
"""Model and M of the forwards ``ncu`` mode profiles (the table's path and tiles)."""


def _ncu_cells() -> tuple[tuple[str, int], ...]:
    """``NCU_CELLS`` as ``model:M,model:M`` from the environment, else the default."""
    given = os.environ.get("NCU_CELLS")
    if not given:
        return NCU_CELLS
    cells = [item.split(":") for item in given.split(",")]
    return tuple((name, int(m)) for name, m in cells)


def ncu() -> None:
    for name, m in _ncu_cells():
        e, k, d, _ = MODELS[name]
        cfg, q, w13, w2 = int4_layer(name)
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        fused_moe(x, w13, w2, r, cfg)
        torch.cuda.synchronize()
        print(f"=== {name} M={m} tiles {pick_tiles(m * k, w13, w2)}", flush=True)
        torch.cuda.profiler.start()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        fused_moe(x, w13, w2, r, cfg)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        del q, w13, w2
        torch.cuda.empty_cache()


_CAP = {"on": False}
"""Whether the warpgroup kernel's gated launches take ``maxnreg=128`` (PROBE_SET=23)."""


def _cap_registers() -> None:
    """Wrap the warpgroup kernel so gated launches take ``maxnreg=128`` while ``_CAP``."""
    from backends.triton import _kernels_wgmma

    kernel = _kernels_wgmma._moe_gemm_wgmma_kernel

    class Capped:
        def __getitem__(self, grid: Any) -> Callable[..., Any]:
            def launch(*args: Any, **kwargs: Any) -> Any:
                if _CAP["on"] and kwargs.get("GATED"):
                    kwargs["maxnreg"] = 128
                return kernel[grid](*args, **kwargs)

            return launch

    _kernels_wgmma._moe_gemm_wgmma_kernel = Capped()  # type: ignore[assignment]


LIBRARY_WGMMA_ASYNC = _launch.WGMMA_ASYNC
"""The warpgroup kernel's form as the library runs it (the probes set it per variant)."""


def cell(name: str, m: int, layer: tuple[Any, ...], bw: float, tag: str) -> None:
    """Time every variant of one model and M on one routing draw (``tag`` its label)."""
    k = MODELS[name][1]
    cfg, _, w13, w2 = layer
    x, r, fl, ref = probe_inputs(name, m, layer, bw)
    default = pick_tiles(m * k, w13, w2)
    always_sync = os.environ.get("WGMMA_SYNC") == "1"  # PROBE_SET=16
    for key, tiles in variants(default).items():
        form = LIBRARY_WGMMA_ASYNC  # the table's own rows as the library runs them
        if key.startswith("wgmma") and os.environ.get("PROBE_SET") in ("16", "17"):
            form = not (key.endswith(" sync") or always_sync)  # as the key says
        elif key.endswith(" sync"):  # PROBE_SET=18 and 19: each MMA waited for
            form = False

        def run(
            t: MoETiles | None = tiles,
            *,
            overlap: bool = form,
            cap: bool = "nreg" in key,
        ) -> torch.Tensor:
            _launch.WGMMA_ASYNC = overlap  # read when launched
            _CAP["on"] = cap
            return fused_moe(
                x, w13, w2, r, cfg, tiles=t, path="auto" if t is None else "gemm"
            )  # fmt: skip

        replay = m <= 64 or os.environ.get("PROBE_GRAPH") == "1"
        probe_variant(
            f"{name:15s} M={m:4d}{tag}", key, run, ref, fl, replay=replay, width=28
        )


def main() -> None:
    if sys.argv[1:2] == ["host"]:
        host("qwen3-30b-a3b", 64)
        return
    if sys.argv[1:2] == ["host16"]:
        host16()
        return
    if sys.argv[1:2] == ["ncu"]:
        ncu()
        return
    if os.environ.get("PROBE_SET") == "23":
        _cap_registers()
    probe_models(cell, "4,16,64,256")


if __name__ == "__main__":
    main()
