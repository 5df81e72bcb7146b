"""triton-w4a16's decode GEMV (bytes, int32 words, paired words, TMA reads; the
16-bit GEMV of triton-emulation) in Triton's CPU interpreter on tiny shapes, each
against the oracle and the gemm path; the fallbacks where words or TMA do not fit.

int4 weights match the float32 oracle up to one-ulp output flips here
(``INTERPRETER_INT4_*``); 16-bit weights keep the kernel tolerances.
"""

import warnings

import attrs
import pytest
import torch

import backends.triton._launch as launch
import backends.triton._launch_gemv as launch_gemv
from backends.triton import EmulationMemoryWarning, TritonEmulationBackend
from backends.triton._fused import fused_moe, use_gemv
from backends.triton._launch import ExpertMatrix, int4_words_fit
from backends.triton._tiles import GemvTiles
from core.config import MoEConfig
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import Routing, route_topk
from core.scheme import Int4Mapping, Int4Scheme
from core.weights import QuantizedExpertWeights
from tests.backends.triton_interpreter_cases import (
    GEMV_CASES,
    INTERPRETER_ONLY,
    SCHEMES,
    D,
    E,
    F,
    PathCase,
    assert_matches_gemm,
    check_w4a16,
    path_config,
    run_path,
    tiny_config,
    weights_for,
)
from tests.tolerances import KERNEL_VS_ORACLE, REL_L2_VS_ORACLE, rel_l2

pytestmark = INTERPRETER_ONLY


WORDS_GEMV = GemvTiles(block_n=16, block_k=64, words=True)
"""The int32-word GEMV in the interpreter: two groups of 32 per step, a K tail (D = 96)."""
PAIRED_GEMV = attrs.evolve(WORDS_GEMV, paired=True)
"""The same, two words of a group per chain (``_kernels_gemv_pairs.py``)."""


@pytest.mark.parametrize(
    "tiles", [None, WORDS_GEMV, PAIRED_GEMV], ids=["bytes", "words", "paired"]
)
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0].name}-{c[1]}-{c[2]}")
def test_gemv_decode_path_matches_oracle_and_gemm(
    case: PathCase, tiles: GemvTiles | None, generator: torch.Generator
) -> None:
    assert_matches_gemm(*run_path("gemv", case, 3, generator, gemv_tiles=tiles))


@pytest.mark.parametrize(
    "tiles",
    [
        GemvTiles(block_n=16, block_k=64, prefetch=True),
        GemvTiles(block_n=16, block_k=64, loop_stages=2),
        GemvTiles(block_n=16, block_k=32, w2_split=2),
        GemvTiles(block_n=16, block_k=32, w2_split=3),  # the third split is empty
        GemvTiles(block_n=16, block_k=32, prefetch=True, w2_split=2),
        GemvTiles(block_n=16, block_k=32, words=True, w2_split=2),
        GemvTiles(block_n=32, block_k=32, num_warps=2, words=True, w2_split=3),
        GemvTiles(block_n=16, block_k=64, words=True, prefetch=True),
        GemvTiles(block_n=16, block_k=32, words=True, prefetch=True, w2_split=3),
        GemvTiles(block_n=16, block_k=32, words=True, loop_stages=2),
        GemvTiles(block_n=16, block_k=32, words=True, paired=True, w2_split=3),
        GemvTiles(block_n=16, block_k=64, words=True, paired=True, prefetch=True),
        GemvTiles(
            block_n=16, block_k=32, words=True, paired=True, prefetch=True, w2_split=3
        ),
        GemvTiles(block_n=16, block_k=32, words=True, paired=True, loop_stages=2),
        GemvTiles(block_n=16, block_k=64, words=True, paired=True, pdl=True),
        GemvTiles(
            block_n=16, block_k=64, words=True, paired=True, tma=True, loop_stages=2
        ),
        GemvTiles(
            block_n=16, block_k=32, words=True, paired=True, tma=True, w2_split=3
        ),
        GemvTiles(
            block_n=16,
            block_k=64,
            words=True,
            paired=True,
            tma=True,
            w2_tiles=GemvTiles(block_n=32, block_k=32, words=True, paired=True),
        ),
    ],
    ids=[
        "prefetch",
        "loop-stages-2",
        "w2-split-2",
        "w2-split-3",
        "prefetch-split-2",
        "words-split-2",
        "words-split-3",
        "words-prefetch-k-tail",
        "words-prefetch-split-3",
        "words-loop-stages-2",
        "paired-split-3",
        "paired-prefetch-k-tail",
        "paired-prefetch-split-3",
        "paired-loop-stages-2",
        "paired-pdl-ignored-off-sm90",  # plain launches where the GPU lacks PDL
        "paired-tma-k-tail",  # D = 96 in 64-column boxes: the tail box reads zeros
        "paired-tma-split-3",
        "paired-tma-w2-own-tiles",
    ],
)
@pytest.mark.parametrize("case", [GEMV_CASES[0], GEMV_CASES[1]], ids=["sym", "asym"])
def test_gemv_loop_variants_match_oracle(
    tiles: GemvTiles, case: PathCase, generator: torch.Generator
) -> None:
    run_path("gemv", case, 2, generator, drop=False, gemv_tiles=tiles)


