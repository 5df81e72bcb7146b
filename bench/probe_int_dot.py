"""The decode GEMV's integer products (``GemvTiles.int_dot``) against its float16 chains.

Run on the GPU from the repository root: ``python bench/probe_int_dot.py [model ...]``
(``PROBE_M=1,4`` for other sizes; default 1, 4 and 16). For each model shape and M it
times, under CUDA-graph replay with L2 flushed (as ``bench_gpu.py``), triton-w4a16 as
the table runs it (``auto``, first and last), its ``gemv`` path on the table's GEMV
tiles (``pick_gemv_tiles``) in float16 chains (``int_dot`` off on both GEMVs), and the
same tiles with ``int_dot`` on both GEMVs, on w13 alone, on w2 alone, and on both with
w13 in 16-row tiles; each output is checked against the float32 reference first
(``err``). (``sweeps/probe_int_dot_h100.log`` ran when the table was the float16 form,
its ``gemv table`` row the float16 one.) ``PROBE_SET=2``: the table (now with
integer products) against other tiles around it (``tile_variants``); ``PROBE_SET=3``:
the table (``auto``, before and after) against its GEMV forced (``gemv``), for the
decode rule (``use_gemv``); ``PROBE_SET=6``: the table's GEMV tiles with their
inputs, scales and zero points loaded at their step (``gemv table``: the table before
``GemvTiles.inputs_ahead``) against the same a step ahead on both GEMVs (the table of
now), on w13 alone and on w2 alone, each twice, alternating (tiles that load
everything ahead, ``prefetch``, keep their form); ``PROBE_ROUTES=n``: n routing draws a
cell.
"""

# ruff: noqa: D103
# A GPU script, not library code: print is its output.

import os
import sys
from pathlib import Path
from typing import Any

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import (
    MODELS,
    probe_inputs,
    probe_models,
    probe_variant,
)

from backends.triton._fused import Path as FusedPath, fused_moe, pick_gemv_tiles
from backends.triton._tiles import GemvTiles


def tile_variants(table: GemvTiles) -> dict[str, tuple[FusedPath, GemvTiles | None]]:
    """``PROBE_SET=2``: other tiles around the table's (integer products throughout)."""
    w2 = table.w2_tiles or table
    gemv: dict[str, GemvTiles] = {
        "gemv table": table,
        "w13 4 rows": attrs.evolve(table, block_n=4),
        "w13 8 x 1024": attrs.evolve(table, block_k=1024),
        "2 stages": attrs.evolve(
            table, loop_stages=2, w2_tiles=attrs.evolve(w2, loop_stages=2)
        ),
        "4 stages": attrs.evolve(
            table, loop_stages=4, w2_tiles=attrs.evolve(w2, loop_stages=4)
        ),
        "w2 8 rows": attrs.evolve(table, w2_tiles=attrs.evolve(w2, block_n=8)),
        "w2 32 rows": attrs.evolve(table, w2_tiles=attrs.evolve(w2, block_n=32)),
        "w2 split 2": attrs.evolve(table, w2_split=2),
        "w2 split 4": attrs.evolve(table, w2_split=4),
    }
    return {
        "auto": ("auto", None),
        **{key: ("gemv", tiles) for key, tiles in gemv.items()},
        "auto again": ("auto", None),
    }


def ahead_variants(table: GemvTiles) -> dict[str, tuple[FusedPath, GemvTiles | None]]:
    """``PROBE_SET=6``: the table's GEMV tiles with and without ``inputs_ahead``."""
    w2 = attrs.evolve(table.w2_tiles or table, w2_tiles=None, inputs_ahead=False)
    base = attrs.evolve(table, w2_tiles=w2, inputs_ahead=False)  # loads at their step

    def ahead(tiles: GemvTiles) -> GemvTiles:
        return tiles if tiles.prefetch else attrs.evolve(tiles, inputs_ahead=True)

    gemv = {
        "gemv table": base,
        "ahead both": attrs.evolve(ahead(base), w2_tiles=ahead(w2)),
        "ahead w13": ahead(base),
        "ahead w2": attrs.evolve(base, w2_tiles=ahead(w2)),
    }
    runs: dict[str, tuple[FusedPath, GemvTiles | None]] = {"auto": ("auto", None)}
    for again in ("", " again"):
        runs |= {key + again: ("gemv", tiles) for key, tiles in gemv.items()}
    return runs


def variants(table: GemvTiles) -> dict[str, tuple[FusedPath, GemvTiles | None]]:
    """The probe's variants of the table's GEMV tiles ``table``."""
    if os.environ.get("PROBE_SET") == "2":
        return tile_variants(table)
    if os.environ.get("PROBE_SET") == "6":
        return ahead_variants(table)
    if os.environ.get("PROBE_SET") == "3":  # the decode rule: table against GEMV
        return {
            "auto": ("auto", None),
            "gemv": ("gemv", table),
            "auto again": ("auto", None),
        }
    w2 = attrs.evolve(table.w2_tiles or table, int_dot=False, w2_tiles=None)
    w2_int = attrs.evolve(w2, int_dot=True)
    base = attrs.evolve(table, int_dot=False, w2_tiles=w2)  # float16 chains
    return {
        "auto": ("auto", None),
        "gemv float16": ("gemv", base),
        "gemv int": ("gemv", attrs.evolve(base, int_dot=True, w2_tiles=w2_int)),
        "gemv int w13": ("gemv", attrs.evolve(base, int_dot=True)),
        "gemv int w2": ("gemv", attrs.evolve(base, w2_tiles=w2_int)),
        "gemv int w13 16 rows": (
            "gemv",
            attrs.evolve(base, block_n=16, int_dot=True, w2_tiles=w2_int),
        ),
        "auto again": ("auto", None),
    }


def cell(name: str, m: int, layer: tuple[Any, ...], bw: float, tag: str = "") -> None:
    """Time every variant of one model and M on one routing draw (``tag`` its label)."""
    k = MODELS[name][1]
    cfg, _, w13, w2 = layer
    x, r, fl, ref = probe_inputs(name, m, layer, bw)
    for key, (path, tiles) in variants(pick_gemv_tiles(m * k, w13)).items():

        def run(p: FusedPath = path, t: GemvTiles | None = tiles) -> torch.Tensor:
            return fused_moe(x, w13, w2, r, cfg, path=p, gemv_tiles=t)

        probe_variant(f"{name:15s} M={m:4d}{tag}", key, run, ref, fl)


def main() -> None:
    probe_models(cell, "1,4,16")


if __name__ == "__main__":
    main()
