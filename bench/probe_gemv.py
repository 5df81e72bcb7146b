"""Decode GEMV probe (run on the GPU): where do the int4 GEMV's cycles go?

``[PROBE_SET=bytes|words|tc|tma|word2|h2] [PROBE_M4=1] python bench/probe_gemv.py time`` times, per
model shape at M = 1, each projection's GEMV alone (w13 as 2F plain rows) under
CUDA-graph replay with L2 flushed: the library's ``launch_gemv`` and the experimental
kernels of ``probe_kernels.py`` / ``probe_kernels_asm.py`` with K split across
programs and several tiles (no ``PROBE_SET``: bytes, words and tc). Prints achieved
TB/s (weights + scales over time), registers, spills, the PTX's widest global load,
and the error against float32 math on dequantized rows.
``PROBE_SET=layout`` (``probe_kernels_layout.py``): row-major against tile-blocked
words. ``python bench/probe_gemv.py ncu|ncuword`` runs one forward for Nsight Compute.
Logs (earlier revisions of this script, same kernels): bench/sweeps/probe_*.
"""

# ruff: noqa: B023, D103, FBT001, T201, TID253
# A GPU script: print is its output.

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import GROUP, MODELS, copy_bandwidth, random_int4, route, time_graph
from probe_kernels import probe_launch, tma_launch, word_launch
from probe_kernels_asm import prescale_x, tc_launch, word2_launch
from probe_kernels_h2 import h2_launch, pack_x
from probe_kernels_layout import layout_launch

from backends.triton._fused import fused_moe, pick_gemv_tiles
from backends.triton._launch import ExpertMatrix
from backends.triton._launch_gemv import launch_gemv
from core.config import MoEConfig
from core.routing import Routing

CASES = [("mixtral-8x7b", 1), ("qwen3-235b-a22b", 1), ("deepseek-v3", 1),
         ("qwen3-30b-a3b", 1)]  # fmt: skip
if os.environ.get("PROBE_M4"):
    CASES += [("qwen3-235b-a22b", 4), ("deepseek-v3", 4), ("qwen3-30b-a3b", 4)]
PROBE_SET = os.environ.get("PROBE_SET", "")
BYTE_VARIANTS = [(16, 512, 4, 1), (16, 512, 4, 4)]  # (block_n, block_k, warps, split)
BYTE_MODES = {"i2f": 0, "magic": 1, "load": 9}
WORD_VARIANTS = [(32, 256, 4), (64, 256, 4), (128, 128, 4), (64, 256, 2)]
TC_VARIANTS = [(64, 128, 4), (128, 128, 4), (128, 128, 8), (256, 128, 8)]
TMA_VARIANTS = [  # (block_n, block_k, warps, stages)
    (16, 512, 4, 3), (16, 512, 4, 5), (32, 256, 4, 4), (16, 256, 4, 6),
    (64, 256, 4, 3), (32, 512, 8, 3), (8, 512, 2, 6),
]  # fmt: skip
WORD2_VARIANTS = [
    (128, 128, 4), (256, 128, 8), (64, 128, 4), (128, 128, 8), (64, 256, 4),
    (128, 256, 4), (32, 128, 2), (64, 128, 2),
]  # fmt: skip

H2_VARIANTS = [
    (32, 128, 1), (64, 128, 2), (128, 128, 4), (16, 256, 1), (32, 256, 1), (64, 256, 2),
]  # fmt: skip

LAYOUT_VARIANTS = [(8, 512, 1), (16, 256, 1), (16, 512, 2), (4, 1024, 1), (32, 256, 2)]

Variant = tuple[str, Callable[..., Any], dict[str, int], bool]
"""(label, launcher, its keyword arguments, whether it reads prescaled x)."""


def auto_split(pairs: int, n: int, k: int, bn: int, bk: int) -> int:
    """Split K until about 2048 programs, keeping at least one step per split."""
    split = 1
    while pairs * triton.cdiv(n, bn) * split < 2048 and k // (2 * split) >= bk:
        split *= 2
    return split


