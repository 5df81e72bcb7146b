"""The variants ``bench/sweep_tiles.py`` times, by mode (its docstring lists them).

A GPU script's data: tile tables and the ``fused_moe`` keyword arguments they give.
"""

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias, TypedDict

import attrs
import torch
from bench_gpu import (
    GEMV_LOOP_VARIANTS,
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
        return _emulation_variants()
    if mode == "operands":
        return operand_variants(m, k, e, default)
    if mode == "group":
        return {}  # group_fns
    if mode == "words":
        return _word_variants()
    if mode == "gemv":
        base = GEMV_FEW  # the loop variants are the byte kernel's
        return {
            f"gemv {name}": {"path": "gemv", "gemv_tiles": attrs.evolve(base, **kw)}
            for name, kw in GEMV_LOOP_VARIANTS.items()
        }
    return _table_variants(m, default)


def _emulation_variants() -> dict[str, FusedKw]:
    """``emulation``: the 16-bit GEMM's tiles of ``EMULATION_GEMM``."""
    out_e: dict[str, FusedKw] = {"auto": {}}
    for bm, bn13, bn2, bk, w, st, gm in EMULATION_GEMM:
        t = GemmTiles(block_n=bn13, block_k=bk, num_warps=w, num_stages=st, group_m=gm)
        tiles = MoETiles(block_m=bm, w13=t, w2=attrs.evolve(t, block_n=bn2))
        name = f"emulation bm{bm} bn{bn13}/{bn2} bk{bk} w{w} s{st} g{gm}"
        out_e[name] = {"tiles": tiles}
    return out_e


def _word_variants() -> dict[str, FusedKw]:
    """``words``: the word GEMV's tiles of the set ``SWEEP_WORDS`` names."""
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


def _table_variants(m: int, default: MoETiles) -> dict[str, FusedKw]:
    """No mode: the decode GEMM and GEMV tiles at ``m`` <= 64, else the prefill's."""
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
