"""Programmatic dependent launch on the ``gemm`` path (``MoETiles.pdl``), on and off.

Run on the GPU from the repository root: ``python bench/probe_pdl.py [model ...]``
(``PROBE_M=4,16`` for other sizes). For each model shape and M it times the ``gemm``
path on the table's tiles (``pick_tiles``) under CUDA-graph replay, L2 flushed by a
read before each replay (as bench_gpu.py), with ``MoETiles.pdl`` off and on, each
twice, each output checked against the float32 reference first.

The sweep that chose the committed form (bench/sweeps/probe_pdl_edges_h200.log) ran
this script at commit f3ab058, whose ``_launch.PDL_EDGES`` / ``PDL_LATE`` knobs (since
removed) also timed subsets of the edges and the trigger's place.
"""

# ruff: noqa: B023, D103, T201
# A GPU script, not library code: print is its output; each lambda is timed in its loop step.

import os
import sys
from pathlib import Path

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    MODELS,
    copy_bandwidth,
    floor_ms,
    int4_layer,
    rel_err,
    route,
    time_graph,
)

from backends.triton._fused import fused_moe, pick_tiles
from core.reference import moe_forward_reference

VARIANTS = {"off": False, "on": True, "off again": False, "on again": True}


def main() -> None:
    only = sys.argv[1:] or list(MODELS)
    ms_list = [int(v) for v in os.environ.get("PROBE_M", "4,8,16,32,64").split(",")]
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"copy {bw / 1e12:.2f} TB/s", flush=True)
    for name in only:
        e, k, d, f = MODELS[name]
        cfg, q, w13, w2 = int4_layer(name)
        for m in ms_list:
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            active = int(torch.unique(r.topk_ids).numel())
            fl = floor_ms(m, active, e, k, d, f, bw, 1e30)
            ref = moe_forward_reference(x, q, r, cfg)
            table = pick_tiles(m * k, w13, w2)
            for label, pdl in VARIANTS.items():
                tiles = attrs.evolve(table, pdl=pdl)

                def fn() -> torch.Tensor:
                    return fused_moe(x, w13, w2, r, cfg, tiles=tiles, path="gemm")

                err = rel_err(ref, fn())
                ms = time_graph(fn)
                assert ms is not None
                print(
                    f"{name:15s} M={m:4d} {label:10s} {ms:8.4f} ms {ms / fl:5.2f}x"
                    f" err {err:.1e}",
                    flush=True,
                )
        del q
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
