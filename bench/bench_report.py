"""Report of bench_gpu.py: the log line, RESULTS.md (table, computed targets, the
hand-written part kept) and the charts. Pure Python and matplotlib: testable on a CPU
from a results.json (``results_markdown(meta, rows, previous)``).
"""

# ruff: noqa: D103, D205, ICN001
# A benchmark script's helpers, documented by the module docstring.

from pathlib import Path

MAX_RELERR = 1e-2
"""Relative L2 error against the float32 reference above which nothing is timed."""


KEYS = ["triton-w4a16", "triton-emulation", "grouped_mm-bf16", "tinygemm-loop"]


def format_row(row: dict[str, object]) -> str:
    fl = float(row["floor_ms"])  # type: ignore[arg-type]
    cells = []
    for key in KEYS:
        for suffix, tag in (("_ms", ""), ("_graph_ms", " graph")):
            v = row.get(key + suffix)
            if isinstance(v, float):
                cells.append(f"{key}{tag} {v:.3f} ({v / fl:.1f}x)")
    return (
        f"{row['model']:16s} M={row['M']:5d} act={row['active']:3d} floor={fl:.3f}ms "
        f"{row['w4a16_path']} | " + " | ".join(cells)
    )


def _number(v: object) -> float:
    """``v``, a number of ``meta`` or a row, for arithmetic (anything else raises)."""
    if not isinstance(v, (int, float)):
        raise TypeError(f"expected a number, got {v!r}")
    return v


def cell(row: dict[str, object], key: str) -> str:
    v = row.get(key)
    if not isinstance(v, float):
        return "-"
    return f"{v:.3f} ({v / float(row['floor_ms']):.2f}x)"  # type: ignore[arg-type]


def write_markdown(meta: dict[str, object], rows: list[dict[str, object]]) -> str:
    lines = [
        "# Benchmark: one MoE layer, int4 W4A16 vs anchors",
        "",
        f"Date {meta['date']}; GPU {meta['gpu']}; torch {meta['torch']}; triton {meta['triton']}.",
        f"Copy bandwidth {_number(meta['copy_bw']) / 1e12:.2f} TB/s (read + write), dense "
        f"bf16 matmul {_number(meta['bf16_flops']) / 1e12:.0f} TFLOP/s, both measured in "
        "this run.",
        "",
        "Uniform random routing, bf16 activations, symmetric int4 group 128 with bf16 scales.",
        "Each cell: median ms (multiple of the floor). Floor = max(bytes / copy bandwidth,",
        "FLOPs / bf16 rate); bytes = active experts' int4 weights + bf16 scales + x in",
        "and out (intermediates not counted: a fused kernel need not round-trip them).",
        "Eager times include launch overhead; `graph` = CUDA-graph replay (M <= 64), L2",
        "flushed before every timed run: eager by `triton.testing.do_bench` (it zeroes a",
        f"buffer), each replay by a {meta.get('l2_flush', 'write')} of 512 MB "
        "(`BENCH_FLUSH`; a write leaves about 50 MB",
        "of dirty lines in L2 that the timed kernels' reads must write back: a 117 MB read",
        "took 45 us after it, 37 us after a read; bench/sweeps/probe_read_sizes_h200.log).",
        "Outputs checked against the float32 reference",
        f"before timing, eager and replayed (the run stops at a relative L2 error of {MAX_RELERR};",
        "`relerr` columns in results.json). GEMV loop variant: "
        f"`{meta['gemv_variant']}` (bench/sweep_tiles.py).",
        "",
        "`path` is the path triton-w4a16 took (backends/triton/_fused.py): `gemv` (decode",
        "GEMV), `gemm` (grouped GEMM, int4 dequantized in registers) or `dequant` (chunks",
        "of experts dequantized to bf16, then the bf16 grouped GEMM).",
        "",
        "`tinygemm loop`: one `torch._weight_int4pack_mm` per active expert and projection,",
        "on the same int4 codes and scales repacked for it; eager only (it reads each",
        "expert's token count on the host, so it cannot be captured in a CUDA graph).",
        "",
        "`bare read graph`: one `torch.sum` over as many bytes as the floor counts,",
        "replayed and flushed the same way (M <= 64): what a kernel that only read",
        "those bytes takes. Short reads do not reach the 2 GiB copy's bandwidth that",
        "the floor divides by, and a replayed graph costs a few us before any work.",
        "",
        "| model | M | active | floor ms | bare read graph | path | w4a16 | w4a16 graph "
        "| emulation | emulation graph | grouped_mm bf16 | grouped_mm graph "
        "| tinygemm loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cols = [
            "triton-w4a16_ms",
            "triton-w4a16_graph_ms",
            "triton-emulation_ms",
            "triton-emulation_graph_ms",
            "grouped_mm-bf16_ms",
            "grouped_mm-bf16_graph_ms",
            "tinygemm-loop_ms",
        ]
        lines.append(
            f"| {row['model']} | {row['M']} | {row['active']} | "
            f"{float(row['floor_ms']):.3f} | {cell(row, 'bare-read_graph_ms')} | "  # type: ignore[arg-type]
            f"{row['w4a16_path']} | " + " | ".join(cell(row, c) for c in cols) + " |"
        )
    return "\n".join(lines) + "\n"


TARGET_FLOOR = {
    "mixtral-8x7b": 1.5,
    "qwen3-235b-a22b": 1.5,
    "deepseek-v3": 1.5,
    "qwen3-30b-a3b": 3.0,
}
"""Issue 3: triton-w4a16 under graph replay at M <= 64, at most this multiple of the floor."""
HAND_WRITTEN = (
    "<!-- Everything below is written by hand; bench_gpu.py keeps it when it "
    "rewrites this file. -->"
)


