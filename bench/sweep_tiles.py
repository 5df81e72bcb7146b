"""Variant sweep for backends/triton/_configs.py (run on the GPU).

``[SWEEP_M=1,4] python bench/sweep_tiles.py decode|gemv|words|prefill|emulation|operands|group [model ...]``: for the model
shapes of bench_gpu.py, times triton-w4a16's paths with tile variants: at decode the
grouped GEMM and the GEMV; ``gemv``: the GEMV's loop variants at M = 1 and 4, then
prints the one bench_gpu.py should take (``GEMV_VARIANT``); ``words``: the word GEMV's
tiles (``GemvTiles.words``) at M = 1 and 4 (``SWEEP_WORDS=2`` to ``9``: the
second sweep's, the one-word table's, the paired kernel's, two-warp paired tiles, the
paired table's with programmatic dependent launch, TMA reads, TMA tiles per
matrix, or ``GEMV_PAIRED`` with w2 on 8 or 16 rows and K splits of 1-8);
at prefill the in-register GEMM, the dequant path and ``torch._grouped_mm`` on bf16
weights; ``emulation``: triton-emulation's GEMM tiles on
bf16 weights beside ``torch._grouped_mm`` at M = 256-4096; ``operands``: the in-register
int4 GEMM with swapped operands and nibble halves (``GemmTiles``) beside the table;
``group``: the launch orders (``GemmTiles.group_m``) of the table's tiles, int4 and bf16,
beside ``torch._grouped_mm`` at M = 1024 and 4096. Decode sizes (M <= 64) are timed under
CUDA-graph replay, prefill eagerly; each output is checked against the float32
reference first. Prints one line per variant and appends it to $OUT/sweep_<mode>.jsonl.
bench/sweeps/ holds the logs of the sweep behind the table (it also timed kernel
variants that were then removed: see bench/TUNING.md).
"""

# ruff: noqa: B023, D103, T201
# A GPU script, not library code: print is its output, triton is needed at import, and
# each lambda is timed inside the loop iteration that defines it.

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypedDict

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    GEMV_LOOP_VARIANTS,
    GROUP,
    MODELS,
    copy_bandwidth,
    dense_bf16,
    floor_ms,
    grouped_mm_anchor,
    random_int4,
    rel_err,
    route,
    time_eager,
    time_graph,
)

from backends.triton._configs import (
    GEMV_FEW,
    GEMV_PAIRED,
    SIXTEEN_BIT_MIN_PAIRS,
    choose_tiles,
)
from backends.triton._fused import Path as FusedPath, fused_moe, pick_tiles, use_dequant
from backends.triton._launch import ExpertMatrix
from backends.triton._tiles import GemmTiles, GemvTiles, MoETiles
from core.config import MoEConfig
from core.quantize import dequantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import Routing

if TYPE_CHECKING:
    from typing_extensions import Unpack


class FusedKw(TypedDict, total=False):
    """Keyword arguments of ``fused_moe`` that a variant sets."""

    tiles: MoETiles
    path: FusedPath
    gemv_tiles: GemvTiles


WordTile: TypeAlias = (
    "tuple[int, int, int, int | None, bool, int | None, Unpack[tuple[bool, ...]]]"
)
"""A word GEMV tile: (block_n, block_k, warps, w2_split or None, prefetch,
loop_stages), then ``paired``, ``pdl`` and ``tma`` where given."""

