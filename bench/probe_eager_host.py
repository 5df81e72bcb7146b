"""Where an eager forward's host time goes on a CUDA GPU (Triton launches, torch ops, ours).

``python bench/probe_eager_host.py`` on a GPU. Qwen3-30B-A3B's layer and Mixtral's, bf16,
M = 1, 4, 16, random int4 weights, given routing (``fused_moe``, as the benchmark's eager
column times it) and the ``Int4MoE`` layer with its own router. For each: host time
per call (calls queued back to back, no synchronization: the GPU work of these layers
is 20-250 us, so the host is what waits), then one ``cProfile`` of 300 calls of
``fused_moe`` at M = 1, the top functions by own time, to see how much is Triton's
launcher, torch's ops and this library's Python.
"""

# ruff: noqa: B023, D103, T201, TID253
# A measuring script, not library code: print is its output.

import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
import triton.language as tl
from probe_routing_sources import random_layer

from backends.triton._fused import fused_moe
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig
from core.routing import Routing

SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-8x7b": (8, 2, 4096, 14336)}


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def host_us(fn: Callable[[], object], reps: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - start) / reps * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}"
    )
    buf = torch.zeros(1024, device="cuda")
    print(
        f"empty 3-argument Triton kernel: {host_us(lambda: _empty_kernel[(1,)](buf, 1024, BLOCK=1024)):.1f} us a launch"
    )
    print(
        f"torch.empty(1, 2048): {host_us(lambda: torch.empty(1, 2048, device='cuda')):.1f} us"
    )
    print(f"x + 1: {host_us(lambda: buf + 1):.1f} us")
    gen = torch.Generator().manual_seed(0)
    for name, (e, k, d, f) in SHAPES.items():
        cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        moe = random_layer(cfg, gen)
        w13 = ExpertMatrix(data=moe.w13_qdata, scale=moe.w13_scale, group_size=128)
        w2 = ExpertMatrix(data=moe.w2_qdata, scale=moe.w2_scale, group_size=128)
        for m in (1, 4, 16):
            x = torch.randn(m, d, generator=gen).to(torch.bfloat16).cuda()
            weights, ids = torch.randn(m, e, generator=gen).cuda().softmax(-1).topk(k)
            r = Routing(topk_weights=weights.contiguous(), topk_ids=ids.contiguous())
            with torch.no_grad():
                fused = host_us(lambda: fused_moe(x, w13, w2, r, cfg))
                layer = host_us(lambda: moe(x))
                given = host_us(
                    lambda: moe(x, topk_weights=r.topk_weights, topk_ids=r.topk_ids)
                )
            print(
                f"{name} M={m}: fused_moe {fused:.1f} us, layer (own router) {layer:.1f} us, layer (given top-k) {given:.1f} us of host a call"
            )
            if m == 1:
                calls: tuple[tuple[str, Callable[[], object]], ...] = (
                    ("fused_moe", lambda: fused_moe(x, w13, w2, r, cfg)),
                    ("layer", lambda: moe(x)),
                )
                for label, fn in calls:
                    prof = cProfile.Profile()
                    with torch.no_grad():
                        prof.enable()
                        for _ in range(300):
                            fn()
                        prof.disable()
                    torch.cuda.synchronize()
                    text = io.StringIO()
                    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(
                        28
                    )
                    print(f"--- cProfile, {name} M=1 {label}, 300 calls, by own time")
                    print("\n".join(text.getvalue().splitlines()[6:]))


if __name__ == "__main__":
    main()
