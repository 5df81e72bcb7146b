"""triton-w4a16's one-launch decode GEMV (``GemvTiles.handoff``) in Triton's CPU
interpreter, and the rules of its launcher.

The interpreter runs programs one after another in order, so every w2 job finds its
pair's w13 jobs done: the waits and the memory ordering between programs that run at
once are tested on a GPU (``test_triton_gemv_cuda.py``). What is tested here: each
job computes what the two-launch GEMVs compute, bit for bit, on every tile form, and
whole layers match the oracle.
"""

import attrs
import pytest
import torch

from backends.triton._launch import ExpertMatrix
from backends.triton._launch_gemv_handoff import handoff_fits, handoff_rows
from backends.triton._tiles import GemvTiles
from tests.backends.triton_interpreter_cases import (
    GEMV_CASES,
    INTERPRETER_ONLY,
    PathCase,
    run_path,
)
from tests.tolerances import INTERPRETER_INT4_REL_L2, INTERPRETER_INT_DOT_REL_L2

_PAIRED = GemvTiles(block_n=16, block_k=64, words=True, paired=True)
HANDOFF_TILES = {
    "float16": _PAIRED,
    "int": attrs.evolve(_PAIRED, int_dot=True),
    "prefetch": attrs.evolve(_PAIRED, prefetch=True, int_dot=True),
    "tma": attrs.evolve(_PAIRED, tma=True, loop_stages=2, int_dot=True),
    "w2-split-3": attrs.evolve(_PAIRED, block_k=32, w2_split=3, int_dot=True),
    "w2-own-tiles": attrs.evolve(
        _PAIRED,
        tma=True,
        int_dot=True,
        w2_tiles=GemvTiles(block_n=32, block_k=32, words=True, paired=True),
    ),
}
"""Tiles run in one launch (``handoff`` set by the tests): float16 chains and integer
products, loads a step ahead, TMA reads, a w2 K split whose third part is empty, w2 on
tiles of its own (float16 chains there)."""


@INTERPRETER_ONLY
@pytest.mark.parametrize("tiles", HANDOFF_TILES.values(), ids=HANDOFF_TILES.keys())
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0].name}-{c[1]}-{c[2]}")
def test_one_launch_equals_two(case: PathCase, tiles: GemvTiles) -> None:
    """Bit for bit the two-launch GEMVs' output on the same tiles (every scheme and
    activation of ``GEMV_CASES``, an expert held elsewhere, router weights on the
    input), and the oracle's up to the tiles' bound."""
    bound = (INTERPRETER_INT_DOT_REL_L2 if tiles.int_dot else INTERPRETER_INT4_REL_L2)[
        case[2]
    ]
    outs = [
        run_path(
            "gemv", case, 3, torch.Generator().manual_seed(11),
            gemv_tiles=attrs.evolve(tiles, handoff=handoff), rel_l2_bound=bound,
        )[0]
        for handoff in (True, False)
    ]  # fmt: skip
    assert torch.equal(outs[0], outs[1])


def _matrix(group: int, *, aligned: bool = True) -> ExpertMatrix:
    """Two experts of 32 rows and 64 codes; bytes one past a word boundary unless
    ``aligned``."""
    k = 64
    start = 0 if aligned else 1
    flat = torch.zeros(2 * 32 * k // 2 + 1, dtype=torch.uint8)
    return ExpertMatrix(
        data=flat[start : start + 2 * 32 * k // 2].view(2, 32, k // 2),
        scale=torch.ones(2, 32, k // group, dtype=torch.bfloat16),
        group_size=group,
    )


def test_handoff_fits_the_paired_kernel_on_both_gemvs() -> None:
    on = attrs.evolve(_PAIRED, handoff=True)
    w13, w2 = _matrix(32), _matrix(32)
    assert handoff_fits(w13, w2, on)
    assert not handoff_fits(w13, w2, _PAIRED)  # not asked for
    assert not handoff_fits(w13, w2, attrs.evolve(on, paired=False))
    assert not handoff_fits(w13, w2, attrs.evolve(on, words=False))
    w2_bytes = attrs.evolve(on, w2_tiles=attrs.evolve(_PAIRED, words=False))
    assert not handoff_fits(w13, w2, w2_bytes)
    w2_warps = attrs.evolve(on, w2_tiles=attrs.evolve(_PAIRED, num_warps=2))
    assert not handoff_fits(w13, w2, w2_warps)
    assert not handoff_fits(_matrix(8), _matrix(8), on)  # one word a group
    unaligned = _matrix(32, aligned=False)
    assert not unaligned.words_fit
    assert not handoff_fits(w13, unaligned, on)  # w2 not readable as words


@pytest.mark.parametrize(
    ("dtype", "f", "stride"),
    [(torch.bfloat16, 1536, 1536), (torch.bfloat16, 100, 128), (torch.float32, 33, 64)],
)
def test_handoff_rows_start_on_their_own_lines(
    dtype: torch.dtype, f: int, stride: int
) -> None:
    rows = handoff_rows(5, f, torch.empty(0, dtype=dtype))
    assert rows.shape == (5, f)
    assert rows.dtype == dtype
    assert rows.stride() == (stride, 1)
    assert (rows.stride(0) * rows.element_size()) % 128 == 0
