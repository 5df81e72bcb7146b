"""Would a K-split w13 GEMM beat the decode GEMV at a handful of pairs? Its parts, timed.

Run on the GPU from the repository root: ``python bench/probe_split13.py [model ...]``
(``PROBE_M=1,4`` by default). For each model shape and M, CUDA-graph replay (L2
flushed before each, median of 50, as ``bench_gpu.py`` times), microseconds:

- ``layer``: triton-w4a16 as the table runs it (the GEMV where ``use_gemv``);
- ``gemv13`` / ``gemv2``: the table's w13 and w2 GEMVs alone;
- ``align``: the 8-row block alignment alone;
- ``g13 s<S> <N>x<W>``: the Gluon GEMM on w13 as one ungated matrix of ``2F`` rows
  (gate and up rows alike), K split ``S`` ways into float32 partials, column tiles of
  ``N`` rows on ``W`` warps, 8-row blocks, 2-stage ring of 2-step copy groups (the
  alignment computed once, outside the graph);
- ``g2``: the table's w2 GEMM alone (8-row blocks, its split), and ``g2 x2`` doubled;
- ``topk``: the top-k sum alone.

What a split-w13 layer could take is about ``align + g13 + g2 + topk`` less three
replays of an empty graph (each part above pays one).
"""

# ruff: noqa: D103, T201
# A GPU script, not library code: print is its output, and each closure is replayed
# inside the loop iteration that defines it.

import os
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gpu import MODELS, copy_bandwidth, floor_ms, int4_layer, replay_graph, route

from backends.triton._align import BlockAlignment, align_pairs_to_blocks
from backends.triton._configs import choose_tiles
from backends.triton._configs_mma import MMA_TILES
from backends.triton._fused import (
    fused_moe,
    gemv_w2_split,
    pick_gemv_tiles,
)
from backends.triton._launch import ExpertMatrix, buffer_dtype, launch_gemm
from backends.triton._launch_gemv import launch_gemv
from backends.triton._launch_reduce import reduce_topk
from backends.triton._tiles import GemmTiles
from core.config import MoEConfig
from core.quantize import dequantize_expert
from core.routing import Routing
from core.weights import QuantizedExpertWeights

SPLITS = (1, 2, 4, 8)
SHAPES = ((128, 4), (64, 2))


def check(
    out: torch.Tensor,
    x_n: torch.Tensor,
    q: QuantizedExpertWeights,
    r: Routing,
    what: str,
) -> None:
    """Raise unless ``out`` (pairs, 2F) is each pair's w13 product to 1e-2."""
    ids = r.topk_ids.reshape(-1).tolist()
    ref = torch.stack(
        [x_n[i].float() @ dequantize_expert(q, ex)[0].T for i, ex in enumerate(ids)]
    )
    err = float((out - ref).norm() / ref.norm())
    if not err < 1e-2:
        raise AssertionError(f"{what}: relative L2 error {err:.2e}")


def main() -> None:
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    tiny = torch.zeros(1, device="cuda")
    print(f"empty graph {replay_graph(lambda: tiny.add_(1.0))[0] * 1e3:.1f} us")
    names = sys.argv[1:] or list(MODELS)
    ms = [int(v) for v in os.environ.get("PROBE_M", "1,4").split(",")]
    for name in names:
        e, k, d, f = MODELS[name]
        config, q, w13, w2 = int4_layer(name)
        for m in ms:
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            active = int(torch.unique(r.topk_ids).numel())
            fns = _fns(x, r, config, q=q, w13=w13, w2=w2)
            fl = floor_ms(m, active, (e, k, d, f), bw, 1e30)
            print(f"{name} M={m} active {active} floor {fl * 1e3:.1f} us", flush=True)
            for key, fn in fns.items():
                print(f"  {key:18s} {replay_graph(fn)[0] * 1e3:8.1f} us", flush=True)
        del q, w13, w2
        torch.cuda.empty_cache()