DECODE_GEMM = [  # (block_n, block_k, warps, stages)
    (32, 256, 4, 3),
    (64, 128, 4, 4),
    (128, 128, 4, 3),
    (64, 256, 4, 3),
    (16, 512, 4, 3),
]
DECODE_GEMV = [(16, 512, 4), (32, 256, 4), (8, 1024, 4), (16, 1024, 8)]
WORD_GEMV: list[WordTile] = [  # (block_n, block_k, warps, w2_split or None, prefetch, loop_stages)
    (16, 256, 1, None, False, None), (8, 256, 1, None, False, None),
    (16, 256, 1, None, True, None), (8, 256, 1, None, True, None),
    (16, 256, 1, None, False, 2), (16, 256, 1, None, False, 3),
    (8, 256, 1, None, False, 3), (16, 512, 1, None, False, None),
    (8, 512, 1, None, False, None), (16, 512, 1, None, True, None),
    (32, 256, 2, None, True, None), (16, 128, 1, None, True, None),
]  # fmt: skip
"""Word GEMV variants (``sweep_tiles.py words``); the first two were the table's
before the prefetch sweep (``sweeps/sweep_words_prefetch_h200.log``)."""
WORD_GEMV_ROUND2: list[WordTile] = [
    (16, 256, 1, None, False, None), (8, 512, 1, None, False, None),
    (8, 512, 1, None, True, None), (16, 256, 1, None, True, None),
    (8, 1024, 1, None, False, None), (16, 512, 2, None, False, None),
    (8, 512, 2, None, False, None), (8, 256, 1, None, True, None),
    (4, 512, 1, None, False, None), (8, 512, 1, 1, False, None),
    (8, 512, 1, None, False, None),
]  # fmt: skip
"""``SWEEP_WORDS=2``: around the first sweep's best; 8 x 512 twice (run-to-run noise)."""
WORD_GEMV_TABLE: list[WordTile] = [
    (8, 512, 1, None, False, None), (8, 512, 1, None, True, None),
    (16, 256, 1, None, True, None),
]  # fmt: skip
"""``SWEEP_WORDS=3``: the table's two word tiles and the best DeepSeek-V3 one, for the
GEMV against the GEMM past the decode rule (``SWEEP_M=8,16``)."""
WORD_GEMV_PAIRED: list[WordTile] = [
    (8, 512, 1, None, False, None), (8, 512, 1, None, True, None),
    (8, 512, 1, None, False, None, True), (8, 512, 1, None, True, None, True),
    (16, 512, 1, None, False, None, True), (16, 256, 1, None, False, None, True),
    (8, 1024, 1, None, False, None, True), (16, 512, 1, None, True, None, True),
]  # fmt: skip
"""``SWEEP_WORDS=4``: the one-word table's tiles before the paired kernel, then tiles
of the paired kernel (a seventh entry ``True``); ``sweeps/sweep_words_paired_h200.log``."""
WORD_GEMV_PAIRED_NEXT: list[WordTile] = [
    (8, 512, 1, None, True, None, True), (16, 512, 1, None, False, None, True),
    (16, 512, 2, None, False, None, True), (32, 512, 2, None, False, None, True),
    (16, 512, 2, None, True, None, True), (8, 512, 1, None, False, None, True),
]  # fmt: skip
"""``SWEEP_WORDS=5`` (not run as a set): the paired table's two tiles against two-warp
ones, which halve the registers a thread (the gated 16 x 512 step takes 254 with one
warp, ``sweeps/compile_sm90.log``). Its two-warp 16 x 512 tile ran beside the streamed
GEMV (``sweeps/sweep_words_stream_h200.log``): 1.2-1.8x slower than the table."""
WORD_GEMV_PDL: list[WordTile] = [
    (8, 512, 1, None, True, None, True), (16, 512, 1, None, False, None, True),
    (8, 512, 1, None, True, None, True, True), (16, 512, 1, None, False, None, True, True),
    (8, 512, 1, None, True, None, True), (16, 512, 1, None, False, None, True),
]  # fmt: skip
"""``SWEEP_WORDS=6``: the paired table's two tiles without and with programmatic
dependent launch (an eighth entry: ``GemvTiles.pdl``), then without again (run-to-run
noise)."""
WORD_GEMV_TMA: list[WordTile] = [
    (8, 512, 1, None, True, None, True, True), (16, 512, 1, None, False, None, True, True),
    (8, 512, 1, None, False, 2, True, True, True), (8, 512, 1, None, False, 3, True, True, True),
    (8, 512, 1, None, False, 4, True, True, True), (16, 512, 1, None, False, 2, True, True, True),
    (16, 512, 1, None, False, 3, True, True, True), (4, 512, 1, None, False, 4, True, True, True),
    (8, 256, 1, None, False, 4, True, True, True), (8, 512, 1, None, True, None, True, True),
]  # fmt: skip
"""``SWEEP_WORDS=7``: the paired table's two tiles of before TMA (with programmatic
dependent launch) against TMA reads (a ninth entry: ``GemvTiles.tma``, pipelined
``loop_stages`` deep), then the first again (run-to-run noise). Logs:
``sweeps/sweep_words_tma_h200.log`` (32-byte boxes, a copy per half group; commit
762aaec) and ``sweeps/sweep_words_tma2d_h200.log`` (whole-row boxes, as now)."""
_A = GemvTiles(
    block_n=8, block_k=512, num_warps=1, words=True, paired=True, pdl=True,
    prefetch=True,
)  # fmt: skip
_B = attrs.evolve(_A, block_n=16, prefetch=False)
_T8 = attrs.evolve(_A, prefetch=False, loop_stages=3, tma=True)
_T16 = attrs.evolve(_T8, block_n=16)
WORD_GEMV_PER_MATRIX = {
    "A (table few)": _A,
    "B (table many)": _B,
    "T8": _T8,
    "T16": _T16,
    "w13 T8, w2 A": attrs.evolve(_T8, w2_tiles=_A),
    "w13 A, w2 T8": attrs.evolve(_A, w2_tiles=_T8),
    "w13 T16, w2 T8": attrs.evolve(_T16, w2_tiles=_T8),
    "w13 T8, w2 T16": attrs.evolve(_T8, w2_tiles=_T16),
    "T16 st2": attrs.evolve(_T16, loop_stages=2),
    "w13 T8 st2, w2 A": attrs.evolve(_T8, loop_stages=2, w2_tiles=_A),
    "T8 w2 split 4": attrs.evolve(_T8, w2_split=4),
    "A again": _A,
}
"""``SWEEP_WORDS=8``: the tiles of before TMA, TMA tiles (8 or 16 x 512, 3 stages) and
mixtures (``GemvTiles.w2_tiles``: the w2 GEMV's own tiles), then the first again
(``sweeps/sweep_words_tma_mix_h200.log``; "w13 T8, w2 T16" became ``GEMV_PAIRED``)."""


