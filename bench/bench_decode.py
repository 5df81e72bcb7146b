"""Decode paths of triton-w4a16 side by side: grouped GEMM vs the pair-major GEMV.

Run on the GPU: ``python bench/bench_decode.py``. Same weights, routing, floor and
CUDA-graph timing as ``bench_gpu.py`` (imported from it); M = 1, 4, 16, 64. Writes
bench/RESULTS_DECODE.md and results_decode.json (and copies them to $OUT).
"""
# ruff: noqa: B023, D103, ICN001, T201, TID253
# A GPU script, not library code: print is its output, triton is needed at import, and
# each closure is timed inside the loop iteration that defines it.

import datetime
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from bench_gpu import (
    GROUP,
    MODELS,
    copy_bandwidth,
    floor_ms,
    random_int4,
    rel_err,
    route,
    time_graph,
)

from backends.triton._launch import ExpertMatrix, fused_moe, use_gemv
from core.config import MoEConfig
from core.reference import moe_forward_reference

HERE = Path(__file__).resolve().parent
PATHS = ("gemm", "gemv")


def bench_model(name: str, bw: float) -> list[dict[str, object]]:
    e, k, d, f = MODELS[name]
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    q = random_int4(e, d, f)
    w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    rows = []
    for m in (1, 4, 16, 64):
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        active = int(torch.unique(r.topk_ids).numel())
        row: dict[str, object] = {
            "model": name,
            "M": m,
            "active": active,
            "floor_ms": floor_ms(m, active, e, k, d, f, bw, 1e30),
            "rule": "gemv" if use_gemv(m * k, w13, enabled=True) else "gemm",
        }
        ref = moe_forward_reference(x, q, r, config)
        for path in PATHS:

            def fn(path: str = path) -> torch.Tensor:
                return fused_moe(x, w13, w2, r, config, path=path)  # type: ignore[arg-type]

            row[f"{path}_relerr"] = rel_err(ref, fn())
            row[f"{path}_graph_ms"] = time_graph(fn)
        rows.append(row)
        fl = float(row["floor_ms"])  # type: ignore[arg-type]
        cells = " | ".join(
            f"{p} {row[f'{p}_graph_ms']:.3f} ({row[f'{p}_graph_ms'] / fl:.2f}x, "
            f"err {row[f'{p}_relerr']:.1e})"
            for p in PATHS
        )
        print(
            f"{name:16s} M={m:3d} act={active:3d} floor={fl:.3f} | {cells} | rule={row['rule']}",
            flush=True,
        )
    del q
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    torch.manual_seed(0)
    bw = copy_bandwidth()
    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bw": bw,
    }
    print(f"copy {bw / 1e12:.2f} TB/s", flush=True)
    rows = [row for name in MODELS for row in bench_model(name, bw)]
    lines = [
        "# Decode: triton-w4a16 grouped GEMM vs pair-major GEMV (CUDA-graph replay)",
        "",
        f"Date {meta['date']}; GPU {meta['gpu']}; torch {meta['torch']}; triton "
        f"{meta['triton']}; copy bandwidth {bw / 1e12:.2f} TB/s measured in this run.",
        "Median ms of graph replays with L2 flushed (multiple of the byte floor); symmetric",
        "int4 group 128, bf16; `rule` is the path `use_gemv(enabled=True)` picks for that M.",
        "",
        "| model | M | active | floor ms | gemm | gemv | rule |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        fl = float(row["floor_ms"])  # type: ignore[arg-type]
        cells = [
            f"{row[f'{p}_graph_ms']:.3f} ({row[f'{p}_graph_ms'] / fl:.2f}x)"
            for p in PATHS
        ]
        lines.append(
            f"| {row['model']} | {row['M']} | {row['active']} | {fl:.3f} | "
            + " | ".join(cells)
            + f" | {row['rule']} |"
        )
    (HERE / "RESULTS_DECODE.md").write_text("\n".join(lines) + "\n")
    (HERE / "results_decode.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1)
    )
    out = os.environ.get("OUT")
    if out:
        for name in ("RESULTS_DECODE.md", "results_decode.json"):
            shutil.copy(HERE / name, out)


if __name__ == "__main__":
    main()