def _fns(
    x: torch.Tensor,
    r: Routing,
    config: MoEConfig,
    *,
    q: QuantizedExpertWeights,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
) -> dict[str, Callable[[], object]]:
    """The layer, the GEMV's launches, the alignment and the GEMMs' split forms."""
    e, k = config.num_experts, config.top_k
    d, f = config.hidden_size, config.intermediate_size
    n = x.shape[0] * k
    dt = buffer_dtype(x.dtype)
    gt = pick_gemv_tiles(n, w13)
    gt2 = gt.w2_tiles or gt
    gsplit = gemv_w2_split(gt, n, d, f)
    inter = torch.randn(n, f, device="cuda").to(dt)
    gpart = torch.empty(
        gsplit, n, d, device="cuda", dtype=torch.float32 if gsplit > 1 else dt
    )
    table = choose_tiles(
        num_pairs=n, num_experts=e, hidden_size=d, intermediate_size=f, mma=True
    )
    align = align_pairs_to_blocks(r.topk_ids, e, block_m=table.block_m)

    def gemv13() -> None:
        launch_gemv(x, w13, inter, n=f, routing=r, config=config, gated=True, tiles=gt)

    def gemv2() -> None:
        launch_gemv(
            inter, w2, gpart, n=d, routing=r, config=config, gated=False,
            tiles=gt2, split=gsplit,
        )  # fmt: skip

    fns: dict[str, Callable[[], object]] = {
        "layer": lambda: fused_moe(x, w13, w2, r, config),
        "gemv13": gemv13,
        "gemv2": gemv2,
        "align": lambda: align_pairs_to_blocks(r.topk_ids, e, block_m=table.block_m),
    }
    fns |= _gemm13_fns(
        x.repeat_interleave(k, dim=0), r, config, q=q, w13=w13, align=align
    )
    fns |= _gemm2_fns(inter, r, config, w2=w2, align=align, table_w2=table.w2)
    fns["topk"] = lambda: reduce_topk(gpart, r, weighted=True, dtype=x.dtype)
    return fns


def _gemm13_fns(
    x_n: torch.Tensor,
    r: Routing,
    config: MoEConfig,
    *,
    q: QuantizedExpertWeights,
    w13: ExpertMatrix,
    align: BlockAlignment,
) -> dict[str, Callable[[], object]]:
    """The w13 GEMM split ``SPLITS`` ways on ``SHAPES``, each checked first."""
    e, f, n = config.num_experts, config.intermediate_size, x_n.shape[0]
    fns: dict[str, Callable[[], object]] = {}
    for s in SPLITS:
        for bn, warps in SHAPES:
            tiles = attrs.evolve(MMA_TILES, split_k=s, block_n=bn, num_warps=warps)
            part = torch.empty(s, n, 2 * f, device="cuda")

            def g13(tiles: GemmTiles = tiles, part: torch.Tensor = part) -> None:
                launch_gemm(
                    x_n, w13, part, align, tiles, n=2 * f, routing=r, config=config,
                    gated=False, experts=(0, e),
                )  # fmt: skip

            g13()
            check(part.sum(0), x_n, q, r, f"g13 s{s} {bn}x{warps}")
            fns[f"g13 s{s} {bn}x{warps}"] = g13
    return fns


def _gemm2_fns(
    inter: torch.Tensor,
    r: Routing,
    config: MoEConfig,
    *,
    w2: ExpertMatrix,
    align: BlockAlignment,
    table_w2: GemmTiles,
) -> dict[str, Callable[[], object]]:
    """The w2 GEMM at the table's split and twice it."""
    e, d, n = config.num_experts, config.hidden_size, inter.shape[0]
    fns: dict[str, Callable[[], object]] = {}
    for label, mult in (("g2", 1), ("g2 x2", 2)):
        t2 = attrs.evolve(table_w2, split_k=min(8, table_w2.split_k * mult))
        part2 = torch.empty(t2.split_k, n, d, device="cuda")

        def g2(t2: GemmTiles = t2, part2: torch.Tensor = part2) -> None:
            launch_gemm(
                inter, w2, part2, align, t2, n=d, routing=r, config=config,
                gated=False, experts=(0, e),
            )  # fmt: skip

        fns[f"{label} s{t2.split_k}"] = g2
    return fns


if __name__ == "__main__":
    main()
