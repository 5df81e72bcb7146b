"""Host-side cost of one ``fused_moe`` call with every kernel launch stubbed out.

Runs on any CPU: ``python bench/probe_host.py``. The Triton kernels are replaced by
no-ops, so what is timed is this library's Python between launches (tile choice,
buffers, argument packing), not Triton's launcher or the GPU. Qwen3-30B-A3B's layer
(the launch-bound one), bf16, M = 1 (the byte GEMV), 4 (the int32-word GEMV) and 16
(the GEMM path).
"""

# ruff: noqa: D103, T201
# A measuring script, not library code: print is its output.

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import backends.triton._kernels as kernels
import backends.triton._kernels_gemv as kernels_gemv
import backends.triton._kernels_gemv_words as kernels_gemv_words
from backends.triton._fused import fused_moe
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig
from core.routing import Routing


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid: object) -> object:
        return lambda *args, **kwargs: None


def main() -> None:
    for name in ("_moe_gemm_kernel", "_count_experts_kernel", "_align_blocks_kernel",
                 "_reduce_topk_kernel"):  # fmt: skip
        setattr(kernels, name, _NoLaunch())
    kernels_gemv._moe_gemv_kernel = _NoLaunch()  # type: ignore[assignment]
    kernels_gemv_words._moe_gemv_words_kernel = _NoLaunch()  # type: ignore[assignment]
    e, k, d, f = 128, 8, 2048, 768
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)

    def matrix(rows: int, cols: int) -> ExpertMatrix:
        data = torch.zeros(e, rows, cols // 2, dtype=torch.uint8)
        scale = torch.ones(e, rows, cols // 128, dtype=torch.bfloat16)
        return ExpertMatrix(data=data, scale=scale, group_size=128)

    w13, w2 = matrix(2 * f, d), matrix(d, f)
    for m in (1, 4, 16):
        x = torch.randn(m, d).to(torch.bfloat16)
        weights, ids = torch.topk(torch.rand(m, e), k)
        routing = Routing(topk_weights=weights, topk_ids=ids)
        for _ in range(100):
            fused_moe(x, w13, w2, routing, cfg)
        reps = 2000
        start = time.perf_counter()
        for _ in range(reps):
            fused_moe(x, w13, w2, routing, cfg)
        us = (time.perf_counter() - start) / reps * 1e6
        print(f"M={m}: {us:.1f} us per forward on the host, kernels stubbed")


if __name__ == "__main__":
    main()
