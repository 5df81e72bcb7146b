"""Variant sweep for backends/triton/_configs.py (run on the GPU).

``python bench/sweep_tiles.py decode|prefill``: for the model shapes of bench_gpu.py,
times triton-w4a16's GEMM path (per dequantization mode and tile variant), its GEMV
decode path (per tile variant) and, at prefill, dequantize-to-bf16-then-GEMM, beside
``torch._grouped_mm`` on bf16 weights. Decode sizes are timed under CUDA-graph replay,
prefill eagerly; each output is checked against the float32 reference first. Prints
one line per variant and appends it to $OUT/sweep_<mode>.jsonl.
"""

# ruff: noqa: B023, D103, T201, TID253
# A GPU script, not library code: print is its output, triton is needed at import, and
# each lambda is timed inside the loop iteration that defines it.

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    GROUP,
    MODELS,
    copy_bandwidth,
    floor_ms,
    grouped_mm_anchor,
    random_int4,
    rel_err,
    route,
    time_eager,
    time_graph,
)

import backends.triton._launch as launch
from backends.triton._configs import GemmTiles, MoETiles
from backends.triton._kernels import _dequant_kernel
from backends.triton._launch import ExpertMatrix, fused_moe, pick_tiles
from core.config import MoEConfig
from core.quantize import dequantize_expert_weights
from core.reference import moe_forward_reference


def dequant_bf16(b: ExpertMatrix) -> torch.Tensor:
    e, n, half = b.data.shape
    out = torch.empty(e, n, 2 * half, dtype=torch.bfloat16, device=b.data.device)
    assert b.scale is not None
    _dequant_kernel[(triton.cdiv(e * n, 64), triton.cdiv(2 * half, 128))](
        b.data, b.scale, b.scale, out, e * n, 2 * half, half,
        b.scale.stride(1), 2 * half, GROUP=GROUP, HAS_ZP=False, BLOCK_R=64,
        BLOCK_K=128, num_warps=4,
    )  # fmt: skip
    return out


def with_deq(t: MoETiles, deq: int) -> MoETiles:
    return MoETiles(
        block_m=t.block_m,
        w13=attrs.evolve(t.w13, dequant=deq),
        w2=attrs.evolve(t.w2, dequant=deq),
    )


def decode_variants(default: MoETiles) -> dict[str, Callable[..., object]]:
    v: dict[str, object] = {f"gemm deq{d}": with_deq(default, d) for d in (0, 1, 2)}
    bm = default.block_m
    for bn, bk, w, st in [
        (32, 128, 4, 4),
        (128, 128, 4, 3),
        (64, 64, 4, 4),
        (64, 128, 8, 4),
    ]:
        t = GemmTiles(block_n=bn, block_k=bk, num_warps=w, num_stages=st)
        v[f"gemm deq2 bm{bm} bn{bn} bk{bk} w{w} s{st}"] = MoETiles(
            block_m=bm, w13=t, w2=attrs.evolve(t, split_k=default.w2.split_k)
        )
    return v  # type: ignore[return-value]


GEMV_VARIANTS = [  # (block_n, block_k, split cap, warps, stages)
    (8, 128, 8, 2, 3),
    (16, 128, 8, 2, 3),
    (16, 128, 8, 4, 3),
    (32, 128, 8, 4, 3),
    (32, 256, 8, 4, 3),
    (64, 128, 8, 4, 3),
    (32, 128, 1, 4, 3),
    (16, 128, 8, 4, 1),
]


DECODE2_GEMM = [  # (block_n, block_k, warps, stages)
    (128, 128, 4, 3),
    (64, 256, 4, 3),
    (32, 256, 4, 3),
    (32, 512, 4, 3),
    (16, 512, 4, 3),
    (16, 256, 4, 4),
    (16, 1024, 4, 2),
]
DECODE2_GEMV = [(32, 256, 4), (8, 512, 4), (16, 512, 4), (8, 1024, 4), (16, 1024, 8)]


def prefill_variants(default: MoETiles) -> dict[str, MoETiles]:
    v = {f"gemm deq{d}": with_deq(default, d) for d in (0, 1, 2)}
    for bm, bn13, bn2, bk, w, st in [
        (128, 128, 128, 64, 8, 3),
        (128, 128, 128, 128, 8, 3),
        (128, 64, 128, 64, 8, 4),
        (128, 128, 256, 64, 8, 3),
        (256, 64, 128, 64, 8, 3),
        (64, 128, 128, 64, 4, 3),
    ]:
        v[f"gemm deq2 bm{bm} bn{bn13}/{bn2} bk{bk} w{w} s{st}"] = MoETiles(
            block_m=bm,
            w13=GemmTiles(block_n=bn13, block_k=bk, num_warps=w, num_stages=st),
            w2=GemmTiles(block_n=bn2, block_k=bk, num_warps=w, num_stages=st),
        )
    return v