@pytest.mark.parametrize("tiles", [WORDS_GEMV, PAIRED_GEMV], ids=["words", "paired"])
@pytest.mark.parametrize("scale", [1e-6, 1e6, 1e15], ids=str)
@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[1]], ids=lambda s: s.name)
def test_word_gemv_scales_inputs_of_any_magnitude(
    scale: float, scheme: Int4Scheme, tiles: GemvTiles, generator: torch.Generator
) -> None:
    """Each step's input is divided by a power of two and its result multiplied back
    (float16 products on the GPU): exact here at any magnitude, and a token of zeros
    (steps whose largest input is 0) gives zeros. gelu: erf does not overflow in the
    interpreter's numpy where silu's exp would (warnings are errors here); 1e15 gives
    1e30 after the gated product, inside bf16's range."""
    config = tiny_config("gelu")
    weights = weights_for(scheme, torch.bfloat16, generator)
    hidden_TD = torch.randn(3, D, generator=generator) * scale
    hidden_TD[1] = 0.0
    hidden_TD = hidden_TD.to(torch.bfloat16)
    routing = route_topk(torch.randn(3, E, generator=generator), config)
    out, _ = check_w4a16(
        weights, config, hidden_TD, routing, path="gemv", gemv_tiles=tiles
    )
    assert torch.equal(out[1], torch.zeros_like(out[1]))


BYTES_GEMV = GemvTiles(block_n=16, block_k=64)
"""The byte GEMV (``_moe_gemv_kernel``): the interpreter's tile, and CUDA's where K or
the group is not a multiple of 8."""


