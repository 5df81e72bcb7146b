"""The main job: quantize one real-shaped MoE layer, run it, report error, memory, speed.

Float weights are generated expert by expert from a seed and quantized at once, so peak
memory stays near the int4 size even for DeepSeek-V3's 22 GB bf16 layer; the float
reference regenerates only the experts the tokens were routed to.
Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts.
"""

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Final, TextIO

import attrs
import torch

from backends.base import DeviceInfo
from backends.registry import select_backend
from core.config import MoEConfig
from core.errors import ConfigError
from core.layout import CANONICAL_LAYOUT
from core.quantize import quantize_tensor
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights
from modules.int4_moe import Int4MoE

MODELS: Final[dict[str, MoEConfig]] = {
    "tiny": MoEConfig(num_experts=8, top_k=2, hidden_size=512, intermediate_size=1024),
    "mixtral-8x7b": MoEConfig(
        num_experts=8, top_k=2, hidden_size=4096, intermediate_size=14336
    ),
    "qwen3-30b-a3b": MoEConfig(
        num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768
    ),
    "qwen3-235b-a22b": MoEConfig(
        num_experts=128, top_k=8, hidden_size=4096, intermediate_size=1536
    ),
    "deepseek-v3": MoEConfig(
        num_experts=256,
        top_k=8,
        hidden_size=7168,
        intermediate_size=2048,
        scoring_func="sigmoid",
        num_expert_group=8,
        topk_group=4,
        routed_scaling_factor=2.5,
    ),
    "gpt-oss-20b": MoEConfig(
        num_experts=32,
        top_k=4,
        hidden_size=2880,
        intermediate_size=2880,
        activation="swigluoai",
    ),
}
"""One MoE layer of each public model (no tensor parallelism; w13 = gate + up)."""


@attrs.frozen(kw_only=True)
class DemoOptions:
    """What the demo runs.

    Attributes:
        model: key of ``MODELS``.
        tokens: tokens per call.
        scheme: int4 scheme.
        backend: `auto` or a registered backend name.
        device: torch device string.
        dtype: activation and scale dtype.
        iters: timed calls.
        seed: seed of weights and inputs.
    """

    model: str = attrs.field(validator=attrs.validators.in_(tuple(MODELS)))
    tokens: int = attrs.field(validator=attrs.validators.ge(1))
    scheme: Int4Scheme
    backend: str
    device: str
    dtype: torch.dtype
    iters: int = attrs.field(validator=attrs.validators.ge(1))
    seed: int = 0


