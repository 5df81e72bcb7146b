"""Host-side cost of one forward with every Triton kernel launch stubbed out.

Runs on any CPU: ``python bench/probe_host.py``. Every ``@triton.jit`` (and Gluon)
kernel of ``backends.triton`` is replaced by a no-op, so what is timed is this
library's Python between launches (tile choice, buffers, argument packing) and, for
the layer, its checks, the router and the CPU torch ops of routing; not Triton's
launcher and not the GPU. On the GPU each torch op of routing is a launch as well.
Qwen3-30B-A3B's layer (the launch-bound one), bf16, M = 1 (the byte GEMV), 4 (the
int32-word GEMV) and 16 (the GEMM path): ``fused_moe`` alone (given routing), then
the ``Int4MoE`` layer with ``backend="triton-w4a16"`` and its own router (the
interpreter lets the backend take CPU tensors). The interpreter runs its own small
byte-GEMV tiles, so at M = 1 and 4 ``fused_moe`` is timed as well on the word-GEMV
tiles an H200 picks (``pick_gemv_tiles`` outside the interpreter: the paired GEMV, by
TMA at M = 4), the path its host runs (at M = 16 an H200 takes the GEMM path).
"""

# ruff: noqa: D103, T201
# A measuring script, not library code: print is its output.

import importlib
import os
import pkgutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: CPU tensors run
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import backends.triton
import backends.triton._fused as fused
from backends.triton._fused import fused_moe
from backends.triton._launch import ExpertMatrix
from backends.triton._tiles import GemvTiles
from core.config import MoEConfig
from core.routing import Routing
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights
from modules import Int4MoE

E, K, D, F, GROUP = 128, 8, 2048, 768, 128


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid: object) -> object:
        return lambda *args, **kwargs: None


def _stub_kernels() -> None:
    """Every ``@triton.jit`` kernel (and Gluon's) of ``backends.triton`` made a no-op.

    Under the interpreter ``triton.jit`` gives ``InterpretedFunction``s; the modules
    that import a kernel by name hold it too, so every module's names are replaced.
    """
    import triton

    for info in pkgutil.iter_modules(backends.triton.__path__, "backends.triton."):
        module = importlib.import_module(info.name)
        for name, value in list(vars(module).items()):
            kernel = type(value).__name__ == "InterpretedFunction"
            if kernel or isinstance(value, triton.JITFunction):
                setattr(module, name, _NoLaunch())


def _time(fn: Callable[[], object], reps: int = 2000) -> float:
    for _ in range(reps // 20):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


def _gpu_gemv_tiles(num_pairs: int, w13: ExpertMatrix) -> GemvTiles:
    """The GEMV tiles ``pick_gemv_tiles`` gives outside the interpreter."""
    with mock.patch.object(fused, "is_interpreting", return_value=False):
        return fused.pick_gemv_tiles(num_pairs, w13)


def main() -> None:
    _stub_kernels()
    cfg = MoEConfig(num_experts=E, top_k=K, hidden_size=D, intermediate_size=F)
    codes13 = torch.zeros(E, 2 * F, D // 2, dtype=torch.uint8)
    codes2 = torch.zeros(E, D, F // 2, dtype=torch.uint8)
    scale13 = torch.full((E, 2 * F, D // GROUP), 0.01, dtype=torch.bfloat16)
    scale2 = torch.full((E, D, F // GROUP), 0.01, dtype=torch.bfloat16)
    m13 = ExpertMatrix(data=codes13, scale=scale13, group_size=GROUP)
    m2 = ExpertMatrix(data=codes2, scale=scale2, group_size=GROUP)
    weights = QuantizedExpertWeights(
        w13_qdata=codes13, w13_scale=scale13, w13_zero_point=None,
        w2_qdata=codes2, w2_scale=scale2, w2_zero_point=None,
        scheme=Int4Scheme(group_size=GROUP),
    )  # fmt: skip
    layer = Int4MoE.from_quantized(
        weights, config=cfg, backend="triton-w4a16",
        gate_weight=torch.randn(E, D) * 0.02,
    )  # fmt: skip
    for m in (1, 4, 16):
        x = torch.randn(m, D).to(torch.bfloat16)
        topk_weights, ids = torch.topk(torch.rand(m, E), K)
        routing = Routing(topk_weights=topk_weights, topk_ids=ids)
        alone = _time(lambda: fused_moe(x, m13, m2, routing, cfg))  # noqa: B023
        gpu = ""
        if m < 16:
            tiles = _gpu_gemv_tiles(ids.numel(), m13)
            us = _time(lambda: fused_moe(x, m13, m2, routing, cfg, gemv_tiles=tiles))  # noqa: B023
            gpu = f" (H200 tiles {us:.1f} us)"
        with torch.inference_mode():
            whole = _time(lambda: layer(x))  # noqa: B023
        print(
            f"M={m}: fused_moe {alone:.1f} us{gpu}, Int4MoE layer {whole:.1f} us "
            "a forward on the host, kernels stubbed"
        )


if __name__ == "__main__":
    main()