def variants(pairs: int, n: int, k: int) -> list[Variant]:
    """The variants of ``PROBE_SET`` for one projection."""
    out: list[Variant] = []
    want = PROBE_SET or "bytes,words,tc"
    if "bytes" in want:
        for bn, bk, w, s in BYTE_VARIANTS:
            for mode_name, mode in BYTE_MODES.items():
                kw = {"bn": bn, "bk": bk, "warps": w, "split": s, "mode": mode}
                out.append(
                    (f"{bn}x{bk} w{w} s{s} {mode_name}", probe_launch, kw, False)
                )
    if "words" in want:
        for bn, bk, w in WORD_VARIANTS:
            s = auto_split(pairs, n, k, bn, bk)
            kw = {"bn": bn, "bk": bk, "warps": w, "split": s, "xmode": 0}
            out.append((f"{bn}x{bk} w{w} s{s} word", word_launch, kw, False))
    for tag, table, launch, prescaled in (
        ("tc", TC_VARIANTS, tc_launch, False),
        ("word2", WORD2_VARIANTS, word2_launch, True),
    ):
        if tag in want.split(","):
            for bn, bk, w in table:
                s = auto_split(pairs, n, k, bn, bk)
                kw = {"bn": bn, "bk": bk, "warps": w, "split": s}
                out.append((f"{bn}x{bk} w{w} s{s} {tag}", launch, kw, prescaled))
    if "h2" in want.split(","):
        for bn, bk, w in H2_VARIANTS:
            for xmode in (0, 1, 2):
                s = auto_split(pairs, n, k, bn, bk)
                kw = {"bn": bn, "bk": bk, "warps": w, "split": s, "xmode": xmode}
                out.append(
                    (f"{bn}x{bk} w{w} s{s} h2 x{xmode}", h2_launch, kw, xmode == 2)
                )
    if "layout" in want.split(","):
        for bn, bk, w in LAYOUT_VARIANTS:
            if n % bn or k % bk:
                continue
            for blocked in (0, 1):
                for mode in (0, 9):
                    kw = {"bn": bn, "bk": bk, "warps": w, "split": 1,
                          "blocked": blocked, "mode": mode}  # fmt: skip
                    tag = f"{bn}x{bk} w{w} {'blocked' if blocked else 'rows'} m{mode}"
                    out.append((tag, layout_launch, kw, False))
    if "tma" in want:
        for bn, bk, w, st in TMA_VARIANTS:
            for s in sorted({1, auto_split(pairs, n, k, bn, bk)}):
                kw = {"bn": bn, "bk": bk, "warps": w, "split": s, "stages": st}
                out.append((f"{bn}x{bk} w{w} s{s} tma st{st}", tma_launch, kw, False))
    return out


