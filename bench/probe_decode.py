"""Where decode time goes, and the int4 GEMM's dequantization schemes side by side.

Run on the GPU from the repository root:
``python bench/probe_decode.py [all|compare|tiles|breakdown|words] [model ...]``.
``compare``: the GEMM with the table's tiles reading nibble halves against int32 words
(``GemmTiles.int4_words``), at the table's row block and at 32 rows; ``tiles``: the
table against other words tiles and, at M <= 4, the GEMV; graph replay at M <= 64,
eager above. ``breakdown``, M <= 64: per kernel of triton-w4a16, median device time
(torch.profiler, L2 flushed before each forward), their sum against the graph replay of
the whole forward (the difference is the gaps between dependent launches). ``all``:
compare, then breakdown (the run logged in bench/sweeps/probe_decode_h200.log, made
when the table still read nibble halves at decode).
"""

# ruff: noqa: B023, D103, T201
# A GPU script, not library code: print is its output; each closure runs in its loop step.

import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
from torch.profiler import DeviceType, ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    GROUP,
    MODELS,
    flush_buffer,
    int4_layer,
    rel_err,
    route,
    time_eager,
    time_graph,
)

from backends.triton._configs import GEMV_FEW
from backends.triton._fused import fused_moe, pick_tiles, use_dequant
from backends.triton._tiles import GemvTiles, MoETiles
from core.reference import moe_forward_reference

REPS = 20


def kernel_times(fn: Callable[[], object]) -> dict[str, float]:
    """Median microseconds per kernel name over REPS forwards (flush kernels dropped)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            flush_buffer().zero_()
            fn()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        is_flush = "fill" in ev.name.lower()
        if ev.device_type == DeviceType.CUDA and not is_flush:
            per[ev.name[:40]].append(ev.device_time)
    return {k: statistics.median(v) * len(v) / REPS for k, v in per.items()}


def scheme_of(t: MoETiles, *, words: bool, block_m: int | None = None) -> MoETiles:
    """``t`` with int32 words or nibble halves in both GEMMs (and another row block)."""
    w13 = attrs.evolve(t.w13, nibble_halves=not words, int4_words=words)
    w2 = attrs.evolve(t.w2, nibble_halves=not words, int4_words=words)
    return MoETiles(block_m=block_m or t.block_m, w13=w13, w2=w2)


def tile_variants(table: MoETiles, m: int) -> dict[str, MoETiles | None]:
    """The variants timed beside each other at one M.

    ``compare`` (and ``all``): both schemes at the table's row block and at 32 rows.
    ``tiles``: the table against other words tiles (``None``: the GEMV, at M <= 4).
    """
    if MODE != "tiles":
        out: dict[str, MoETiles | None] = {}
        for bm in sorted({table.block_m, 32}):
            out[f"halves bm{bm}"] = scheme_of(table, words=False, block_m=bm)
            out[f"words bm{bm}"] = scheme_of(table, words=True, block_m=bm)
        return out
    out = {"table": table}
    if m <= 4:
        out["gemv"] = None
    for bn, bk, warps, stages in WORDS_TILES:
        w13 = attrs.evolve(
            table.w13, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages
        )
        w2 = attrs.evolve(w13, split_k=table.w2.split_k)
        out[f"words {bn}x{bk} w{warps} s{stages}"] = MoETiles(
            block_m=table.block_m, w13=w13, w2=w2
        )
    return out


WORDS_TILES = [(32, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 4), (64, 128, 8, 4),
               (64, 128, 4, 6), (128, 64, 4, 4)]  # fmt: skip
"""(block_n, block_k, warps, stages) of the words GEMM beside the table (64x128 w4 s4)."""


def compare(name: str, ms: tuple[int, ...]) -> None:
    e, k, d, _ = MODELS[name]
    cfg, q, w13, w2 = int4_layer(name)
    for m in ms:
        if use_dequant(m * k, w13):
            continue
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        ref = moe_forward_reference(x, q, r, cfg)
        line = []
        for label, t in tile_variants(pick_tiles(m * k, w13, w2), m).items():

            def fwd() -> torch.Tensor:
                if t is None:
                    return fused_moe(x, w13, w2, r, cfg, path="gemv")
                return fused_moe(x, w13, w2, r, cfg, tiles=t, path="gemm")

            err = rel_err(ref, fwd())
            ms_ = time_graph(fwd) if m <= 64 else time_eager(fwd)
            line.append(f"{label} {ms_:.4f} ms (err {err:.1e})")
        print(f"{name} M={m}: " + "; ".join(line), flush=True)


def breakdown(name: str) -> None:
    e, k, d, f = MODELS[name]
    cfg, _, w13, w2 = int4_layer(name)
    for m in (1, 4, 16, 64):
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        active = int(torch.unique(r.topk_ids).numel())
        mb13 = active * 2 * f * d * (0.5 + 2 / GROUP) / 1e6
        mb2 = active * f * d * (0.5 + 2 / GROUP) / 1e6

        def fwd() -> torch.Tensor:
            return fused_moe(x, w13, w2, r, cfg)

        fwd()
        times = kernel_times(fwd)
        graph = time_graph(fwd)
        total = sum(times.values())
        print(f"{name} M={m} active={active} w13 {mb13:.1f} MB w2 {mb2:.1f} MB")
        for kname, us in sorted(times.items(), key=lambda kv: -kv[1]):
            print(f"    {us:8.1f} us  {kname}")
        g = graph * 1e3 if graph is not None else float("nan")
        print(f"    sum {total:.1f} us, graph replay {g:.1f} us", flush=True)


WORD_GEMV_TILES = [(32, 128, 2), (64, 128, 2), (32, 128, 4), (16, 256, 2), (32, 256, 4)]
"""(block_n, block_k, warps) of the int32-word GEMV timed beside the byte GEMV."""


def gemv_words(name: str) -> None:
    """The byte GEMV (the table's tiles) against int32-word GEMV tiles, M = 1 and 4."""
    e, k, d, _ = MODELS[name]
    cfg, q, w13, w2 = int4_layer(name)
    for m in (1, 4):
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        ref = moe_forward_reference(x, q, r, cfg)
        variants: dict[str, GemvTiles] = {"bytes": GEMV_FEW}
        for bn, bk, warps in WORD_GEMV_TILES:
            variants[f"words {bn}x{bk} w{warps}"] = GemvTiles(
                block_n=bn, block_k=bk, num_warps=warps, words=True
            )
        line = []
        for label, gt in variants.items():

            def fwd(gt: GemvTiles = gt) -> torch.Tensor:
                return fused_moe(x, w13, w2, r, cfg, path="gemv", gemv_tiles=gt)

            err = rel_err(ref, fwd())
            line.append(f"{label} {time_graph(fwd):.4f} ms (err {err:.1e})")
        print(f"{name} M={m}: " + "; ".join(line), flush=True)


MODES = ("all", "compare", "tiles", "breakdown", "words")
MODE = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in MODES else "all"


def main() -> None:
    models = [a for a in sys.argv[1:] if a not in MODES] or list(MODELS)
    if MODE in ("all", "compare"):
        for name in models:
            compare(name, (4, 16, 64, 256, 1024, 4096))
    if MODE == "tiles":
        for name in models:
            compare(name, (1, 4, 16, 64, 256))
    if MODE == "words":
        for name in models:
            gemv_words(name)
    if MODE in ("all", "breakdown"):
        for name in models:
            breakdown(name)


if __name__ == "__main__":
    main()
