"""CPU benchmark: one Qwen3-30B-A3B MoE layer, cpu-int4 vs reference vs a bf16 loop.

Shape legend: ``T`` tokens (M in the table), ``D`` hidden, ``F`` intermediate,
``H`` = 2F, ``E`` experts, ``K`` top_k, ``N`` routed pairs.

Run from the repository root: ``python -m bench.bench_cpu [--reps 7] [--json out.json]``.
Variants are interleaved (A, B, C, A, B, C, ...) and the median is reported, because
the machine is shared and timings drift.
"""

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable

import torch

from backends.cpu_int4 import CPUInt4Backend
from backends.reference import ReferenceBackend
from core.activation import apply_activation
from core.config import MoEConfig
from core.quantize import dequantize_expert_weights
from core.routing import Routing, route_topk, sort_tokens_by_expert
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights

QWEN3_30B_A3B = MoEConfig(
    num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768
)
SCHEME = Int4Scheme(mapping="symmetric", group_size=128)
TOKENS = (1, 4, 16, 64, 256)
DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}

Forward = Callable[[torch.Tensor, Routing], torch.Tensor]


def make_weights(
    config: MoEConfig, scheme: Int4Scheme, generator: torch.Generator
) -> QuantizedExpertWeights:
    """Random canonical int4 experts (uniform codes, scales ~ 1/(8*sqrt(K)))."""
    e, d, f = config.num_experts, config.hidden_size, config.intermediate_size

    def codes(rows: int, k: int) -> torch.Tensor:
        return torch.randint(
            0, 256, (e, rows, k // 2), generator=generator, dtype=torch.uint8
        )

    def scales(rows: int, k: int) -> torch.Tensor:
        groups = scheme.num_groups(k)
        s = (0.5 + torch.rand(e, rows, groups, generator=generator)) / (
            8 * math.sqrt(k)
        )
        return s.to(torch.bfloat16)

    return QuantizedExpertWeights(
        w13_qdata=codes(2 * f, d),
        w13_scale=scales(2 * f, d),
        w13_zero_point=None,
        w2_qdata=codes(d, f),
        w2_scale=scales(d, f),
        w2_zero_point=None,
        scheme=scheme,
    )


def make_bf16_loop(weights: QuantizedExpertWeights, config: MoEConfig) -> Forward:
    """The baseline: bf16 matmuls per expert with tokens, on weights dequantized once."""
    w13_EHD, w2_EDF = dequantize_expert_weights(weights, dtype=torch.bfloat16)

    def forward(hidden_TD: torch.Tensor, routing: Routing) -> torch.Tensor:
        k = routing.top_k
        out_TD = torch.zeros(hidden_TD.shape, dtype=torch.float32)
        order_N, counts_E = sort_tokens_by_expert(routing.topk_ids, config.num_experts)
        weights_N = routing.topk_weights.flatten().float()
        ends_E = torch.cumsum(counts_E, 0).tolist()
        x_TD = hidden_TD.to(torch.bfloat16)
        for expert in torch.nonzero(counts_E).flatten().tolist():
            end = ends_E[expert]
            pairs = order_N[end - int(counts_E[expert]) : end]
            tokens = pairs // k
            h_NH = x_TD[tokens] @ w13_EHD[expert].T
            y_ND = apply_activation(h_NH, config) @ w2_EDF[expert].T
            out_TD.index_add_(0, tokens, y_ND.float() * weights_N[pairs, None])
        return out_TD.to(hidden_TD.dtype)

    return forward


def make_variants(
    weights: QuantizedExpertWeights, config: MoEConfig, dtype: torch.dtype
) -> dict[str, Forward]:
    """The three forwards under test, prepared once (packing is outside the timing)."""
    cpu = CPUInt4Backend()
    ref = ReferenceBackend()
    cpu_ready = cpu.prepare(weights, config, dtype=dtype)
    ref_ready = ref.prepare(weights, config, dtype=dtype)
    return {
        "cpu-int4": lambda x, r: cpu.apply(x, cpu_ready, r),
        "reference": lambda x, r: ref.apply(x, ref_ready, r),
        "bf16-loop": make_bf16_loop(weights, config),
    }


def rel_l2(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """``||actual - reference|| / ||reference||`` in float64."""
    ref = reference.double()
    return float((actual.double() - ref).norm() / ref.norm().clamp(min=1e-30))


def time_interleaved(
    variants: dict[str, Forward], hidden_TD: torch.Tensor, routing: Routing, reps: int
) -> dict[str, list[float]]:
    """Milliseconds per call, the variants run in turn ``reps`` times after warm-up."""
    for fn in variants.values():
        fn(hidden_TD, routing)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn(hidden_TD, routing)
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def bench_tokens(
    variants: dict[str, Forward],
    config: MoEConfig,
    t: int,
    *,
    reps: int,
    generator: torch.Generator,
    dtype: torch.dtype,
) -> dict[str, object]:
    """Check every variant against reference at ``t`` tokens, then time them."""
    hidden_TD = torch.randn(t, config.hidden_size, generator=generator).to(dtype)
    routing = route_topk(
        torch.randn(t, config.num_experts, generator=generator), config
    )
    ref = variants["reference"](hidden_TD, routing)
    errors = {
        name: rel_l2(ref, fn(hidden_TD, routing)) for name, fn in variants.items()
    }
    times = time_interleaved(variants, hidden_TD, routing, reps)
    medians = {name: statistics.median(v) for name, v in times.items()}
    spread = {name: (min(v), max(v)) for name, v in times.items()}
    experts = int(torch.unique(routing.topk_ids).numel())
    return {"M": t, "experts_used": experts, "rel_l2_vs_reference": errors,
            "median_ms": medians, "min_max_ms": spread}  # fmt: skip


def main() -> None:
    """Run the table and print it as JSON (and write ``--json`` if given)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--json", default="")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    config = QWEN3_30B_A3B
    weights = make_weights(config, SCHEME, generator)
    start = time.perf_counter()
    dtype = DTYPES[args.dtype]
    variants = make_variants(weights, config, dtype)
    setup_s = time.perf_counter() - start
    rows = [
        bench_tokens(
            variants, config, t, reps=args.reps, generator=generator, dtype=dtype
        )
        for t in args.tokens
    ]
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "dtype": args.dtype, "scheme": SCHEME.name, "config": str(config), "reps": args.reps,
              "setup_s_all_variants": setup_s, "rows": rows}  # fmt: skip
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    print(text)  # noqa: T201 - a script's output


if __name__ == "__main__":
    main()
