"""Variant sweep for backends/triton/_configs.py (run on the GPU).

``[SWEEP_M=1,4] python bench/sweep_tiles.py decode|gemv|words|prefill|emulation|operands|group [model ...]``: for the model
shapes of bench_gpu.py, times triton-w4a16's paths with tile variants: at decode the
grouped GEMM and the GEMV; ``gemv``: the GEMV's loop variants at M = 1 and 4, then
prints the one bench_gpu.py should take (``GEMV_VARIANT``); ``words``: the word GEMV's
tiles (``GemvTiles.words``) at M = 1 and 4 (``SWEEP_WORDS=2`` to ``9``: the
second sweep's, the one-word table's, the paired kernel's, two-warp paired tiles, the
paired table's with programmatic dependent launch, TMA reads, TMA tiles per
matrix, or ``GEMV_PAIRED`` with w2 on 8 or 16 rows and K splits of 1-8);
at prefill the in-register GEMM, the dequant path and ``torch._grouped_mm`` on bf16
weights; ``emulation``: triton-emulation's GEMM tiles on
bf16 weights beside ``torch._grouped_mm`` at M = 256-4096; ``operands``: the in-register
int4 GEMM with swapped operands and nibble halves (``GemmTiles``) beside the table;
``group``: the launch orders (``GemmTiles.group_m``) of the table's tiles, int4 and bf16,
beside ``torch._grouped_mm`` at M = 1024 and 4096. Decode sizes (M <= 64) are timed under
CUDA-graph replay, prefill eagerly; each output is checked against the float32
reference first. Prints one line per variant and appends it to $OUT/sweep_<mode>.jsonl.
bench/sweeps/ holds the logs of the sweep behind the table (it also timed kernel
variants that were then removed: see bench/TUNING.md).
"""

# ruff: noqa: D103, T201
# A GPU script, not library code: print is its output, triton is needed at import, and
# each lambda is timed inside the loop iteration that defines it.

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    GEMV_LOOP_VARIANTS,
    GROUP,
    MODELS,
    copy_bandwidth,
    dense_bf16,
    floor_ms,
    grouped_mm_anchor,
    random_int4,
    rel_err,
    route,
    time_eager,
    time_graph,
)
from sweep_tiles_sets import FusedKw, group_fns, variants

from backends.triton._fused import fused_moe, pick_tiles
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig
from core.quantize import dequantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import Routing
from core.weights import QuantizedExpertWeights


def main() -> None:
    mode = sys.argv[1]
    only = sys.argv[2:] or list(MODELS)
    torch.manual_seed(0)
    bw = copy_bandwidth()
    out_path = Path(os.environ.get("OUT", "/tmp")) / f"sweep_{mode}.jsonl"
    print(f"copy {bw / 1e12:.2f} TB/s", flush=True)
    ms_list = {
        "decode": [1, 4, 16, 64],
        "gemv": [1, 4],
        "words": [1, 4],
        "operands": [1, 4, 16, 64, 256],
        "group": [1024, 4096],
    }.get(mode, [256, 1024, 4096])
    if os.environ.get("SWEEP_M"):
        ms_list = [int(v) for v in os.environ["SWEEP_M"].split(",")]
    for name in only:
        layer = _layer(name, mode)
        for m in ms_list:
            e, k, d, f = MODELS[name]
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            active = int(torch.unique(r.topk_ids).numel())
            fl = floor_ms(m, active, (e, k, d, f), bw, 1e30)
            ref = moe_forward_reference(x, layer.q, r, layer.cfg)
            fns = _variant_fns(layer, x, r, m, mode)
            for key, fn in fns.items():
                row = _time_variant(fn, ref, m)
                if isinstance(row, str):
                    print(f"{name} M={m} {key}: FAILED {row}"[:300])
                    continue
                ms, err = row
                ratio = f"{ms / fl:.2f}x" if ms else "-"
                print(
                    f"{name:15s} M={m:4d} {key:38s} {ms if ms else float('nan'):8.4f} ms"
                    f" {ratio:>7s} err {err:.1e}",
                    flush=True,
                )
                with out_path.open("a") as fh:
                    fh.write(json.dumps({
                        "model": name, "M": m, "active": active, "floor_ms": fl,
                        "variant": key, "ms": ms, "relerr": err,
                    }) + "\n")  # fmt: skip
        del layer
        torch.cuda.empty_cache()
    if mode == "gemv":
        print(f"GEMV_VARIANT={choose_gemv_variant(out_path)}", flush=True)