def w2_split_variants() -> dict[str, GemvTiles]:
    """``SWEEP_WORDS=9``: ``GEMV_PAIRED``'s w2 on 16 rows (as now) or 8, split 1-8.

    K split by the rule (``gemv_split_for``) or 2, 4 or 8 ways; then the table's
    again (run-to-run noise).
    """
    table = GEMV_PAIRED
    assert table.w2_tiles is not None
    t8 = attrs.evolve(table.w2_tiles, block_n=8)
    out = {"table": table}
    split: int | None
    for split in (2, 4, 8):
        out[f"w2 16 rows split {split}"] = attrs.evolve(table, w2_split=split)
    for split in (None, 2, 4, 8):
        out[f"w2 8 rows split {split or 'rule'}"] = attrs.evolve(
            table, w2_split=split, w2_tiles=t8
        )
    out["table again"] = table
    return out


EMULATION_GEMM = [  # (block_m, block_n w13, block_n w2, block_k, warps, stages, group_m)
    (128, 128, 128, 64, 8, 3, 8), (128, 128, 256, 64, 8, 3, 8), (128, 128, 128, 64, 8, 4, 8),
    (128, 128, 256, 64, 8, 4, 8), (256, 128, 128, 64, 8, 3, 8), (128, 128, 128, 32, 8, 5, 8),
    (128, 128, 128, 64, 8, 3, 16), (128, 128, 128, 64, 8, 3, 4), (128, 64, 128, 64, 4, 4, 8),
]  # fmt: skip
"""16-bit prefill variants (``sweep_tiles.py emulation``); the first is the table's."""
OPERAND_ROWS = [  # (block_m, block_n, block_k, warps, stages): swapped, nibble halves
    (16, 64, 128, 4, 4), (16, 64, 256, 4, 3), (32, 64, 128, 4, 4), (64, 128, 64, 4, 3),
]  # fmt: skip
PREFILL_GEMM = [  # (block_m, block_n w13, block_n w2, block_k, warps, stages)
    (128, 128, 128, 64, 8, 3),
    (64, 128, 128, 64, 4, 3),
    (128, 64, 128, 64, 8, 4),
]