@pytest.mark.parametrize(
    "tiles", [BYTES_GEMV, WORDS_GEMV, PAIRED_GEMV], ids=["bytes", "words", "paired"]
)
def test_gemv_keeps_small_terms_beside_an_outlier_and_infinite_inputs(
    tiles: GemvTiles, generator: torch.Generator
) -> None:
    """One input of 3e4 among inputs of 1e-2, over weights of 0 at its column on half
    the rows: those rows are the small terms' sum alone (a zero point folded out as
    ``sum(q x) - z sum(x)`` cancelled the outlier against itself: relative errors up
    to 1.3); an infinite input gives +-inf where its column's weight is nonzero and
    NaN where it is 0, as float64 does (``inf - inf`` made every row NaN)."""
    n, k, group = 32, 128, 32
    codes = torch.randint(0, 16, (1, n, k), generator=generator)
    codes[0, : n // 2, 0] = 8  # weight 0 at the outlier's column
    codes[0, n // 2 :, 0] = 12  # weight 4 * scale there: +-inf with an infinite input
    scale = (torch.rand(1, n, k // group, generator=generator) * 0.02 + 0.005).to(
        torch.bfloat16
    )
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    matrix = ExpertMatrix(data=packed, scale=scale, zero_point=None, group_size=group)
    w64 = (codes.double() - 8) * scale.double().repeat_interleave(group, -1)
    config = MoEConfig(num_experts=1, top_k=1, hidden_size=k, intermediate_size=n)
    routing = Routing(
        topk_weights=torch.ones(1, 1), topk_ids=torch.zeros(1, 1, dtype=torch.int64)
    )
    x = torch.randn(1, k, generator=generator) * 1e-2
    x[0, 0] = 3e4
    for first in (3e4, float("inf")):
        x[0, 0] = first
        x16 = x.to(torch.bfloat16)
        out = torch.empty(1, n)
        with warnings.catch_warnings():  # the interpreter's numpy on inf * 0: intended
            warnings.simplefilter("ignore", RuntimeWarning)
            launch_gemv.launch_gemv(
                x16, matrix, out, n=n, routing=routing, config=config, gated=False,
                tiles=tiles,
            )  # fmt: skip
        want = x16.double() @ w64[0].T
        if first == 3e4:  # error against the size of the terms (float32 sums)
            size = x16.double().abs() @ w64[0].abs().T
            small = (out.double() - want).abs() / size
            assert float(small[0, : n // 2].max()) < 1e-5
        else:
            assert torch.isnan(out[0, : n // 2]).all()
            torch.testing.assert_close(out[0, n // 2 :].double(), want[0, n // 2 :])


@pytest.mark.parametrize("case", GEMV_CASES[:4], ids=lambda c: c[0].name)
def test_tma_reads_equal_plain_loads(
    case: PathCase, generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The paired GEMV's TMA reads (``GemvTiles.tma``; the interpreter emulates the
    descriptor) give the plain loads' output bit for bit: the same words meet the
    same inputs, whatever the groups (g32 over 64-column steps, the whole row), the
    zero points and the K tail. Both w13 and w2 go through a descriptor."""
    built: list[tuple[int, ...]] = []
    real = launch_gemv._words_descriptor

    def spy(words: torch.Tensor, tiles: GemvTiles) -> object:
        built.append(tuple(words.shape))
        return real(words, tiles)

    monkeypatch.setattr(launch_gemv, "_words_descriptor", spy)
    plain = GemvTiles(block_n=16, block_k=64, words=True, paired=True, w2_split=2)
    tma = attrs.evolve(plain, tma=True, loop_stages=2)
    generator.manual_seed(7)
    out_plain, *_ = run_path("gemv", case, 3, generator, gemv_tiles=plain)
    assert built == []
    generator.manual_seed(7)
    out_tma, *_ = run_path("gemv", case, 3, generator, gemv_tiles=tma)
    assert built == [(E, 2 * F, D // 8), (E, D, F // 8)]
    assert torch.equal(out_tma, out_plain)


def _per_row_layer(
    d: int, f: int, scheme: Int4Scheme, dtype: torch.dtype, generator: torch.Generator
) -> tuple[QuantizedExpertWeights, MoEConfig, torch.Tensor, Routing]:
    """A 4-expert top-2 layer of hidden size ``d`` and intermediate ``f`` (odd word
    counts allowed), quantized with ``scheme``, and 3 tokens routed over it."""
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=d, intermediate_size=f)
    w13 = torch.randn(4, 2 * f, d, generator=generator) * 0.2
    w2 = torch.randn(4, d, f, generator=generator) * 0.2
    weights = quantize_expert_weights(w13, w2, scheme, scale_dtype=dtype)
    hidden_TD = torch.randn(3, d, generator=generator).to(dtype)
    routing = route_topk(torch.randn(3, 4, generator=generator), config)
    return weights, config, hidden_TD, routing


def test_tma_tiles_on_weights_without_words_fall_back(
    generator: torch.Generator,
) -> None:
    """TMA tiles where w2 is not whole words (K = 60): w13 reads by descriptor, w2
    runs the byte kernel with the same tiles (unpipelined), and the layer matches the
    oracle."""
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=-1)
    weights, config, hidden_TD, routing = _per_row_layer(
        96, 60, scheme, torch.float16, generator
    )
    tiles = GemvTiles(
        block_n=16, block_k=32, words=True, paired=True, tma=True, loop_stages=2
    )
    _, prepared = check_w4a16(
        weights, config, hidden_TD, routing, path="gemv", gemv_tiles=tiles
    )
    assert launch_gemv.tma_fit(prepared.w13, tiles)
    assert not int4_words_fit(prepared.w2)


def test_paired_gemv_with_groups_of_an_odd_word_count(
    generator: torch.Generator,
) -> None:
    """w13 rows of 5 words as one group (D = 40, per-row scales; w2 rows of 6): the
    paired GEMV pairs words 0-1 with 2-3 and word 4 with a masked one (``HALF`` = 2),
    and matches the oracle."""
    scheme = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=-1)
    weights, config, hidden_TD, routing = _per_row_layer(
        40, 48, scheme, torch.bfloat16, generator
    )
    check_w4a16(
        weights, config, hidden_TD, routing, path="gemv", gemv_tiles=PAIRED_GEMV
    )


def test_words_gemv_falls_back_to_bytes_where_words_do_not_fit(
    generator: torch.Generator,
) -> None:
    """D = 100 (rows of 50 bytes, not whole words): the byte kernel runs instead."""
    config = MoEConfig(num_experts=E, top_k=2, hidden_size=100, intermediate_size=F)
    scheme = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=-1)
    w13 = torch.randn(E, 2 * F, 100, generator=generator) * 0.2
    w2 = torch.randn(E, 100, F, generator=generator) * 0.2
    weights = quantize_expert_weights(w13, w2, scheme, scale_dtype=torch.bfloat16)
    hidden_TD = torch.randn(2, 100, generator=generator).to(torch.bfloat16)
    routing = route_topk(torch.randn(2, E, generator=generator), config)
    _, prepared = check_w4a16(
        weights, config, hidden_TD, routing, path="gemv", gemv_tiles=WORDS_GEMV
    )
    assert not int4_words_fit(prepared.w13)
    assert int4_words_fit(prepared.w2)


@pytest.mark.parametrize(
    "split", [None, 2, 3], ids=["rule-split", "w2-split-2", "w2-split-3"]
)
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0].name}-{c[1]}-{c[2]}")
def test_gemv_on_16_bit_weights_matches_oracle_and_gemm(
    case: PathCase, split: int | None, generator: torch.Generator
) -> None:
    """triton-emulation's decode GEMV (``_moe_gemv16_kernel``), a pair held elsewhere."""
    scheme, _, dtype, _, _ = case
    config = path_config(case)
    weights = weights_for(scheme, dtype, generator)
    with pytest.warns(EmulationMemoryWarning):
        prepared = TritonEmulationBackend().prepare(weights, config, dtype=dtype)
    w13, w2 = prepared.w13, prepared.w2
    hidden_TD = torch.randn(2, D, generator=generator).to(dtype)
    routing = route_topk(torch.randn(2, E, generator=generator), config)
    ids = routing.topk_ids.clone()
    ids[1, 0] = -1
    routing = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    tiles = None if split is None else GemvTiles(block_n=16, block_k=32, w2_split=split)
    out = fused_moe(hidden_TD, w13, w2, routing, config, path="gemv", gemv_tiles=tiles)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert out.dtype == dtype
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[dtype]
    gemm = fused_moe(hidden_TD, w13, w2, routing, config, path="gemm")
    tol = KERNEL_VS_ORACLE[dtype]
    torch.testing.assert_close(out, gemm, rtol=tol["rtol"], atol=tol["atol"])


def test_emulation_takes_the_gemv_at_decode() -> None:
    dense = ExpertMatrix(data=torch.zeros(E, 2 * F, D, dtype=torch.bfloat16))
    assert use_gemv(E // 2, dense)
    assert not use_gemv(E // 2 + 1, dense)


@pytest.mark.parametrize(
    "tiles",
    [None, GemvTiles(block_n=16, block_k=64, words=True),
     GemvTiles(block_n=16, block_k=64, words=True, paired=True)],
    ids=["bytes", "words", "paired"],
)  # fmt: skip
def test_gemv_weights_the_input_once_with_router_weights_other_than_one(
    tiles: GemvTiles | None, generator: torch.Generator
) -> None:
    """``apply_router_weight_on_input`` on the gemv path with router weights != 1 (the
    GEMV cases route top-1 renormalized, whose weights are all 1): the w13 GEMV weights
    its rows, the w2 GEMV and the top-k sum must not weight again."""
    config = attrs.evolve(tiny_config(top_k=1, on_input=True), renormalize=False)
    weights = weights_for(SCHEMES[1], torch.bfloat16, generator)
    hidden_TD = torch.randn(3, D, generator=generator).to(torch.bfloat16)
    routing = route_topk(torch.randn(3, E, generator=generator), config)
    assert bool((routing.topk_weights < 0.9).all())
    check_w4a16(weights, config, hidden_TD, routing, path="gemv", gemv_tiles=tiles)


@pytest.mark.parametrize(
    "tiles",
    [
        GemvTiles(block_n=16, block_k=64, words=True, paired=True),
        GemvTiles(block_n=16, block_k=64, words=True, paired=True, prefetch=True),
    ],
    ids=["paired", "paired-prefetch"],
)
def test_paired_gemv_tiles_on_groups_of_one_word(
    tiles: GemvTiles, generator: torch.Generator
) -> None:
    """w2 of intermediate size 8 in one group (group_size -1): a group of one int32
    word, which paired tiles must run on the one-word kernel."""
    d, f = 96, 8
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=-1)
    config = MoEConfig(num_experts=E, top_k=2, hidden_size=d, intermediate_size=f)
    weights = quantize_expert_weights(
        torch.randn(E, 2 * f, d, generator=generator) * 0.2,
        torch.randn(E, d, f, generator=generator) * 0.2,
        scheme,
        scale_dtype=torch.float16,
    )
    hidden_TD = torch.randn(3, d, generator=generator).to(torch.float16)
    routing = route_topk(torch.randn(3, E, generator=generator), config)
    check_w4a16(weights, config, hidden_TD, routing, path="gemv", gemv_tiles=tiles)


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("true", True), ("TRUE", True), ("on", True), ("Yes", True),
     ("y", True), ("0", False), ("false", False), ("off", False), ("no", False),
     ("2", False), ("", False), (" 1", False), ("1 ", False)],
)  # fmt: skip
def test_the_interpreter_is_read_from_the_environment_as_triton_reads_it(
    value: str, on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TRITON_INTERPRET=true`` turns Triton's interpreter on (its knobs read these
    values so, Triton 3.7): the launch code must take it as on too, else it hands
    the interpreter bf16 operands."""
    monkeypatch.setenv("TRITON_INTERPRET", value)
    launch.is_interpreting.cache_clear()
    try:
        assert launch.is_interpreting() is on
    finally:
        monkeypatch.undo()
        launch.is_interpreting.cache_clear()