def _expert_float(
    config: MoEConfig, expert: int, options: DemoOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``expert``'s float32 ``(2F, D)`` and ``(D, F)`` weights, from the seed."""
    gen = torch.Generator(device="cpu").manual_seed(options.seed * 100_003 + expert)
    f, d = config.intermediate_size, config.hidden_size
    w13 = torch.randn(2 * f, d, generator=gen) / math.sqrt(d)
    w2 = torch.randn(d, f, generator=gen) / math.sqrt(f)
    return w13.to(options.device), w2.to(options.device)


def quantize_streaming(
    config: MoEConfig, options: DemoOptions, progress: Callable[[str], None]
) -> QuantizedExpertWeights:
    """Generate and quantize one expert at a time into canonical tensors."""
    parts: dict[str, list[torch.Tensor]] = {}
    for expert in range(config.num_experts):
        progress(f"quantizing experts {expert + 1}/{config.num_experts}")
        for prefix, tensor in zip(
            ("w13", "w2"), _expert_float(config, expert, options), strict=True
        ):
            qdata, qp = quantize_tensor(
                tensor, options.scheme, scale_dtype=options.dtype
            )
            named = {"qdata": qdata, "scale": qp.scale, "zero_point": qp.zero_point}
            for name, value in named.items():
                if value is not None:
                    parts.setdefault(f"{prefix}_{name}", []).append(value)
    stacked = {name: torch.stack(values) for name, values in parts.items()}
    return QuantizedExpertWeights(
        w13_qdata=stacked["w13_qdata"],
        w13_scale=stacked["w13_scale"],
        w13_zero_point=stacked.get("w13_zero_point"),
        w2_qdata=stacked["w2_qdata"],
        w2_scale=stacked["w2_scale"],
        w2_zero_point=stacked.get("w2_zero_point"),
        scheme=options.scheme,
    )


def float_layer_output(
    x_TD: torch.Tensor, routing: Routing, config: MoEConfig, options: DemoOptions
) -> torch.Tensor:
    """The unquantized layer in float32, regenerating only the routed experts."""
    from core.activation import apply_activation

    out_TD = torch.zeros(x_TD.shape, dtype=torch.float32, device=x_TD.device)
    ids_N = routing.topk_ids.flatten()
    for expert in torch.unique(ids_N).tolist():
        pairs = (ids_N == expert).nonzero().flatten()
        tokens = pairs // config.top_k
        w13, w2 = _expert_float(config, expert, options)
        x_ND = x_TD[tokens].float()
        weight_N1 = routing.topk_weights.flatten()[pairs, None]
        y_ND = apply_activation(x_ND @ w13.T, config) @ w2.T
        out_TD.index_add_(0, tokens, y_ND * weight_N1)
    return out_TD


def _sync(device: str) -> None:
    """Wait for the device's queued work, so timings cover it (CUDA and XPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("xpu") and hasattr(torch, "xpu"):
        torch.xpu.synchronize()


def time_call(fn: Callable[[], torch.Tensor], options: DemoOptions) -> float:
    """Median milliseconds of ``options.iters`` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(options.iters):
        _sync(options.device)
        start = time.perf_counter()
        fn()
        _sync(options.device)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _rel(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref64 = ref.double()
    return float((out.double() - ref64).norm() / ref64.norm())


def run_demo(
    options: DemoOptions, stream: TextIO = sys.stdout
) -> dict[str, float | str]:
    """Run the demo and write a report to ``stream``; returns the numbers.

    Raises:
        BackendUnavailableError: where ``options.backend`` cannot run the layer (with
            its reason), before any expert is quantized.
    """
    config = MODELS[options.model]
    select_backend(  # what Int4MoE will pick, asked before the minutes of quantizing
        config,
        options.scheme,
        CANONICAL_LAYOUT,
        DeviceInfo.of(options.device),
        dtype=options.dtype,
        prefer=options.backend,
    )
    progress = _progress_writer(stream)
    t0 = time.perf_counter()
    weights = quantize_streaming(config, options, progress)
    progress(
        f"quantized {config.num_experts} experts in {time.perf_counter() - t0:.1f} s\n"
    )
    moe = Int4MoE.from_quantized(weights, config=config, backend=options.backend)
    gen = torch.Generator(device="cpu").manual_seed(options.seed + 1)
    x_TD = torch.randn(options.tokens, config.hidden_size, generator=gen).to(
        options.device
    )
    x_TD = x_TD.to(options.dtype)
    logits_TE = torch.randn(options.tokens, config.num_experts, generator=gen).to(
        options.device
    )
    y_TD = moe(x_TD, router_logits=logits_TE)
    routing = route_topk(logits_TE, config)
    progress("computing the float layer and the int4 oracle\n")
    float_err = _rel(float_layer_output(x_TD, routing, config, options), y_TD)
    kernel_err = _rel(
        moe_forward_reference(x_TD.float(), weights, routing, config), y_TD
    )
    calls = "call" if options.iters == 1 else "calls"
    progress(f"timing {options.iters} {calls} on {moe.backend_name}\n")
    ms = time_call(lambda: moe(x_TD, router_logits=logits_TE), options)
    bf16_bytes = (
        config.num_experts * 3 * config.hidden_size * config.intermediate_size * 2
    )
    result: dict[str, float | str] = {
        "model": options.model,
        "backend": str(moe.backend_name),
        "scheme": options.scheme.name,
        "tokens": options.tokens,
        "rel_err_vs_float": float_err,
        "rel_err_vs_int4_oracle": kernel_err,
        "int4_bytes": weights.nbytes(),
        "backend_extra_bytes": _backend_extra_bytes(moe),
        "bf16_bytes": bf16_bytes,
        "ms_per_call": ms,
    }
    _report(result, config, stream)
    return result


def _progress_writer(stream: TextIO) -> Callable[[str], None]:
    """Progress lines at most once a second (rewritten in place on a terminal)."""
    last = [time.perf_counter()]
    live = stream.isatty()

    def write(message: str) -> None:
        now = time.perf_counter()
        done = message.endswith("\n")
        if done or now - last[0] > 1.0:
            stream.write(
                ("\r" if live else "") + message + ("" if done or live else "\n")
            )
            stream.flush()
            last[0] = now

    return write


def _backend_extra_bytes(moe: Int4MoE) -> int:
    """Bytes the backend's prepared form holds beside the int4 buffers (its own copy)."""
    cache = moe._prepared  # the demo reports what the layer holds, cache included
    return 0 if cache is None else cache.prepared.extra_bytes()


def _memory_line(result: dict[str, float | str]) -> str:
    """The int4 buffers, the backend's own copy if any, and the bf16 weights' size."""
    gib = 1024**3
    int4, bf16 = float(result["int4_bytes"]), float(result["bf16_bytes"])
    extra = float(result["backend_extra_bytes"])
    held = int4 + extra
    copy = (
        f" + {extra / gib:.3f} GiB {result['backend']}'s own copy = {held / gib:.3f} GiB"
        if extra
        else ""
    )
    return (
        f"memory     int4 {int4 / gib:.3f} GiB{copy} vs bf16 {bf16 / gib:.3f} GiB "
        f"({bf16 / held:.2f}x smaller)"
    )


def _report(result: dict[str, float | str], config: MoEConfig, stream: TextIO) -> None:
    lines = [
        f"model      {result['model']}: E={config.num_experts} top_k={config.top_k} "
        f"D={config.hidden_size} F={config.intermediate_size} activation={config.activation}",
        f"scheme     {result['scheme']}   backend {result['backend']}   tokens {result['tokens']}",
        f"error      {float(result['rel_err_vs_float']):.4f} relative L2 vs the float layer "
        f"(int4 rounding), {float(result['rel_err_vs_int4_oracle']):.2e} vs the float32 "
        "int4 oracle (kernel)",
        _memory_line(result),
        f"speed      {float(result['ms_per_call']):.3f} ms per call (median)",
    ]
    stream.write("\n".join(lines) + "\n")


def parse_scheme(text: str) -> Int4Scheme:
    """``sym-g32``, ``asym-g128``, ``sym-g-1`` ... to an ``Int4Scheme``."""
    mapping, _, group = text.partition("-g")
    if mapping not in ("sym", "asym") or not group.lstrip("-").isdigit():
        raise ConfigError(
            f"scheme must look like `sym-g32` or `asym-g128`, got {text!r}"
        )
    kind = Int4Mapping.SYMMETRIC if mapping == "sym" else Int4Mapping.ASYMMETRIC
    return Int4Scheme(mapping=kind, group_size=int(group))
