"""Where a decode layer's time goes: the GEMV path's kernels replayed alone and together.

Run on the GPU from the repository root: ``python bench/probe_launches.py``. For each
model shape at M = 1, 4 and 16 (where the decode rule takes the GEMV), CUDA-graph replay
(L2 flushed before each, median of 50, as ``bench_gpu.py`` times) of: a graph of one
tiny kernel (the replay's own cost), the w13 GEMV alone, the w2 GEMV alone, the top-k
sum alone, w13 + w2, and the whole layer; each with the table's tiles.
"""

# ruff: noqa: D103, T201
# A GPU script, not library code: print is its output, and each closure is replayed
# inside the loop iteration that defines it.

import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gpu import (
    GROUP,
    MODELS,
    copy_bandwidth,
    floor_ms,
    random_int4,
    replay_graph,
    route,
)

from backends.triton._fused import (
    fused_moe,
    gemv_w2_split,
    pick_gemv_tiles,
    use_gemv,
)
from backends.triton._launch import ExpertMatrix, buffer_dtype
from backends.triton._launch_gemv import launch_gemv
from backends.triton._launch_reduce import reduce_topk
from core.config import MoEConfig
from core.routing import Routing


def _launches(
    x: torch.Tensor,
    r: Routing,
    config: MoEConfig,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
) -> tuple[int, dict[str, Callable[[], torch.Tensor]]]:
    """The w2 split, and each of the GEMV path's launches (and the layer) as a call."""
    n, f, d = x.shape[0] * config.top_k, config.intermediate_size, config.hidden_size
    tiles = pick_gemv_tiles(n, w13)
    tiles2 = tiles.w2_tiles or tiles
    split = gemv_w2_split(tiles, n, d, f)
    inter = torch.randn(n, f, device="cuda").to(buffer_dtype(x.dtype))
    part = torch.empty(
        split, n, d, device="cuda",
        dtype=torch.float32 if split > 1 else buffer_dtype(x.dtype),
    )  # fmt: skip

    def w13_only() -> torch.Tensor:
        launch_gemv(
            x, w13, inter, n=f, routing=r, config=config, gated=True,
            tiles=tiles,
        )  # fmt: skip
        return inter

    def w2_only() -> torch.Tensor:
        launch_gemv(
            inter, w2, part, n=d, routing=r, config=config, gated=False,
            tiles=tiles2, split=split,
        )  # fmt: skip
        return part

    def reduce_only() -> torch.Tensor:
        return reduce_topk(part, r, weighted=True, dtype=x.dtype, pdl=tiles2.pdl)

    def w13_w2() -> torch.Tensor:
        w13_only()
        return w2_only()

    fns: dict[str, Callable[[], torch.Tensor]] = {
        "w13": w13_only,
        "w2": w2_only,
        "reduce": reduce_only,
        "w13+w2": w13_w2,
        "layer": lambda: fused_moe(x, w13, w2, r, config),
    }
    return split, fns


def main() -> None:
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    tiny = torch.zeros(1, device="cuda")
    base = replay_graph(lambda: tiny.add_(1.0))[0]
    print(f"graph of one tiny kernel: {base * 1e3:.1f} us")
    for name, (e, k, d, f) in MODELS.items():
        config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        q = random_int4(e, d, f)
        w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
        w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
        for m in (1, 4, 16):
            if not use_gemv(m * k, w13, w2):
                continue
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            active = int(torch.unique(r.topk_ids).numel())
            split, fns = _launches(x, r, config, w13, w2)
            fl = floor_ms(m, active, (e, k, d, f), bw, 1e30)
            cells = " ".join(
                f"{key} {replay_graph(fn)[0] * 1e3:.1f}" for key, fn in fns.items()
            )
            print(
                f"{name} M={m} split={split} floor {fl * 1e3:.1f} us | {cells} us",
                flush=True,
            )
        del q, w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
