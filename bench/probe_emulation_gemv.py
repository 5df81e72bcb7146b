"""Emulation at decode on the GPU: the 16-bit GEMV against the 16-bit grouped GEMM.

``python bench/probe_emulation_gemv.py``: per model shape and M where ``use_gemv``
allows the GEMV, the graph-replayed and eager ms of ``fused_moe`` on bf16 weights with
``path="gemv"`` (the table's ``GEMV_16BIT`` and other tiles) and ``path="gemm"``, each
output checked against the float32 reference first.
"""

# ruff: noqa: B023, D103, T201
# A GPU script: print is its output.

import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    MODELS,
    checked,
    dense_bf16,
    random_int4,
    route,
    time_eager,
    time_graph,
)

from backends.triton._fused import fused_moe, use_gemv
from backends.triton._launch import ExpertMatrix
from backends.triton._tiles import GemvTiles
from core.config import MoEConfig
from core.reference import moe_forward_reference

TILES = {
    "16x128 w4 (table)": None,
    "32x128 w4": GemvTiles(block_n=32, block_k=128),
    "16x256 w4": GemvTiles(block_n=16, block_k=256),
    "8x256 w2": GemvTiles(block_n=8, block_k=256, num_warps=2),
}


def main() -> None:
    torch.manual_seed(0)
    for name, (e, k, d, f) in MODELS.items():
        config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        q = random_int4(e, d, f)
        w13, w2 = dense_bf16(q)
        d13, d2 = ExpertMatrix(data=w13), ExpertMatrix(data=w2)
        for m in (1, 4):
            if not use_gemv(m * k, d13):
                continue
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            ref = moe_forward_reference(x, q, r, config)
            runs: dict[str, Callable[[], torch.Tensor]] = {
                "gemm": lambda: fused_moe(x, d13, d2, r, config, path="gemm")
            }
            for label, tiles in TILES.items():

                def run(tiles: GemvTiles | None = tiles) -> torch.Tensor:
                    return fused_moe(
                        x, d13, d2, r, config, path="gemv", gemv_tiles=tiles
                    )

                runs[f"gemv {label}"] = run
            for label, fn in runs.items():
                err = checked(ref, fn(), f"{name} M={m} {label}")
                print(
                    f"{name:16s} M={m} {label:22s} graph {time_graph(fn):.4f} ms "
                    f"eager {time_eager(fn):.4f} ms err {err:.1e}",
                    flush=True,
                )
        del q, w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