def check(
    got: torch.Tensor, a: torch.Tensor, b: ExpertMatrix, ids: torch.Tensor, a_div: int
) -> float:
    """Relative error of pairs 0 and -1 against float32 math on dequantized rows."""
    worst = 0.0
    for p in (0, ids.numel() - 1):
        q = b.data[int(ids[p])]
        codes = torch.stack([q & 15, q >> 4], -1).reshape(q.shape[0], -1).float() - 8
        assert b.scale is not None
        w = codes * b.scale[int(ids[p])].float().repeat_interleave(GROUP, dim=1)
        ref = w @ a[p // a_div].float()
        worst = max(worst, float((got[p] - ref).norm() / ref.norm()))
    return worst


def describe(compiled: Any) -> str:
    """Registers, spills and the widest global load of a compiled kernel."""
    if compiled is None:  # Triton's CPU interpreter returns nothing
        return "interpreted"
    ptx = compiled.asm.get("ptx", "")
    widths = re.findall(r"ld\.global(?:\.\w+)*?\.v(\d)\.b(\d+)", ptx)
    widest = max((int(v) * int(b) // 8 for v, b in widths), default=0)
    return f"regs {compiled.n_regs:3d} spills {compiled.n_spills} ldB {widest}"


def time_projection(
    label: str, a: torch.Tensor, b: ExpertMatrix, ids: torch.Tensor, a_div: int
) -> None:
    """Every variant of one projection: error, time and TB/s, one line each."""
    pairs, (n, half) = ids.numel(), b.data.shape[1:]
    nbytes = int(torch.unique(ids).numel()) * n * half * (1 + 4 / GROUP)
    xs = (
        prescale_x(a) if "word2" in PROBE_SET else pack_x(a) if "h2" in PROBE_SET else a
    )
    for tag, launch, kw, prescaled in variants(pairs, n, 2 * half):
        x_in = xs if prescaled else a
        out = torch.empty(kw["split"], pairs, n, device=a.device)

        def run(launch: Callable[..., Any] = launch, x_in: torch.Tensor = x_in,
                out: torch.Tensor = out, kw: dict[str, int] = kw) -> Any:  # fmt: skip
            return launch(x_in, b, out, ids, a_div=a_div, **kw)

        try:
            compiled = run()
            err = 0.0 if kw.get("mode") == 9 else check(out.sum(0), a, b, ids, a_div)
            ms = time_graph(run)
        except Exception as exc:  # a variant may not compile
            print(f"{label} {tag}: FAILED {type(exc).__name__}: {exc}"[:300])
            continue
        assert ms is not None
        print(f"{label} {tag:24s}: {ms * 1e3:7.1f} us {nbytes / ms / 1e9:5.2f} TB/s"
              f"  {describe(compiled)} err {err:.1e}", flush=True)  # fmt: skip


def time_case(name: str, m: int) -> None:
    """The library's GEMV and the variants for both projections of one model."""
    e, k, d, f = MODELS[name]
    torch.manual_seed(0)
    q = random_int4(e, d, f)
    r = route(m, e, k)
    ids = r.topk_ids.flatten().contiguous()
    routing = Routing(topk_weights=r.topk_weights.float(), topk_ids=r.topk_ids)
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    inter = torch.randn(ids.numel(), f, device="cuda").to(torch.bfloat16)
    projections = (
        ("w13", q.w13_qdata, q.w13_scale, x, k, f, True),
        ("w2", q.w2_qdata, q.w2_scale, inter, 1, d, False),
    )
    for proj, data, scale, a, a_div, n_out, gated in projections:
        b = ExpertMatrix(data=data, scale=scale, group_size=GROUP)
        tiles = pick_gemv_tiles(ids.numel(), ExpertMatrix(data=q.w13_qdata))
        lib = torch.empty(ids.numel(), n_out, dtype=torch.bfloat16, device="cuda")

        def library(a: torch.Tensor = a, b: ExpertMatrix = b, lib: torch.Tensor = lib,
                    n_out: int = n_out, gated: bool = gated) -> None:  # fmt: skip
            launch_gemv(a, b, lib, n=n_out, routing=routing, config=cfg,
                        gated=gated, tiles=tiles)  # fmt: skip

        ms = time_graph(library)
        assert ms is not None
        nbytes = int(torch.unique(ids).numel()) * data[0].numel() * (1 + 4 / GROUP)
        label = f"{name:15s} M={m} {proj:3s}"
        print(f"{label} library {tiles.block_n}x{tiles.block_k} w{tiles.num_warps}: "
              f"{ms * 1e3:7.1f} us {nbytes / ms / 1e9:5.2f} TB/s", flush=True)  # fmt: skip
        time_projection(label, a, b, ids, a_div)
    del q
    torch.cuda.empty_cache()


def ncu_run(word: bool) -> None:
    """One forward of Mixtral at M = 1 and 16 (or the word kernel alone) for ncu."""
    e, k, d, f = MODELS["mixtral-8x7b"]
    q = random_int4(e, d, f)
    w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    for m in (1,) if word else (1, 16):
        x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
        r = route(m, e, k)
        if not word:
            fused_moe(x, w13, w2, r, cfg)
            continue
        ids = r.topk_ids.flatten().contiguous()
        for bn, bk, warps in ((128, 256, 4), (64, 256, 4)):
            split = auto_split(2, 2 * f, d, bn, bk)
            out = torch.empty(split, 2, 2 * f, device="cuda")
            word_launch(x, w13, out, ids, a_div=k, bn=bn, bk=bk, warps=warps,
                        split=split, xmode=0)  # fmt: skip
    torch.cuda.synchronize()


def main() -> None:
    if sys.argv[1] in ("ncu", "ncuword"):
        ncu_run(sys.argv[1] == "ncuword")
        return
    print(f"copy {copy_bandwidth() / 1e12:.2f} TB/s", flush=True)
    for name, m in CASES:
        time_case(name, m)


if __name__ == "__main__":
    main()