def _ms(row: dict[str, object], key: str) -> float | None:
    v = row.get(key)
    return v if isinstance(v, float) else None


def _verdict(ok: bool) -> str:  # noqa: FBT001 (a one-argument formatter)
    return "met" if ok else "**missed**"


def targets_markdown(rows: list[dict[str, object]]) -> list[str]:
    """The issue's targets, evaluated on ``rows``: one line per target and model."""
    lines = [
        "",
        "## Targets of issue 3 (computed by bench_gpu.py from the table above)",
        "",
        "| target | model | measured | verdict |",
        "|---|---|---|---|",
    ]
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    for model in models:
        lines += _decode_lines(rows, model)
    lines += _prefill_lines(rows)
    for model in models:
        lines += _emulation_lines(rows, model)
    lines += [
        "",
        "Largest relative L2 error against the float32 reference (eager and graph):",
    ]
    for key in KEYS:
        errs = [
            err
            for r in rows
            for suffix in ("_relerr", "_graph_relerr")
            if isinstance(err := r.get(key + suffix), float)
        ]
        if errs:
            lines.append(f"{key} {max(errs):.1e};")
    lines[-1] = lines[-1].rstrip(";") + "."
    return lines


def _decode_lines(rows: list[dict[str, object]], model: str) -> list[str]:
    """The decode target's line for ``model`` (and the bare read's, for scale)."""
    limit = TARGET_FLOOR.get(model)
    mults = [
        (int(r["M"]), g / float(r["floor_ms"]))  # type: ignore[call-overload, arg-type]
        for r in rows
        if r["model"] == model and (g := _ms(r, "triton-w4a16_graph_ms"))
    ]
    if limit is None or not mults:
        return []
    met = [m for m, x in mults if x <= limit]
    verdict = _verdict(len(met) == len(mults))
    if met and len(met) < len(mults):
        verdict = f"**missed**; met at M = {', '.join(map(str, met))}"
    lines = [
        f"| triton-w4a16 graph replay <= {limit}x floor at M = "
        f"{' / '.join(str(m) for m, _ in mults)} | {model} | "
        f"{' / '.join(f'{x:.2f}x' for _, x in mults)} | {verdict} |"
    ]
    reads = [
        f"{v / float(r['floor_ms']):.2f}x"  # type: ignore[arg-type]
        for r in rows
        if r["model"] == model
        and _ms(r, "triton-w4a16_graph_ms")
        and (v := _ms(r, "bare-read_graph_ms"))
    ]
    if len(reads) == len(mults):
        lines.append(
            f"| (for scale: a bare read of the floor's bytes, replayed, at the "
            f"same M) | {model} | {' / '.join(reads)} | - |"
        )
    return lines


def _prefill_lines(rows: list[dict[str, object]]) -> list[str]:
    """The M = 4096 target's line for each model, against grouped_mm on bf16."""
    lines = []
    for r in rows:
        mine, anchor = _ms(r, "triton-w4a16_ms"), _ms(r, "grouped_mm-bf16_ms")
        if r["M"] == 4096 and mine and anchor:
            lines.append(
                "| triton-w4a16 >= 0.8x grouped_mm bf16 throughput at M = 4096 | "
                f"{r['model']} | {anchor / mine:.2f}x ({mine:.2f} vs {anchor:.2f} ms) "
                f"| {_verdict(anchor / mine >= 0.8)} |"
            )
    return lines


def _emulation_lines(rows: list[dict[str, object]], model: str) -> list[str]:
    """triton-emulation's target for ``model``: its narrowest ratio to grouped_mm."""
    ratios = [
        (anchor / emu, int(r["M"]), tag)  # type: ignore[call-overload]
        for r in rows
        if r["model"] == model
        for suffix, tag in (("_ms", ""), ("_graph_ms", " graph"))
        if (emu := _ms(r, "triton-emulation" + suffix))
        and (anchor := _ms(r, "grouped_mm-bf16" + suffix))
    ]
    if not ratios:
        return []
    worst, m, tag = min(ratios)
    return [
        "| triton-emulation no slower than grouped_mm bf16 at every M, eager "
        f"and graph | {model} | narrowest: {worst:.2f}x at M = {m}{tag} | "
        f"{_verdict(worst >= 1.0)} |"
    ]


def results_markdown(
    meta: dict[str, object], rows: list[dict[str, object]], previous: str
) -> str:
    """The generated table and targets, then the hand-written part of ``previous``."""
    _, marker, kept = previous.partition(HAND_WRITTEN)
    body = write_markdown(meta, rows) + "\n".join(targets_markdown(rows)) + "\n\n"
    return body + HAND_WRITTEN + (kept if marker else "\n")


def plot(rows: list[dict[str, object]], name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["model"] == name]
    ms = [r["M"] for r in mine]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(ms, [r["floor_ms"] for r in mine], "k--", label="floor")
    reads = [(r["M"], r.get("bare-read_graph_ms")) for r in mine]
    reads = [(a, b) for a, b in reads if isinstance(b, float)]
    if reads:
        ax.plot(*zip(*reads, strict=True), "k:", label="bare read of the floor's bytes")
    for key in KEYS:
        for suffix, style in (("_ms", "-o"), ("_graph_ms", ":s")):
            pts = [(r["M"], r.get(key + suffix)) for r in mine]
            pts = [(a, b) for a, b in pts if isinstance(b, float)]
            if pts:
                label = key + (" (graph)" if "graph" in suffix else "")
                ax.plot(*zip(*pts, strict=True), style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens M")
    ax.set_ylabel("ms per layer (median)")
    ax.set_title(f"{name}: one MoE layer, int4 g128")
    ax.legend(fontsize=7)
    ax.grid(visible=True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
