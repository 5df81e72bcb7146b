"""Time the Int4MoE layer on a CUDA GPU by routing source: what the topk range check costs.

``python bench/probe_routing_sources.py`` on a GPU. Qwen3-30B-A3B's layer (the
launch-bound one: a few us show), bf16, M = 1, 4 and 16, random weights, as the
module runs it (``backend="triton-w4a16"``), eager and replayed in a CUDA graph
(median of many replays, L2 not flushed: the differences, not the absolute times, are
what this probe is for). Sources: the module's own router (``gate``), given
``router_logits``, given ``topk_weights``/``topk_ids`` (range-checked on the device by
``torch._assert_async``, core/validate.py) and the same with that check off
(``check_topk_ids=False``, as ``replace_moe_blocks``' ``routing="model"`` sets it), to
see its cost alone.
"""

# ruff: noqa: D103, T201
# A measuring script, not library code: print is its output.

import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from core.config import MoEConfig
from core.quantize import quantize_expert_weights
from core.scheme import INT4_SYM_G128
from modules import Int4MoE

E, K, D, F = 128, 8, 2048, 768


def _time_us(fn: Callable[[], object], reps: int) -> float:
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves Event unannotated
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves Event unannotated
    times: list[float] = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)) * 1e3)
    return statistics.median(times)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    cfg = MoEConfig(num_experts=E, top_k=K, hidden_size=D, intermediate_size=F)
    q = quantize_expert_weights(
        torch.randn(E, 2 * F, D, generator=gen) * 0.02,
        torch.randn(E, D, F, generator=gen) * 0.02,
        INT4_SYM_G128,
        scale_dtype=torch.bfloat16,
    )
    moe = Int4MoE.from_quantized(
        q, config=cfg, gate_weight=torch.randn(E, D, generator=gen) * 0.02,
        backend="triton-w4a16",
    ).cuda()  # fmt: skip
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    print("M    source         eager us   graph us")
    for m in (1, 4, 16):
        x = torch.randn(m, D, generator=gen).to(torch.bfloat16).cuda()
        logits = torch.randn(m, E, generator=gen).cuda()
        weights, ids = logits.softmax(-1).topk(K)
        sources: dict[str, dict[str, torch.Tensor]] = {
            "gate": {},
            "router_logits": {"router_logits": logits},
            "topk": {"topk_weights": weights.contiguous(), "topk_ids": ids.contiguous()},
            "topk-trusted": {
                "topk_weights": weights.contiguous(), "topk_ids": ids.contiguous()
            },
        }  # fmt: skip
        for name, kwargs in sources.items():
            moe.check_topk_ids = name != "topk-trusted"
            try:
                with torch.no_grad():
                    for _ in range(3):
                        moe(x, **kwargs)
                    torch.cuda.synchronize()
                    eager = _time_us(functools.partial(moe, x, **kwargs), 200)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        moe(x, **kwargs)
                    replay = _time_us(graph.replay, 500)
            finally:
                moe.check_topk_ids = True
            print(f"{m:<4} {name:<14} {eager:8.1f} {replay:10.1f}")


if __name__ == "__main__":
    main()
