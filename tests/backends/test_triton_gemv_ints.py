"""triton-w4a16's decode GEMV with integer products (``GemvTiles.int_dot``,
``_kernels_gemv_ints.py``) in Triton's CPU interpreter.

The interpreter runs the plain-Triton form of the ``dp4a`` math, meant to give the
same integers as the PTX the GPU runs (``test_int_dot_ptx_matches_its_plain_triton_form``
in ``test_triton_gemv_cuda.py`` compares the two on a GPU; 20 passed on an H100,
bench/sweeps/cuda_l2_call_h100.log). One GEMV is checked against an exact float64
model of the integer grid and against its documented bound, whole layers against the
oracle.
"""

import warnings

import attrs
import pytest
import torch

import backends.triton._launch_gemv as launch_gemv
from backends.triton._launch import ExpertMatrix
from backends.triton._tiles import GemvTiles
from core.config import MoEConfig
from core.routing import Routing
from tests.backends.triton_interpreter_cases import (
    GEMV_CASES,
    INTERPRETER_ONLY,
    PathCase,
    run_path,
)
from tests.tolerances import INTERPRETER_INT_DOT_REL_L2

pytestmark = INTERPRETER_ONLY

_TMA = GemvTiles(
    block_n=16,
    block_k=64,
    words=True,
    paired=True,
    tma=True,
    loop_stages=2,
    int_dot=True,
)
INT_TILES = {
    "plain": GemvTiles(block_n=16, block_k=64, words=True, paired=True, int_dot=True),
    "prefetch": GemvTiles(
        block_n=16, block_k=64, words=True, paired=True, prefetch=True, int_dot=True
    ),
    "tma": _TMA,
    "split-3": GemvTiles(
        block_n=16, block_k=32, words=True, paired=True, w2_split=3, int_dot=True
    ),
    "step-in-group": GemvTiles(
        block_n=16, block_k=32, words=True, paired=True, int_dot=True
    ),  # with groups of 64: two steps a group
    "inputs-ahead": GemvTiles(
        block_n=16, block_k=64, words=True, paired=True, inputs_ahead=True, int_dot=True
    ),
    "tma-inputs-ahead": attrs.evolve(_TMA, inputs_ahead=True),
}
"""Integer-product tiles: K tails (K = 96 in 64-column steps), loads one step ahead,
TMA reads, a K split whose third part is empty, steps inside one group, inputs one
step ahead (with plain word loads and by TMA)."""


def _gemv(
    x16: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor | None,
    *,
    group: int,
    tiles: GemvTiles,
) -> torch.Tensor:
    """One non-gated GEMV of ``x16`` (1, K) by expert 0's int4 ``codes`` (1, N, K), in
    float32."""
    n, k = int(codes.shape[1]), int(codes.shape[2])
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    matrix = ExpertMatrix(data=packed, scale=scale, zero_point=zero, group_size=group)
    config = MoEConfig(num_experts=1, top_k=1, hidden_size=k, intermediate_size=n)
    routing = Routing(
        topk_weights=torch.ones(1, 1), topk_ids=torch.zeros(1, 1, dtype=torch.int64)
    )
    out = torch.empty(1, n)
    with warnings.catch_warnings():  # the interpreter's numpy on inf inputs: intended
        warnings.simplefilter("ignore", RuntimeWarning)
        launch_gemv.launch_gemv(
            x16, matrix, out, n=n, routing=routing, config=config, gated=False,
            tiles=tiles,
        )  # fmt: skip
    return out