@attrs.frozen
class _Layer:
    """One model's layer as a sweep mode runs it: weights, and the anchors' copies."""

    cfg: MoEConfig
    q: QuantizedExpertWeights
    w13: ExpertMatrix
    w2: ExpertMatrix
    dense: tuple[ExpertMatrix, ExpertMatrix, torch.Tensor, torch.Tensor] | None
    dense16: tuple[ExpertMatrix, ExpertMatrix] | None


def _layer(name: str, mode: str) -> _Layer:
    """Random int4 weights of ``name``; 16-bit copies where ``mode`` times them."""
    e, k, d, f = MODELS[name]
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    q = random_int4(e, d, f)
    w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    dense = None
    dense16 = None
    if mode == "group":
        w13d, w2d = dense_bf16(q)
        dense16 = (ExpertMatrix(data=w13d), ExpertMatrix(data=w2d))
    if mode == "emulation":  # the variants run on 16-bit weights, the anchor beside
        w13d, w2d = dense_bf16(q)
        w13, w2 = ExpertMatrix(data=w13d), ExpertMatrix(data=w2d)
    if mode == "prefill" and e * d * f <= 2**33:
        w13d, w2d = dequantize_expert_weights(q, dtype=torch.bfloat16)
        dense = (ExpertMatrix(data=w13d), ExpertMatrix(data=w2d), w13d, w2d)
    return _Layer(cfg=cfg, q=q, w13=w13, w2=w2, dense=dense, dense16=dense16)


def _variant_fns(
    layer: _Layer, x: torch.Tensor, r: Routing, m: int, mode: str
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each variant of ``mode`` at ``m`` as a call, and the anchors the mode times."""
    cfg, w13, w2 = layer.cfg, layer.w13, layer.w2
    default = pick_tiles(m * cfg.top_k, w13, w2)
    fns: dict[str, Callable[[], torch.Tensor]] = {}
    for key, kw in variants(m, cfg.top_k, cfg.num_experts, default, mode).items():

        def variant_fn(kw: FusedKw = kw) -> torch.Tensor:
            return fused_moe(x, w13, w2, r, cfg, **kw)

        fns[key] = variant_fn
    if layer.dense16 is not None:
        d16 = layer.dense16
        fns = group_fns(x, r, cfg, (w13, w2), d16)
        fns["grouped_mm bf16"] = lambda: grouped_mm_anchor(
            x, d16[0].data.transpose(1, 2), d16[1].data.transpose(1, 2), r
        )
    if mode == "emulation":
        fns["grouped_mm bf16"] = lambda: grouped_mm_anchor(
            x, w13.data.transpose(1, 2), w2.data.transpose(1, 2), r
        )
    if layer.dense is not None:
        dn = layer.dense
        fns["emulation (bf16 resident)"] = lambda: fused_moe(x, dn[0], dn[1], r, cfg)
        w13t, w2t = dn[2].transpose(1, 2), dn[3].transpose(1, 2)
        fns["grouped_mm bf16"] = lambda: grouped_mm_anchor(x, w13t, w2t, r)
    return fns


def _time_variant(
    fn: Callable[[], torch.Tensor], ref: torch.Tensor, m: int
) -> tuple[float | None, float] | str:
    """``(ms, relerr)``: checked first, replayed at ``m`` <= 64; what it raised if not."""
    try:
        err = rel_err(ref, fn())
        ms = time_graph(fn) if m <= 64 else time_eager(fn)
    except Exception as exc:  # a variant may not compile
        return f"{type(exc).__name__}: {exc}"
    return ms, err


def choose_gemv_variant(path: Path) -> str:
    """The GEMV loop variant bench_gpu.py should take.

    The fastest one that beats ``base`` by >= 5% (geometric mean over the rows) and is
    nowhere more than 3% slower; else ``base``.
    """
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    base = {(r["model"], r["M"]): r["ms"] for r in rows if r["variant"] == "gemv base"}
    best, best_gain = "base", 1.05
    for name in GEMV_LOOP_VARIANTS:
        ratios = [
            base[(r["model"], r["M"])] / r["ms"]
            for r in rows
            if r["variant"] == f"gemv {name}" and r["ms"]
        ]
        wrong = [
            r for r in rows if r["variant"] == f"gemv {name}" and r["relerr"] > 1e-2
        ]
        if wrong or len(ratios) != len(base) or min(ratios) < 0.97:
            continue
        gain = math.prod(ratios) ** (1 / len(ratios))
        print(f"{name}: geometric-mean speedup {gain:.3f}, worst {min(ratios):.3f}")
        if gain > best_gain:
            best, best_gain = name, gain
    return best


if __name__ == "__main__":
    main()