def variants(
    m: int, k: int, e: int, default: MoETiles, mode: str
) -> dict[str, FusedKw]:
    """Keyword arguments of fused_moe per variant name."""
    if mode == "emulation":
        out_e: dict[str, FusedKw] = {"auto": {}}
        for bm, bn13, bn2, bk, w, st, gm in EMULATION_GEMM:
            t = GemmTiles(
                block_n=bn13, block_k=bk, num_warps=w, num_stages=st, group_m=gm
            )
            tiles = MoETiles(block_m=bm, w13=t, w2=attrs.evolve(t, block_n=bn2))
            name = f"emulation bm{bm} bn{bn13}/{bn2} bk{bk} w{w} s{st} g{gm}"
            out_e[name] = {"tiles": tiles}
        return out_e
    if mode == "operands":
        return operand_variants(m, k, e, default)
    if mode == "group":
        return {}  # group_fns
    if mode == "words":
        out_w: dict[str, FusedKw] = {"auto": {}}
        word_set: list[WordTile] = {
            "2": WORD_GEMV_ROUND2, "3": WORD_GEMV_TABLE, "4": WORD_GEMV_PAIRED,
            "5": WORD_GEMV_PAIRED_NEXT, "6": WORD_GEMV_PDL, "7": WORD_GEMV_TMA,
        }.get(os.environ.get("SWEEP_WORDS", ""), WORD_GEMV)  # fmt: skip
        if os.environ.get("SWEEP_WORDS") == "8":
            word_set = []
            for name, gt in WORD_GEMV_PER_MATRIX.items():
                out_w[f"words {name}"] = {"gemv_tiles": gt, "path": "gemv"}
        if os.environ.get("SWEEP_WORDS") == "9":
            return {
                f"words {name}": {"gemv_tiles": gt, "path": "gemv"}
                for name, gt in w2_split_variants().items()
            }
        for i, (bn, bk, w, split, pre, stages, *more) in enumerate(word_set):
            pdl = len(more) > 1 and bool(more[1])
            tma = len(more) > 2 and bool(more[2])
            gt = GemvTiles(
                block_n=bn, block_k=bk, num_warps=w, w2_split=split, words=True,
                prefetch=pre, loop_stages=stages, paired=bool(more), pdl=pdl, tma=tma,
            )  # fmt: skip
            name = f"words bn{bn} bk{bk} w{w} split{split} pre{int(pre)} st{stages}"
            name += " paired" if more else ""
            name += " pdl" if pdl else ""
            name += " tma" if tma else ""
            out_w[name if name not in out_w else f"{name} #{i}"] = {
                "gemv_tiles": gt,
                "path": "gemv",
            }
        return out_w
    if mode == "gemv":
        base = GEMV_FEW  # the loop variants are the byte kernel's
        return {
            f"gemv {name}": {"path": "gemv", "gemv_tiles": attrs.evolve(base, **kw)}
            for name, kw in GEMV_LOOP_VARIANTS.items()
        }
    out: dict[str, FusedKw] = {"auto": {}}
    if m <= 64:
        for bn, bk, w, st in DECODE_GEMM:
            t = GemmTiles(block_n=bn, block_k=bk, num_warps=w, num_stages=st)
            tiles = MoETiles(
                block_m=default.block_m,
                w13=t,
                w2=attrs.evolve(t, split_k=default.w2.split_k),
            )
            out[f"gemm bn{bn} bk{bk} w{w} s{st}"] = {"tiles": tiles, "path": "gemm"}
        for bn, bk, w in DECODE_GEMV:
            gt = GemvTiles(block_n=bn, block_k=bk, num_warps=w)
            out[f"gemv bn{bn} bk{bk} w{w}"] = {"gemv_tiles": gt, "path": "gemv"}
        return out
    for bm, bn13, bn2, bk, w, st in PREFILL_GEMM:
        tiles = MoETiles(
            block_m=bm,
            w13=GemmTiles(block_n=bn13, block_k=bk, num_warps=w, num_stages=st),
            w2=GemmTiles(block_n=bn2, block_k=bk, num_warps=w, num_stages=st),
        )
        name = f"bm{bm} bn{bn13}/{bn2} bk{bk} w{w} s{st}"
        out[f"gemm {name}"] = {"tiles": tiles, "path": "gemm"}
        out[f"dequant {name}"] = {"tiles": tiles, "path": "dequant"}
    return out