def _weights(
    n: int, k: int, group: int, *, asym: bool, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Codes, scales, zero points and their float64 weights (1, N, K)."""
    codes = torch.randint(0, 16, (1, n, k), generator=generator)
    scale = (torch.rand(1, n, k // group, generator=generator) * 0.02 + 0.005).to(
        torch.bfloat16
    )
    zero = None
    z: torch.Tensor | float = 8.0
    if asym:
        zero = torch.randint(0, 16, (1, n, k // group), generator=generator)
        zero = zero.to(torch.uint8)
        z = zero.double().repeat_interleave(group, -1)
    w64 = (codes.double() - z) * scale.double().repeat_interleave(group, -1)
    return codes, scale, zero, w64


def _inputs(kind: str, k: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 inputs (1, K): N(0, 1) times a scale, or an outlier among small ones."""
    x = torch.randn(1, k, generator=generator)
    if kind == "outlier":
        x = x * 1e-2
        x[0, 5] = 3e4
    else:
        x = x * float(kind)
    return x.to(torch.bfloat16)


def _on_grid(x16: torch.Tensor, *, block_k: int, group: int) -> torch.Tensor:
    """The inputs (1, K) as the integer GEMV rounds them, in float64.

    A step of ``block_k`` inputs pairs word ``wa(i)`` with ``wa(i) + HALF``
    (``_pair_loads``: ``HALF`` = half the step's words if the step lies in one group,
    else half a group's); each such column of 16 inputs is rounded half to even to
    multiples of ``2^(E - 13)``, ``2^E`` at or below its largest magnitude, ``E >= -109``.
    """
    x = x16.double()[0]
    k, words = x.numel(), block_k // 8
    half = words // 2 if block_k <= group else group // 16
    out = torch.zeros_like(x)
    for k0 in range(0, k, block_k):
        for i in range(words // 2):
            wa = k0 // 8 + (i // half) * 2 * half + i % half
            idx = [
                8 * w + j for w in (wa, wa + half) for j in range(8) if 8 * w + j < k
            ]
            big = x[idx].abs().max() if idx else x.new_zeros(())
            e = int(torch.frexp(big).exponent) - 1 if big > 0 else -109
            e = max(e, -109)
            out[idx] = torch.round(x[idx] * 2.0 ** (13 - e)) * 2.0 ** (e - 13)
    return out


@pytest.mark.parametrize("tiles", INT_TILES.values(), ids=INT_TILES.keys())
@pytest.mark.parametrize(
    "inputs", ["1", "1e-6", "1e15", "3e-33", "1e-33", "1e-35", "outlier"]
)
@pytest.mark.parametrize("asym", [False, True], ids=["sym", "asym"])
def test_int_gemv_rounds_each_column_to_its_grid(
    tiles: GemvTiles, inputs: str, asym: bool, generator: torch.Generator
) -> None:
    """The result is that of the inputs rounded on their columns' grids (``_on_grid``)
    up to float32 accumulation: every product and sum after the rounding is exact.
    And the documented bound holds: an output is off by at most 2^-14 sum_j |w_j|
    max|x| of j's group (a column lies inside one group), plus 2^-123 sum_j |w_j| for
    columns below 2^-109 (3e-33 is above it, 1e-33 and 1e-35 below)."""
    n, k, group = (32, 128, 64) if tiles.block_k == 32 else (32, 96, 32)
    codes, scale, zero, w64 = _weights(n, k, group, asym=asym, generator=generator)
    x16 = _inputs(inputs, k, generator)
    out = _gemv(x16, codes, scale, zero, group=group, tiles=tiles).double()
    size = (x16.double().abs() @ w64[0].abs().T)[0]
    rounded = _on_grid(x16, block_k=tiles.block_k, group=group) @ w64[0].T
    assert ((out[0] - rounded).abs() <= 1e-6 * size).all()
    want = x16.double() @ w64[0].T
    group_max = x16.double().abs().view(k // group, group).amax(-1)
    grid = 2.0**-14 * group_max.repeat_interleave(group) + 2.0**-123
    assert ((out[0] - want[0]).abs() <= w64[0].abs() @ grid + 1e-6 * size).all()


@pytest.mark.parametrize("tiles", INT_TILES.values(), ids=INT_TILES.keys())
def test_int_gemv_is_exact_on_bf16_inputs_within_2_6_of_the_column_max(
    tiles: GemvTiles, generator: torch.Generator
) -> None:
    """Every word's 8 inputs hold one in [1, 2), the rest in [2^-6, 2): each column's
    grid is 2^-13, on which every such bf16 input lies, so the result is exact up to
    float32 accumulation (a grid one bit coarser is off by 1e-4 of a term)."""
    n, k, group = (32, 128, 64) if tiles.block_k == 32 else (32, 96, 32)
    codes, scale, zero, w64 = _weights(n, k, group, asym=False, generator=generator)
    mantissa = 1 + torch.randint(0, 128, (1, k), generator=generator) / 128
    power = torch.randint(0, 7, (1, k), generator=generator).view(1, k // 8, 8)
    power[..., 0] = 0  # one input in [1, 2) a word
    sign = torch.where(torch.rand(1, k, generator=generator) < 0.5, -1.0, 1.0)
    x16 = (sign * mantissa * 2.0 ** -power.view(1, k)).to(torch.bfloat16)
    assert torch.equal(x16.float(), sign * mantissa * 2.0 ** -power.view(1, k))
    out = _gemv(x16, codes, scale, zero, group=group, tiles=tiles).double()
    want = x16.double() @ w64[0].T
    size = x16.double().abs() @ w64[0].abs().T
    assert ((out - want).abs() <= 1e-6 * size).all()


def test_int_gemv_non_finite_inputs_give_nan_and_zeros_give_zeros(
    generator: torch.Generator,
) -> None:
    """An inf or NaN input makes every output that reads it NaN (not +-inf as float64
    gives where the weight is nonzero: the column's scale factor is NaN); a token of
    zeros gives exact zeros."""
    n, k, group = 32, 96, 32
    codes, scale, zero, _ = _weights(n, k, group, asym=False, generator=generator)
    tiles = INT_TILES["plain"]
    for bad in (float("inf"), float("-inf"), float("nan")):
        x16 = _inputs("1", k, generator)
        x16[0, 40] = bad
        assert torch.isnan(
            _gemv(x16, codes, scale, zero, group=group, tiles=tiles)
        ).all()
    zeros = torch.zeros(1, k, dtype=torch.bfloat16)
    assert torch.equal(
        _gemv(zeros, codes, scale, zero, group=group, tiles=tiles), torch.zeros(1, n)
    )


@pytest.mark.parametrize(
    "tiles",
    [
        *INT_TILES.values(),
        GemvTiles(
            block_n=16,
            block_k=64,
            words=True,
            paired=True,
            tma=True,
            int_dot=True,
            w2_tiles=GemvTiles(
                block_n=32, block_k=32, words=True, paired=True, int_dot=True
            ),
        ),
        GemvTiles(
            block_n=16, block_k=64, words=True, paired=True, pdl=True, int_dot=True
        ),
    ],
    ids=[*INT_TILES.keys(), "w2-own-tiles", "pdl-ignored-off-sm90"],
)
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0].name}-{c[1]}-{c[2]}")
def test_int_gemv_layer_matches_oracle(
    case: PathCase, tiles: GemvTiles, generator: torch.Generator
) -> None:
    """Whole layers (every scheme and activation of ``GEMV_CASES``, an expert held
    elsewhere, router weights on the input) on the GEMV path with integer products."""
    run_path(
        "gemv", case, 3, generator, gemv_tiles=tiles,
        rel_l2_bound=INTERPRETER_INT_DOT_REL_L2[case[2]],
    )  # fmt: skip


def _ahead(tiles: GemvTiles) -> GemvTiles:
    """``tiles`` with ``inputs_ahead`` on both GEMVs."""
    w2 = (
        None
        if tiles.w2_tiles is None
        else attrs.evolve(tiles.w2_tiles, inputs_ahead=True)
    )
    return attrs.evolve(tiles, inputs_ahead=True, w2_tiles=w2)


AHEAD_BASES = {
    **{name: INT_TILES[name] for name in ("plain", "tma", "split-3", "step-in-group")},
    "float16-chains": attrs.evolve(INT_TILES["plain"], int_dot=False),
    "float16-tma": attrs.evolve(INT_TILES["tma"], int_dot=False),
}
"""Tiles whose ``inputs_ahead`` form must equal them: integer products and float16
chains, plain and TMA word loads, K tails, a K split with an empty part, steps in
one group."""


@pytest.mark.parametrize("tiles", AHEAD_BASES.values(), ids=AHEAD_BASES.keys())
@pytest.mark.parametrize(
    "case", [*GEMV_CASES[:2], GEMV_CASES[3]], ids=lambda c: f"{c[0].name}-{c[1]}"
)
def test_inputs_ahead_equals_loads_at_their_step_bit_for_bit(
    case: PathCase, tiles: GemvTiles
) -> None:
    """``GemvTiles.inputs_ahead`` moves loads, not math: whole layers (gated w13, w2,
    an expert held elsewhere) give the same bits with and without it. Groups of 32
    (one or two a step) and whole rows (K = 96 and 64: the 32-column steps lie inside
    one group, the 64-column ones end in a tail)."""
    outs = [
        run_path(
            "gemv",
            case,
            3,
            torch.Generator().manual_seed(7),
            gemv_tiles=form,
            rel_l2_bound=INTERPRETER_INT_DOT_REL_L2[case[2]] if tiles.int_dot else None,
        )[0]
        for form in (tiles, _ahead(tiles))
    ]
    assert torch.equal(outs[0], outs[1])
