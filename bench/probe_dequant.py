"""Tile the dequant path's kernel on a CUDA GPU: rows x columns x warps.

``python bench/probe_dequant.py`` on a GPU. The ``dequant`` path of triton-w4a16
(prefill, >= ``DEQUANT_PAIRS_PER_EXPERT`` pairs an expert) writes a chunk of experts'
16-bit weights (<= ``DEQUANT_SCRATCH_BYTES``) and runs the 16-bit grouped GEMM on it;
the write is most of its cost over triton-emulation. First each tile variant of the
kernel alone, on one chunk of w13 and of w2 of three model shapes (random symmetric
group-128 codes, bf16 scales, as bench_gpu.py): median ms (``triton.testing.do_bench``)
and TB/s of int4 read + bf16 written, against a 2 GiB copy's read + write rate,
checked bit-exact against the committed tile. Then the whole layer at prefill sizes
with the committed tiles and the fastest variants (``fused_moe(path="dequant")``,
eager, median ms), and ``DEQUANT_SCRATCH_BYTES`` smaller (chunks whose 16-bit weights
L2 may still hold when the GEMM reads them).
"""

# ruff: noqa: D103, T201, TID253
# A GPU script, not library code: print is its output, triton is needed at import.

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import triton.testing as tt
from bench_gpu import MODELS, copy_bandwidth, int4_layer, route

import backends.triton._configs as configs
import backends.triton._fused as fused
from backends.triton._fused import _dequant_scratch, fused_moe
from backends.triton._launch_dequant import dequantize_experts

Variant = tuple[int, int, int, bool]  # rows, columns, warps, int32 words
BEFORE: Variant = (64, 128, 4, False)
"""The kernel's one tile before this probe: 64 x 128, 4 warps, bytes."""
VARIANTS: list[Variant] = [
    BEFORE,
    (16, 512, 4, False),
    (32, 256, 4, False),
    (8, 1024, 4, False),
    *(
        (r, k, w, True)
        for r in (4, 8, 16, 32, 64)
        for k in (128, 256, 512, 1024)
        for w in (2, 4, 8)
        if 8 * 32 * w <= r * k <= 128 * 32 * w  # 8 to 128 codes a thread
    ),
]


FEW: list[Variant] = [
    BEFORE, (16, 512, 4, False), (64, 128, 4, True), (8, 512, 4, True),
    (4, 1024, 4, True), (16, 256, 4, True), (32, 128, 8, True), (4, 512, 2, True),
]  # fmt: skip
"""``PROBE_FEW=1``: these only (the best of an H100's full sweep and the tiles before),
and the layers with the 1 GiB scratch only."""
if os.environ.get("PROBE_FEW"):
    VARIANTS = FEW


def time_ms(fn: Callable[[], object]) -> float:
    return float(tt.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def kernel_alone(bw: float) -> dict[Variant, list[float]]:
    """TB/s of every variant on six matrices; the list per variant."""
    rates: dict[Variant, list[float]] = {v: [] for v in VARIANTS}
    for name in ("qwen3-235b-a22b", "mixtral-8x7b", "qwen3-30b-a3b"):
        _, _, w13, w2 = int4_layer(name)
        scratch, step = _dequant_scratch(w13, w2, torch.bfloat16, w13.data.device)
        for label, b in (("w13", w13), ("w2", w2)):
            rows, cols = int(b.data.shape[1]), 2 * int(b.data.shape[2])
            out = scratch[: step * rows * cols].view(step, rows, cols)
            assert b.scale is not None
            nbytes = (
                b.data[:step].numel()
                + b.scale[:step].numel() * b.scale.element_size()
                + out.numel() * out.element_size()
            )
            dequantize_experts(b, 0, step, out)
            want = out.clone()
            print(
                f"\n{name} {label}: {step} experts of {rows} x {cols}, "
                f"{nbytes / 1e9:.2f} GB moved; copy rate {bw / 1e12:.2f} TB/s"
            )
            for v in VARIANTS:
                r, k, w, words = v

                run = functools.partial(
                    dequantize_experts, b, 0, step, out,
                    block_r=r, block_k=k, num_warps=w, words=words,
                )  # fmt: skip
                out.fill_(float("nan"))
                run()
                ok = torch.equal(out, want)
                ms = time_ms(run)
                rate = nbytes / (ms * 1e-3)
                rates[v].append(rate / bw)
                mark = " (before)" if v == BEFORE else ""
                print(
                    f"  {r:3d} x {k:5d} w{w} {'words' if words else 'bytes'}: {ms:7.3f} ms {rate / 1e12:5.2f} TB/s "
                    f"({rate / bw:4.2f} of copy){'' if ok else ' MISMATCH'}{mark}"
                )
        del w13, w2, scratch
        torch.cuda.empty_cache()
    return rates


def layers(best: list[Variant]) -> None:
    cases = [("qwen3-235b-a22b", 4096), ("mixtral-8x7b", 4096), ("mixtral-8x7b", 1024),
             ("qwen3-30b-a3b", 4096)]  # fmt: skip
    for name, m in cases:
        layer(name, m, [BEFORE, *best])
        torch.cuda.empty_cache()


def layer(name: str, m: int, variants: list[Variant]) -> None:
    e, k, d, _ = MODELS[name]
    cfg, _, w13, w2 = int4_layer(name)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    forward = functools.partial(
        fused_moe, x, w13, w2, route(m, e, k), cfg, path="dequant"
    )
    print(f"\n{name} M = {m}, fused_moe(path='dequant'), eager ms:")
    ref = forward().float()  # the tiles committed when this ran
    for v in variants:
        tiles = functools.partial(
            dequantize_experts, block_r=v[0], block_k=v[1], num_warps=v[2], words=v[3]
        )
        for scratch_mb in (1024,) if os.environ.get("PROBE_FEW") else (1024, 256, 64):
            with (
                mock.patch.object(fused, "dequantize_experts", tiles),
                mock.patch.object(configs, "DEQUANT_SCRATCH_BYTES", scratch_mb << 20),
            ):
                err = float((forward().float() - ref).norm() / ref.norm())
                ms = time_ms(forward)
            print(
                f"  {v} scratch {scratch_mb:4d} MiB: "
                f"{ms:7.3f} ms (vs the first output {err:.1e})"
            )


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    bw = copy_bandwidth()
    rates = kernel_alone(bw)
    ranked = sorted(VARIANTS, key=lambda v: -min(rates[v]))
    print("\nvariants by their worst fraction of the copy rate over the six matrices:")
    for v in ranked[:8]:
        print(f"  {v}: worst {min(rates[v]):.2f}, mean {sum(rates[v]) / 6:.2f}")
    print(f"  before {BEFORE}: worst {min(rates[BEFORE]):.2f}")
    layers([v for v in ranked[:3] if v != BEFORE])


if __name__ == "__main__":
    main()
