"""Emulation at decode on the GPU: the 16-bit GEMV against the 16-bit grouped GEMM.

``python bench/probe_emulation_gemv.py``: per model shape and M where ``use_gemv``
allows the GEMV, the graph-replayed and eager ms of ``fused_moe`` on bf16 weights with
``path="gemv"`` (the table's ``GEMV_16BIT`` and other tiles) and ``path="gemm"``, and
of the benchmark's ``torch._grouped_mm`` anchor, each output checked against the
float32 reference first. ``PROBE_M`` (default ``1,4``) lists the sizes;
``PROBE_FORCE=1`` runs the GEMV on 16-bit experts below ``GEMV_16BIT_MAX_EXPERT``
wherever it fits (<= one pair per expert) instead of where ``use_gemv`` allows it.
"""

# ruff: noqa: B023, D103, T201
# A GPU script: print is its output.

import os
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
    grouped_mm_anchor,
    random_int4,
    route,
    time_eager,
    time_graph,
)

from backends.triton import _configs as configs
from backends.triton._fused import _expert_size, fused_moe, use_gemv
from backends.triton._launch import ExpertMatrix
from backends.triton._tiles import GemvTiles
from core.config import MoEConfig
from core.reference import moe_forward_reference

TILES = {
    "table (GEMV_16BIT)": None,
    "16x128 w4": GemvTiles(block_n=16, block_k=128),
    "32x128 w4": GemvTiles(block_n=32, block_k=128),
    "16x256 w4": GemvTiles(block_n=16, block_k=256),
}
"""The table's tiles (8 x 256, 2 warps) and the other forms measured before it."""

SIZES = [int(m) for m in os.environ.get("PROBE_M", "1,4").split(",")]
FORCE = os.environ.get("PROBE_FORCE") == "1"


def gemv_fits(m: int, k: int, w13: ExpertMatrix) -> bool:
    """``use_gemv``, or with ``PROBE_FORCE`` small experts at <= one pair each."""
    if not FORCE:
        return use_gemv(m * k, w13)
    small = _expert_size(w13) < configs.GEMV_16BIT_MAX_EXPERT
    return small and m * k <= int(w13.data.shape[0])


def probe_model(name: str) -> None:
    """Every size of ``SIZES`` where the GEMV fits, on one model's random weights."""
    e, k, d, f = MODELS[name]
    shape = ExpertMatrix(
        data=torch.empty(e, 2 * f, d, dtype=torch.bfloat16, device="meta")
    )
    sizes = [m for m in SIZES if gemv_fits(m, k, shape)]
    if not sizes:  # no weights built (DeepSeek-V3's are 22 GB in bf16)
        return
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    q = random_int4(e, d, f)
    w13, w2 = dense_bf16(q)
    d13, d2 = ExpertMatrix(data=w13), ExpertMatrix(data=w2)
    w13t, w2t = w13.transpose(1, 2), w2.transpose(1, 2)
    for m in sizes:
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        ref = moe_forward_reference(x, q, r, config)
        runs: dict[str, Callable[[], torch.Tensor]] = {
            "gemm": lambda: fused_moe(x, d13, d2, r, config, path="gemm"),
            "grouped_mm": lambda: grouped_mm_anchor(x, w13t, w2t, r),
        }
        for label, tiles in TILES.items():

            def run(tiles: GemvTiles | None = tiles) -> torch.Tensor:
                return fused_moe(x, d13, d2, r, config, path="gemv", gemv_tiles=tiles)

            runs[f"gemv {label}"] = run
        for label, fn in runs.items():
            err = checked(ref, fn(), f"{name} M={m} {label}")
            print(
                f"{name:16s} M={m} {label:22s} graph {time_graph(fn):.4f} ms "
                f"eager {time_eager(fn):.4f} ms err {err:.1e}",
                flush=True,
            )


def main() -> None:
    torch.manual_seed(0)
    for name in MODELS:
        probe_model(name)  # its weights freed on return
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
