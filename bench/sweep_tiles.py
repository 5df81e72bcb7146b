"""Tile sweep for the tile table in backends/triton/_configs.py (run on the GPU).

``python bench/sweep_tiles.py``: times triton-w4a16 (and emulation at prefill) for a few
tile variants on decode and prefill shapes, CUDA-graph replay for decode, and prints one
line per variant (median ms). Results are recorded in bench/TUNING.md by hand.
"""

# ruff: noqa: B007, B023, D103, E731, T201
# A GPU script, not library code: print is its output, triton is needed at import, and
# each lambda is timed inside the loop iteration that defines it.

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import MODELS, random_int4, route, time_eager, time_graph

from backends.triton._configs import GemmTiles, MoETiles
from backends.triton._launch import ExpertMatrix, fused_moe, pick_tiles
from core.config import MoEConfig
from core.quantize import dequantize_expert_weights


def variants(m: int) -> list[MoETiles]:
    if m <= 64:
        bm = 16 if m <= 16 else 32
        out = []
        for bn, bk, w, st, sp in [
            (64, 128, 4, 4, 0),
            (32, 128, 4, 4, 0),
            (64, 256, 4, 3, 0),
            (32, 256, 4, 3, 0),
            (64, 128, 4, 2, 0),
            (128, 128, 4, 3, 0),
        ]:
            t = GemmTiles(block_n=bn, block_k=bk, num_warps=w, num_stages=st)
            out.append(MoETiles(block_m=bm, w13=t, w2=t))
        return out
    res = []
    for bm, bn13, bn2, bk, w, st in [
        (128, 128, 128, 64, 8, 3),
        (128, 64, 128, 64, 8, 3),
        (128, 64, 128, 64, 4, 3),
        (64, 128, 128, 64, 4, 3),
        (128, 128, 128, 128, 8, 3),
        (128, 64, 128, 128, 8, 4),
    ]:
        res.append(
            MoETiles(
                block_m=bm,
                w13=GemmTiles(block_n=bn13, block_k=bk, num_warps=w, num_stages=st),
                w2=GemmTiles(block_n=bn2, block_k=bk, num_warps=w, num_stages=st),
            )
        )
    return res


def main() -> None:
    cases = [
        ("mixtral-8x7b", 1),
        ("mixtral-8x7b", 64),
        ("deepseek-v3", 16),
        ("qwen3-235b-a22b", 64),
        ("qwen3-30b-a3b", 4),
        ("mixtral-8x7b", 4096),
        ("deepseek-v3", 4096),
    ]
    loaded: dict[str, object] = {}
    for name, m in cases:
        e, k, d, f = MODELS[name]
        if loaded.get("name") != name:
            loaded.clear()
            torch.cuda.empty_cache()
            q = random_int4(e, d, f)
            loaded.update(name=name, q=q)
        q = loaded["q"]
        cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=128)
        w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=128)
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        default = pick_tiles(m * k, w13, w2)
        for tiles in [default, *variants(m)]:
            for sp in [1, 2, 4] if m <= 64 else [1]:
                t = (
                    tiles
                    if tiles is default and sp == 1
                    else MoETiles(
                        block_m=tiles.block_m,
                        w13=tiles.w13,
                        w2=GemmTiles(
                            block_n=tiles.w2.block_n,
                            block_k=tiles.w2.block_k,
                            split_k=sp,
                            num_warps=tiles.w2.num_warps,
                            num_stages=tiles.w2.num_stages,
                        ),
                    )
                )
                fn = lambda t=t: fused_moe(x, w13, w2, r, cfg, tiles=t)
                try:
                    ms = time_graph(fn) if m <= 64 else time_eager(fn)
                except Exception as exc:
                    print(f"{name} M={m} {t} FAILED {type(exc).__name__}", flush=True)
                    continue
                tag = "DEFAULT " if t is default else ""
                print(f"{name} M={m} {tag}{t}: {ms:.4f} ms", flush=True)
        if m == 4096 and name == "mixtral-8x7b":
            w13d, w2d = dequantize_expert_weights(q, dtype=torch.bfloat16)
            for tiles in variants(m)[:4]:
                fn = lambda t=tiles: fused_moe(
                    x, ExpertMatrix(data=w13d), ExpertMatrix(data=w2d), r, cfg, tiles=t
                )
                print(
                    f"emulation {name} M={m} {tiles}: {time_eager(fn):.4f} ms",
                    flush=True,
                )
            del w13d, w2d


if __name__ == "__main__":
    main()
