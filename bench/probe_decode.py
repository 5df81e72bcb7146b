"""Where decode time goes, and the int4 GEMM's dequantization schemes side by side.

Run on the GPU from the repository root: ``python bench/probe_decode.py [model ...]``.
Part 1, M <= 64: per kernel of triton-w4a16, median device time (torch.profiler, L2
flushed before each forward); the sum of the kernels against the graph replay of the
whole forward (the difference is the gaps between dependent launches). Part 2: the
GEMM path with the table's tiles (nibble halves) against the same tiles reading int32
words (``GemmTiles.int4_words``), graph replay at M <= 64, eager above.
"""

# ruff: noqa: B023, D103, T201
# A GPU script, not library code: print is its output; each closure runs in its loop step.

import statistics
import sys
from collections import defaultdict
from pathlib import Path

import attrs
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    FLUSH,
    GROUP,
    MODELS,
    random_int4,
    rel_err,
    route,
    time_eager,
    time_graph,
)

from backends.triton._configs import MoETiles
from backends.triton._fused import fused_moe, pick_tiles, use_dequant
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig
from core.reference import moe_forward_reference

REPS = 20


def kernel_times(fn: object) -> dict[str, float]:
    """Median microseconds per kernel name over REPS forwards (flush kernels dropped)."""
    assert callable(fn)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            FLUSH.zero_()
            fn()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "fill" not in ev.name:
            per[ev.name[:40]].append(ev.device_time)
    return {k: statistics.median(v) * len(v) / REPS for k, v in per.items()}


def words_of(t: MoETiles, block_m: int | None = None) -> MoETiles:
    w13 = attrs.evolve(t.w13, nibble_halves=False, int4_words=True)
    w2 = attrs.evolve(t.w2, nibble_halves=False, int4_words=True)
    return MoETiles(block_m=block_m or t.block_m, w13=w13, w2=w2)


def compare(name: str, ms: tuple[int, ...]) -> None:
    e, k, d, f = MODELS[name]
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    q = random_int4(e, d, f)
    w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    for m in ms:
        if use_dequant(m * k, w13):
            continue
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        ref = moe_forward_reference(x, q, r, cfg)
        table = pick_tiles(m * k, w13, w2)
        variants = {"halves": table, "words": words_of(table)}
        if table.block_m == 16:
            variants["halves bm32"] = attrs.evolve(table, block_m=32)
            variants["words bm32"] = words_of(table, 32)
        line = []
        for label, t in variants.items():

            def fwd() -> torch.Tensor:
                return fused_moe(x, w13, w2, r, cfg, tiles=t, path="gemm")

            err = rel_err(ref, fwd())
            ms_ = time_graph(fwd) if m <= 64 else time_eager(fwd)
            line.append(f"{label} {ms_:.4f} ms (err {err:.1e})")
        print(f"{name} M={m}: " + "; ".join(line), flush=True)


def main() -> None:
    models = sys.argv[1:] or list(MODELS)
    for name in models:
        compare(name, (4, 16, 64, 256, 1024, 4096))
    for name in models:
        e, k, d, f = MODELS[name]
        cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        q = random_int4(e, d, f)
        w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
        w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
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


if __name__ == "__main__":
    main()
