"""Benchmark one MoE layer of public models on one GPU: triton-w4a16, triton-emulation
and the anchors a user would otherwise pick, against the byte/FLOP floor of the same run.

Run on the GPU from the repository root: ``python bench/bench_gpu.py [model ...]``.
Writes bench/RESULTS.md, bench/results.json and bench/<model>.png (and copies to $OUT).
Shape legend: ``T`` tokens (M), ``D`` hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k.
"""

# ruff: noqa: B023, D103, D205, F821, ICN001, T201, TID253
# A GPU script, not library code: print is its output, triton is needed at import, and
# each lambda is timed inside the loop iteration that defines it.

import datetime
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict, TypeVar

import torch
import triton
import triton.testing as tt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_report import MAX_RELERR, format_row, plot, results_markdown

from backends.triton._fused import fused_moe, use_dequant, use_gemv
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig
from core.quantize import dequantize_expert
from core.reference import moe_forward_reference
from core.routing import Routing
from core.scheme import INT4_SYM_G128
from core.weights import QuantizedExpertWeights

MODELS = {  # name: (E, top_k, D, F)
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-235b-a22b": (128, 8, 4096, 1536),
    "deepseek-v3": (256, 8, 7168, 2048),
}
MS = [1, 4, 16, 64, 256, 1024, 4096]


class GemvLoopVariant(TypedDict, total=False):
    """The ``GemvTiles`` fields a loop variant of the decode GEMV sets."""

    prefetch: bool
    loop_stages: int
    w2_split: int


GEMV_LOOP_VARIANTS: dict[str, GemvLoopVariant] = {
    "base": {},
    "prefetch": {"prefetch": True},
    "stages2": {"loop_stages": 2},
    "stages3": {"loop_stages": 3},
    "stages4": {"loop_stages": 4},
    "w2-unsplit": {"w2_split": 1},
}
"""Loop variants of the decode GEMV (``GEMV_VARIANT`` picks one; sweep_tiles.py times them)."""
GROUP = 128
HERE = Path(__file__).resolve().parent
FLUSH_MODE = os.environ.get("BENCH_FLUSH", "read")
"""How ``flush_l2`` evicts L2 before each timed replay: ``read`` (the default since
2026-12-04) or ``write`` (before)."""


@functools.cache
def flush_buffer() -> torch.Tensor:
    """512 MB on the GPU (its L2 holds about 60), allocated on first use."""
    return torch.empty(512 * 1024**2, dtype=torch.uint8, device="cuda")


def flush_l2() -> None:
    """Evict L2 before a timed replay: zero ``flush_buffer()``, or sum it (``FLUSH_MODE``).

    ``read`` leaves L2 holding clean lines, nothing to write back.
    """
    if FLUSH_MODE == "read":
        flush_buffer().view(torch.int32).sum()
    else:
        flush_buffer().zero_()


def copy_bandwidth() -> float:
    a = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = tt.do_bench(lambda: b.copy_(a), warmup=50, rep=200, return_mode="median")
    return 2 * a.numel() / (ms * 1e-3)


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = tt.do_bench(lambda: a @ b, warmup=50, rep=200, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3)


