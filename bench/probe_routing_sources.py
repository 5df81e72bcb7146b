"""Time the Int4MoE layer on a CUDA GPU by routing source: what the topk range check costs.

``python bench/probe_routing_sources.py`` on a GPU. Qwen3-30B-A3B's layer (the
launch-bound one: a few us show), bf16, M = 1, 4 and 16, random weights, as the
module runs it (``backend="triton-w4a16"``), eager and replayed in a CUDA graph
(median of many replays, L2 not flushed: the differences, not the absolute times, are
what this probe is for). Sources: the module's own router (``gate``), given
``router_logits``, given ``topk_weights``/``topk_ids`` (range-checked on the device by
``torch._assert_async``, core/validate.py) and the same with that check off
(``check_topk_ids=False``, as ``replace_moe_blocks``' ``routing="model"`` sets it), to
see its cost alone; and the first two with torch's routing ops (``gate-torch``,
``logits-torch``) instead of the fused routing kernel (``route_topk_fused``). Then
routing alone, torch's ops against the kernel, for Qwen3-30B-A3B's softmax top-8 of 128
and DeepSeek-V3's grouped sigmoid top-8 of 256 with a correction bias.
"""

# ruff: noqa: D103, T201
# A measuring script, not library code: print is its output.

import contextlib
import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from backends.triton import route_topk_fused
from core.config import MoEConfig
from core.quantize import quantize_expert_weights
from core.routing import TopkRouter, route_topk
from core.scheme import INT4_SYM_G128
from modules import Int4MoE, int4_moe

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


def _torch_router(device: torch.device) -> TopkRouter:
    """The module's router made torch's ops (``route_topk``) on every device."""
    return route_topk


def random_layer(cfg: MoEConfig, gen: torch.Generator) -> Int4MoE:
    """A CUDA ``Int4MoE`` (``triton-w4a16``) of random int4 experts and router."""
    e, d, f = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    q = quantize_expert_weights(
        torch.randn(e, 2 * f, d, generator=gen) * 0.02,
        torch.randn(e, d, f, generator=gen) * 0.02,
        INT4_SYM_G128,
        scale_dtype=torch.bfloat16,
    )
    return Int4MoE.from_quantized(
        q, config=cfg, gate_weight=torch.randn(e, d, generator=gen) * 0.02,
        backend="triton-w4a16",
    ).cuda()  # fmt: skip


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    cfg = MoEConfig(num_experts=E, top_k=K, hidden_size=D, intermediate_size=F)
    moe = random_layer(cfg, gen)
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
        variants = [(name, kwargs, True) for name, kwargs in sources.items()]
        variants += [("gate-torch", {}, False)]
        variants += [("logits-torch", sources["router_logits"], False)]
        for name, kwargs, fused in variants:
            moe.check_topk_ids = name != "topk-trusted"
            router: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
            if not fused:
                router = mock.patch.object(int4_moe, "fused_router_for", _torch_router)
            try:
                with torch.no_grad(), router:
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


def routing_alone() -> None:
    """``route_topk`` against ``route_topk_fused`` alone, eager and replayed, us."""
    qwen = MoEConfig(num_experts=128, top_k=8, hidden_size=D, intermediate_size=F)
    deepseek = MoEConfig(
        num_experts=256, top_k=8, hidden_size=D, intermediate_size=F,
        scoring_func="sigmoid", num_expert_group=8, topk_group=4,
        routed_scaling_factor=2.5,
    )  # fmt: skip
    print("routing alone   M     torch eager  fused eager  torch graph  fused graph")
    for name, cfg in (("qwen3-30b-a3b", qwen), ("deepseek-v3", deepseek)):
        bias = None
        if cfg.scoring_func == "sigmoid":
            bias = torch.randn(cfg.num_experts, device="cuda") * 0.1
        for m in (1, 16, 256, 4096):
            logits = torch.randn(m, cfg.num_experts, device="cuda")
            fused = route_topk_fused(logits, cfg, correction_bias=bias)
            torch_ = route_topk(logits, cfg, correction_bias=bias)
            same = bool(fused.topk_ids.eq(torch_.topk_ids).all())
            row = []
            for router in (route_topk, route_topk_fused):
                call = functools.partial(router, logits, cfg, correction_bias=bias)
                row.append(_time_us(call, 200))
            for router in (route_topk, route_topk_fused):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    router(logits, cfg, correction_bias=bias)
                row.append(_time_us(graph.replay, 500))
            cells = " ".join(f"{v:12.1f}" for v in row)
            print(f"{name:<15} {m:<5} {cells}  same ids: {same}")


if __name__ == "__main__":
    main()
    routing_alone()