def operand_variants(m: int, k: int, e: int, default: MoETiles) -> dict[str, FusedKw]:
    """The int4 table beside the previous table's plain tiles, rows, and the GEMV.

    The table has swapped operands (int32 words at decode, nibble halves above; it
    had nibble halves everywhere when the logged rounds ran); the GEMV is timed at
    decode.
    The first round of this sweep (bench/sweeps/sweep_operands_round1_*.log) timed
    each tile with and without swapped operands; swapped won almost everywhere.
    """
    out: dict[str, FusedKw] = {"auto": {}, "gemm table": {"path": "gemm"}}
    if m <= 64:
        out["gemv"] = {"path": "gemv"}
    plain = choose_tiles(
        num_pairs=m * k, num_experts=e, hidden_size=1, intermediate_size=1,
        sixteen_bit=True,
    )  # fmt: skip
    if m * k < SIXTEEN_BIT_MIN_PAIRS:  # the previous int4 table's plain tiles
        out["gemm plain (previous table)"] = {
            "path": "gemm",
            "tiles": attrs.evolve(
                plain, w2=attrs.evolve(plain.w2, split_k=default.w2.split_k)
            ),
        }
    for bm, bn, bk, w, st in OPERAND_ROWS:
        t = GemmTiles(
            block_n=bn, block_k=bk, num_warps=w, num_stages=st, swap_ab=True,
            nibble_halves=True,
        )  # fmt: skip
        split = default.w2.split_k if bm == 16 else 1
        tiles = MoETiles(block_m=bm, w13=t, w2=attrs.evolve(t, split_k=split))
        out[f"halves swap bm{bm} bn{bn} bk{bk} w{w} s{st}"] = {
            "tiles": tiles,
            "path": "gemm",
        }
    return out


GROUP_MS = (0, 4, 8, 16, 32)


def group_fns(
    x: torch.Tensor,
    r: Routing,
    cfg: MoEConfig,
    int4: tuple[ExpertMatrix, ExpertMatrix],
    dense: tuple[ExpertMatrix, ExpertMatrix],
) -> dict[str, Callable[[], torch.Tensor]]:
    """The table's tiles in each launch order (``GemmTiles.group_m``), int4 and bf16."""
    out: dict[str, Callable[[], torch.Tensor]] = {}
    pairs = r.topk_ids.numel()
    for label, (a, b) in (("w4a16", int4), ("emulation", dense)):
        dq = label == "w4a16" and use_dequant(pairs, a)
        base = pick_tiles(pairs, a, b, dequant=dq)
        path: FusedPath = "dequant" if dq else "gemm"
        for g in GROUP_MS:
            tiles = attrs.evolve(
                base,
                w13=attrs.evolve(base.w13, group_m=g),
                w2=attrs.evolve(base.w2, group_m=g),
            )

            def run(
                a: ExpertMatrix = a, b: ExpertMatrix = b, t: MoETiles = tiles,
                p: FusedPath = path,
            ) -> torch.Tensor:  # fmt: skip
                return fused_moe(x, a, b, r, cfg, tiles=t, path=p)

            out[f"{label} {path} group_m {g}"] = run
    return out