def main() -> None:
    mode = sys.argv[1]
    only = sys.argv[2:] or list(MODELS)
    torch.manual_seed(0)
    bw = copy_bandwidth()
    out_path = Path(os.environ.get("OUT", "/tmp")) / f"sweep_{mode}.jsonl"
    print(f"copy {bw / 1e12:.2f} TB/s", flush=True)
    ms_list = [1, 4, 16, 64] if mode.startswith("decode") else [4096]
    if os.environ.get("SWEEP_M"):
        ms_list = [int(v) for v in os.environ["SWEEP_M"].split(",")]
    for name in only:
        e, k, d, f = MODELS[name]
        cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        q = random_int4(e, d, f)
        w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
        w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
        dense = None
        if mode == "prefill":
            w13d, w2d = dequantize_expert_weights(q, dtype=torch.bfloat16)
            dense = (ExpertMatrix(data=w13d), ExpertMatrix(data=w2d), w13d, w2d)
        for m in ms_list:
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            active = int(torch.unique(r.topk_ids).numel())
            fl = floor_ms(m, active, e, k, d, f, bw, 1e30)
            ref = moe_forward_reference(x, q, r, cfg)
            default = pick_tiles(m * k, w13, w2)
            fns: dict[str, Callable[[], torch.Tensor]] = {}
            if mode == "decode2":
                for deq in (0, 2):
                    for bn, bk, w, st in DECODE2_GEMM:
                        t = GemmTiles(
                            block_n=bn, block_k=bk, num_warps=w, num_stages=st,
                            dequant=deq,
                        )  # fmt: skip
                        tt = MoETiles(
                            block_m=default.block_m,
                            w13=t,
                            w2=attrs.evolve(t, split_k=default.w2.split_k),
                        )
                        key = f"gemm deq{deq} bn{bn} bk{bk} w{w} s{st}"
                        fns[key] = lambda t=tt: fused_moe(x, w13, w2, r, cfg, tiles=t)
                for bn, bk, w in DECODE2_GEMV:
                    gt = GemmTiles(block_n=bn, block_k=bk, num_warps=w)
                    fns[f"gemv bytes bn{bn} bk{bk} w{w}"] = lambda gt=gt: fused_moe(
                        x, w13, w2, r, cfg, path="gemv", gemv_tiles=gt
                    )
            elif mode == "decode":
                for key, t in decode_variants(default).items():
                    fns[key] = lambda t=t: fused_moe(x, w13, w2, r, cfg, tiles=t)
                for bn, bk, sp, w, st in GEMV_VARIANTS:
                    gt = GemmTiles(
                        block_n=bn, block_k=bk, split_k=sp, num_warps=w, num_stages=st
                    )
                    fns[f"gemv words bn{bn} bk{bk} sp{sp} w{w} s{st}"] = lambda gt=gt: (
                        fused_moe(x, w13, w2, r, cfg, path="gemv", gemv_tiles=gt)
                    )
                fns["gemv bytes (old)"] = lambda: fused_moe(
                    x, w13, w2, r, cfg, path="gemv",
                    gemv_tiles=GemmTiles(block_n=32, block_k=256),
                )  # fmt: skip
            else:
                for key, t in prefill_variants(default).items():
                    fns[key] = lambda t=t: fused_moe(x, w13, w2, r, cfg, tiles=t)
                assert dense is not None
                fns["emulation (bf16 resident)"] = lambda dn=dense: fused_moe(
                    x, dn[0], dn[1], r, cfg
                )
                fns["dequant+emulation"] = lambda: fused_moe(
                    x,
                    ExpertMatrix(data=dequant_bf16(w13)),
                    ExpertMatrix(data=dequant_bf16(w2)),
                    r,
                    cfg,
                )
                fns["dequant only"] = lambda: (dequant_bf16(w13), dequant_bf16(w2))[0]
                w13t, w2t = dense[2].transpose(1, 2), dense[3].transpose(1, 2)
                fns["grouped_mm bf16"] = lambda: grouped_mm_anchor(x, w13t, w2t, r)
            for key, fn in fns.items():
                launch.GEMV_WORDS = "words" in key
                try:
                    res = fn()
                    err = rel_err(ref, res) if key != "dequant only" else 0.0
                    ms = time_graph(fn) if m <= 64 else time_eager(fn)
                except Exception as exc:  # a variant may not compile
                    print(
                        f"{name} M={m} {key}: FAILED {type(exc).__name__}: {exc}"[:300]
                    )
                    continue
                finally:
                    launch.GEMV_WORDS = True
                row = {"model": name, "M": m, "active": active, "floor_ms": fl,
                       "variant": key, "ms": ms, "relerr": err}  # fmt: skip
                ratio = f"{ms / fl:.2f}x" if ms else "-"
                print(
                    f"{name:15s} M={m:4d} {key:38s} {ms if ms else float('nan'):8.4f} ms"
                    f" {ratio:>7s} err {err:.1e}",
                    flush=True,
                )
                with out_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
        del q, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