def random_int4(e: int, d: int, f: int) -> QuantizedExpertWeights:
    """Random codes and bf16 group-128 scales (symmetric), built on the GPU."""

    def codes(*shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")

    def scales(n: int, k: int) -> torch.Tensor:
        s = torch.rand(e, n, k // GROUP, device="cuda") * 0.5 + 0.75
        root: float = k**0.5  # typeshed types int ** float as Any (it may be complex)
        return (s / (4 * root)).to(torch.bfloat16)

    return QuantizedExpertWeights(
        w13_qdata=codes(e, 2 * f, d // 2),
        w13_scale=scales(2 * f, d),
        w13_zero_point=None,
        w2_qdata=codes(e, d, f // 2),
        w2_scale=scales(d, f),
        w2_zero_point=None,
        scheme=INT4_SYM_G128,
    )


def int4_layer(
    name: str,
) -> tuple[MoEConfig, QuantizedExpertWeights, ExpertMatrix, ExpertMatrix]:
    """One model's layer config, random int4 experts, and their two GEMM operands."""
    e, k, d, f = MODELS[name]
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    q = random_int4(e, d, f)
    w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    return cfg, q, w13, w2


def dense_bf16(q: QuantizedExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 copies of all experts, one expert at a time (bounded float32 temporaries:
    all at once needs 4x DeepSeek-V3's 22.5 GB, more than an 80 GB card holds).
    """
    e, n13, half13 = q.w13_qdata.shape
    _, n2, half2 = q.w2_qdata.shape
    w13 = torch.empty(e, n13, 2 * half13, dtype=torch.bfloat16, device="cuda")
    w2 = torch.empty(e, n2, 2 * half2, dtype=torch.bfloat16, device="cuda")
    for i in range(e):
        w13[i], w2[i] = dequantize_expert(q, i, dtype=torch.bfloat16)
    return w13, w2


def route(m: int, e: int, k: int) -> Routing:
    """Uniform random routing: softmax top-k of Gaussian logits, renormalized."""
    w, ids = torch.topk(torch.softmax(torch.randn(m, e, device="cuda"), -1), k, dim=-1)
    return Routing(topk_weights=w / w.sum(-1, keepdim=True), topk_ids=ids)


def grouped_mm_anchor(
    x: torch.Tensor, w13t: torch.Tensor, w2t: torch.Tensor, routing: Routing
) -> torch.Tensor:
    """torch._grouped_mm over bf16 weights; counts by scatter_add (capturable)."""
    e, k = w13t.shape[0], routing.topk_ids.shape[1]
    flat = routing.topk_ids.flatten()
    order = flat.argsort()
    tok = order // k
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32)
    )
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    h = torch._grouped_mm(x[tok], w13t, offs=offs)
    g, u = h.chunk(2, dim=-1)
    y = torch._grouped_mm(
        (torch.nn.functional.silu(g) * u).contiguous(), w2t, offs=offs
    )
    out = torch.zeros_like(x)
    # bf16 weights, as the tinygemm loop: no float32 (N, D) temporary for the anchor
    out.index_add_(0, tok, y * routing.topk_weights.flatten()[order, None].to(y.dtype))
    return out


def tinygemm_pack(
    qdata: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical sym int4 (N, K/2) -> tinygemm packed weight and scales_and_zeros."""
    n, half = qdata.shape
    q = torch.stack([qdata & 15, qdata >> 4], -1).reshape(n, 2 * half).to(torch.int32)
    packed = torch._convert_weight_to_int4pack(
        (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8
    )
    s = scale.float()  # tinygemm: (q - 8) * scale + zero, zero = 0 for symmetric
    sz = torch.stack([s, torch.zeros_like(s)], -1).transpose(0, 1).contiguous()
    return packed, sz.to(torch.bfloat16)


def tinygemm_loop(
    x: torch.Tensor,
    packs13: Sequence[tuple[torch.Tensor, torch.Tensor]],
    packs2: Sequence[tuple[torch.Tensor, torch.Tensor]],
    routing: Routing,
) -> torch.Tensor:
    out = torch.zeros_like(x)
    k = routing.topk_ids.shape[1]
    flat = routing.topk_ids.flatten()
    order = flat.argsort()
    counts = torch.bincount(flat, minlength=len(packs13)).tolist()
    start = 0
    for ex, c in enumerate(counts):
        if c == 0:
            continue
        sel = order[start : start + c]
        t = sel // k
        start += c
        h = torch._weight_int4pack_mm(x[t], *packs13[ex][:1], GROUP, packs13[ex][1])
        g, u = h.chunk(2, dim=-1)
        y = torch._weight_int4pack_mm(
            (torch.nn.functional.silu(g) * u).contiguous(),
            packs2[ex][0],
            GROUP,
            packs2[ex][1],
        )
        out.index_add_(0, t, y * routing.topk_weights.flatten()[sel, None].to(y.dtype))
    return out


def time_eager(fn: Callable[[], object]) -> float:
    return float(tt.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def time_graph(fn: Callable[[], object], reps: int = 50) -> float | None:
    """Median ms of CUDA-graph replays, L2 flushed before each (None if not capturable)."""
    try:
        return replay_graph(fn, reps)[0]
    except RuntimeError:
        return None


_T = TypeVar("_T")


def replay_graph(fn: Callable[[], _T], reps: int = 50) -> tuple[float, _T]:
    """Median ms of CUDA-graph replays, L2 flushed before each, and the graph's output.

    A capture failure raises (the benchmark's functions must all be capturable).
    """
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]  # type: ignore[no-untyped-call]  # torch leaves Event unannotated
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]  # type: ignore[no-untyped-call]  # torch leaves Event unannotated
    for i in range(reps + 5):
        flush_l2()
        if i >= 5:
            starts[i - 5].record()
        graph.replay()
        if i >= 5:
            ends[i - 5].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    return times[len(times) // 2], out


def floor_bytes(m: int, active: int, d: int, f: int) -> float:
    """The active experts' int4 codes and bf16 group scales, and x in and out (bf16).

    Intermediates are not counted: a fully fused kernel need not round-trip them, so
    these are the least bytes any implementation must move.
    """
    return active * 3 * f * d * (0.5 + 2 / GROUP) + 2 * m * d * 2


def floor_ms(
    m: int, active: int, shape: tuple[int, int, int, int], bw: float, rate: float
) -> float:
    """max(``floor_bytes`` / copy bandwidth, FLOPs / bf16 rate), in ms.

    ``shape``: the model's ``(E, top_k, D, F)``, as ``MODELS`` holds it.
    """
    _, k, d, f = shape
    return max(floor_bytes(m, active, d, f) / bw, 2 * m * k * 3 * f * d / rate) * 1e3


def bare_read_ms(nbytes: float) -> float | None:
    """Graph-replayed ms of one ``torch.sum`` over ``nbytes`` (float32), L2 flushed.

    What a kernel that only read the floor's bytes, and did nothing with them, would
    take under the same timing: the floor divides by the copy bandwidth of a 2 GiB
    copy, which short reads do not reach.
    """
    buf = torch.zeros(int(nbytes) // 4, dtype=torch.float32, device="cuda")
    ms = time_graph(lambda: buf.sum())
    del buf
    return ms


def rel_err(ref: torch.Tensor, out: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def probe_variant(
    label: str,
    key: str,
    run: Callable[[], torch.Tensor],
    ref: torch.Tensor,
    floor: float,
    *,
    replay: bool = True,
    width: int = 22,
) -> None:
    """A probe's line for one variant: ``run``'s output checked against ``ref``, then
    timed replayed (else eagerly), in ms and multiples of ``floor``; a variant that
    fails (one may not compile) prints why instead.
    """
    try:
        err = rel_err(ref, run())
        ms = time_graph(run) if replay else time_eager(run)
    except Exception as exc:
        print(f"{label} {key}: FAILED {type(exc).__name__}: {exc}"[:400])
        return
    ratio = f"{ms / floor:.2f}x" if ms else "-"
    print(
        f"{label} {key:{width}s} {ms if ms else float('nan'):8.4f} ms {ratio:>7s}"
        f" err {err:.1e}",
        flush=True,
    )


def probe_inputs(
    name: str, m: int, layer: tuple[object, ...], bw: float
) -> tuple[torch.Tensor, Routing, float, torch.Tensor]:
    """A probe cell's inputs: ``m`` tokens of model ``name``, a uniform routing draw,
    the floor (ms, at copy bandwidth ``bw``) and the float32 reference output;
    ``layer`` as ``int4_layer`` gives it.
    """
    e, k, d, f = MODELS[name]
    cfg, q = layer[0], layer[1]
    assert isinstance(cfg, MoEConfig)
    assert isinstance(q, QuantizedExpertWeights)
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    r = route(m, e, k)
    active = int(torch.unique(r.topk_ids).numel())
    floor = floor_ms(m, active, (e, k, d, f), bw, 1e30)
    return x, r, floor, moe_forward_reference(x, q, r, cfg)


def probe_models(
    cell: Callable[[str, int, tuple[object, ...], float, str], None], sizes: str
) -> None:
    """A probe's loop: ``cell`` for each model named on the command line (default all)
    at each M of ``PROBE_M`` (default ``sizes``) on ``PROBE_ROUTES`` routing draws
    (default 1), each model's layer built once (``int4_layer``).
    """
    only = sys.argv[1:] or list(MODELS)
    ms_list = [int(v) for v in os.environ.get("PROBE_M", sizes).split(",")]
    draws = int(os.environ.get("PROBE_ROUTES", "1"))
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"copy {bw / 1e12:.2f} TB/s", flush=True)
    for name in only:
        layer = int4_layer(name)
        for m in ms_list:
            for i in range(draws):
                cell(name, m, layer, bw, f" r{i}" if draws > 1 else "")
        del layer
        torch.cuda.empty_cache()


def checked(ref: torch.Tensor, out: torch.Tensor, what: str) -> float:
    """``rel_err``, refusing to go on past ``MAX_RELERR`` (a wrong kernel is not timed)."""
    err = rel_err(ref, out)
    if not err < MAX_RELERR:
        raise SystemExit(f"{what}: relative L2 error {err:.2e} >= {MAX_RELERR}")
    return err


def bench_model(name: str, bw: float, rate: float) -> list[dict[str, object]]:
    e, k, d, f = MODELS[name]
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    q = random_int4(e, d, f)
    w13m = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2m = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    w13, w2 = dense_bf16(q)
    d13, d2 = ExpertMatrix(data=w13), ExpertMatrix(data=w2)
    w13t, w2t = w13.transpose(1, 2), w2.transpose(1, 2)
    tiny = (
        [tinygemm_pack(q.w13_qdata[i], q.w13_scale[i]) for i in range(e)],
        [tinygemm_pack(q.w2_qdata[i], q.w2_scale[i]) for i in range(e)],
    )
    rows = []
    for m in MS:
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        active = int(torch.unique(r.topk_ids).numel())
        fl = floor_ms(m, active, (e, k, d, f), bw, rate)
        row: dict[str, object] = {
            "model": name,
            "M": m,
            "active": active,
            "floor_ms": fl,
            "w4a16_path": "gemv"
            if use_gemv(m * k, w13m, w2m)
            else "dequant"
            if use_dequant(m * k, w13m)
            else "gemm",
        }
        fns: dict[str, Callable[[], torch.Tensor]] = {
            "triton-w4a16": lambda: fused_moe(x, w13m, w2m, r, config),
            "triton-emulation": lambda: fused_moe(x, d13, d2, r, config),
            "grouped_mm-bf16": lambda: grouped_mm_anchor(x, w13t, w2t, r),
            "tinygemm-loop": lambda: tinygemm_loop(x, tiny[0], tiny[1], r),
        }
        if m <= 64:
            row["bare-read_graph_ms"] = bare_read_ms(floor_bytes(m, active, d, f))
        ref = moe_forward_reference(x, q, r, config)
        for key, fn in fns.items():
            row[f"{key}_relerr"] = checked(ref, fn(), f"{name} M={m} {key}")
            row[f"{key}_ms"] = time_eager(fn)
            if m <= 64 and key != "tinygemm-loop":
                ms, out = replay_graph(fn)
                assert isinstance(out, torch.Tensor)
                row[f"{key}_graph_ms"] = ms
                row[f"{key}_graph_relerr"] = checked(
                    ref, out, f"{name} M={m} {key} graph"
                )
        rows.append(row)
        print(format_row(row), flush=True)
    del q, w13, w2, tiny
    torch.cuda.empty_cache()
    return rows


def apply_gemv_variant() -> str:
    """Apply ``GEMV_VARIANT`` (a key of GEMV_LOOP_VARIANTS) to the GEMV tile table."""
    import attrs

    import backends.triton._configs as configs

    name = os.environ.get("GEMV_VARIANT", "base")
    kw = GEMV_LOOP_VARIANTS[name]
    configs.GEMV_FEW = attrs.evolve(configs.GEMV_FEW, **kw)  # type: ignore[misc]
    return name


def main() -> None:
    torch.manual_seed(0)
    variant = apply_gemv_variant()
    bw, rate = copy_bandwidth(), matmul_rate()
    meta: dict[str, object] = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bw": bw,
        "bf16_flops": rate,
        "gemv_variant": variant,
        "l2_flush": FLUSH_MODE,
    }
    print(f"copy {bw / 1e12:.2f} TB/s, bf16 {rate / 1e12:.0f} TFLOP/s", flush=True)
    rows: list[dict[str, object]] = []
    for name in sys.argv[1:] or list(MODELS):
        rows += bench_model(name, bw, rate)
    (HERE / "results.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1)
    )
    results = HERE / "RESULTS.md"
    previous = results.read_text() if results.exists() else ""
    results.write_text(results_markdown(meta, rows, previous))
    for name in sorted({str(r["model"]) for r in rows}):
        plot(rows, name, HERE / f"{name}.png")
    out = os.environ.get("OUT")
    if out:
        for p in [HERE / "results.json", HERE / "RESULTS.md", *HERE.glob("*.png")]:
            shutil.copy(p, out)


if __name__ == "__main__":
    main()