def main() -> None:
    mode = sys.argv[1]
    only = sys.argv[2:] or list(MODELS)
    torch.manual_seed(0)
    bw = copy_bandwidth()
    out_path = Path(os.environ.get("OUT", "/tmp")) / f"sweep_{mode}.jsonl"
    print(f"copy {bw / 1e12:.2f} TB/s", flush=True)
    ms_list = {
        "decode": [1, 4, 16, 64],
        "gemv": [1, 4],
        "words": [1, 4],
        "operands": [1, 4, 16, 64, 256],
        "group": [1024, 4096],
    }.get(mode, [256, 1024, 4096])
    emulation = mode == "emulation"
    if os.environ.get("SWEEP_M"):
        ms_list = [int(v) for v in os.environ["SWEEP_M"].split(",")]
    for name in only:
        e, k, d, f = MODELS[name]
        cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        q = random_int4(e, d, f)
        w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
        w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
        dense = None
        dense16 = None
        if mode == "group":
            w13d, w2d = dense_bf16(q)
            dense16 = (ExpertMatrix(data=w13d), ExpertMatrix(data=w2d))
        if emulation:  # the variants run on 16-bit weights, the anchor beside them
            w13d, w2d = dense_bf16(q)
            w13, w2 = ExpertMatrix(data=w13d), ExpertMatrix(data=w2d)
        if mode == "prefill" and e * d * f <= 2**33:
            w13d, w2d = dequantize_expert_weights(q, dtype=torch.bfloat16)
            dense = (ExpertMatrix(data=w13d), ExpertMatrix(data=w2d), w13d, w2d)
        for m in ms_list:
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            active = int(torch.unique(r.topk_ids).numel())
            fl = floor_ms(m, active, e, k, d, f, bw, 1e30)
            ref = moe_forward_reference(x, q, r, cfg)
            default = pick_tiles(m * k, w13, w2)
            fns: dict[str, Callable[[], torch.Tensor]] = {}
            for key, kw in variants(m, k, e, default, mode).items():

                def variant_fn(kw: FusedKw = kw) -> torch.Tensor:
                    return fused_moe(x, w13, w2, r, cfg, **kw)

                fns[key] = variant_fn
            if dense16 is not None:
                fns = group_fns(x, r, cfg, (w13, w2), dense16)

                def anchor_fn(
                    d16: tuple[ExpertMatrix, ExpertMatrix] = dense16,
                ) -> torch.Tensor:
                    return grouped_mm_anchor(
                        x, d16[0].data.transpose(1, 2), d16[1].data.transpose(1, 2), r
                    )

                fns["grouped_mm bf16"] = anchor_fn
            if emulation:
                fns["grouped_mm bf16"] = lambda: grouped_mm_anchor(
                    x, w13.data.transpose(1, 2), w2.data.transpose(1, 2), r
                )
            if dense is not None:

                def resident_fn(
                    dn: tuple[
                        ExpertMatrix, ExpertMatrix, torch.Tensor, torch.Tensor
                    ] = dense,
                ) -> torch.Tensor:
                    return fused_moe(x, dn[0], dn[1], r, cfg)

                fns["emulation (bf16 resident)"] = resident_fn
                w13t, w2t = dense[2].transpose(1, 2), dense[3].transpose(1, 2)
                fns["grouped_mm bf16"] = lambda: grouped_mm_anchor(x, w13t, w2t, r)
            for key, fn in fns.items():
                try:
                    err = rel_err(ref, fn())
                    ms = time_graph(fn) if m <= 64 else time_eager(fn)
                except Exception as exc:  # a variant may not compile
                    msg = f"{name} M={m} {key}: FAILED {type(exc).__name__}: {exc}"
                    print(msg[:300])
                    continue
                row = {"model": name, "M": m, "active": active, "floor_ms": fl,
                       "variant": key, "ms": ms, "relerr": err}  # fmt: skip
                ratio = f"{ms / fl:.2f}x" if ms else "-"
                print(
                    f"{name:15s} M={m:4d} {key:38s} {ms if ms else float('nan'):8.4f} ms"
                    f" {ratio:>7s} err {err:.1e}",
                    flush=True,
                )
                with out_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
        del q, dense, dense16
        torch.cuda.empty_cache()
    if mode == "gemv":
        print(f"GEMV_VARIANT={choose_gemv_variant(out_path)}", flush=True)


def choose_gemv_variant(path: Path) -> str:
    """The GEMV loop variant bench_gpu.py should take.

    The fastest one that beats ``base`` by >= 5% (geometric mean over the rows) and is
    nowhere more than 3% slower; else ``base``.
    """
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    base = {(r["model"], r["M"]): r["ms"] for r in rows if r["variant"] == "gemv base"}
    best, best_gain = "base", 1.05
    for name in GEMV_LOOP_VARIANTS:
        ratios = [
            base[(r["model"], r["M"])] / r["ms"]
            for r in rows
            if r["variant"] == f"gemv {name}" and r["ms"]
        ]
        wrong = [
            r for r in rows if r["variant"] == f"gemv {name}" and r["relerr"] > 1e-2
        ]
        if wrong or len(ratios) != len(base) or min(ratios) < 0.97:
            continue
        gain = math.prod(ratios) ** (1 / len(ratios))
        print(f"{name}: geometric-mean speedup {gain:.3f}, worst {min(ratios):.3f}")
        if gain > best_gain:
            best, best_gain = name, gain
    return best


if __name__ == "__main__":
    main()
