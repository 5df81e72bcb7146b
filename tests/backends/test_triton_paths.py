"""triton-w4a16's paths (gemv bytes/words/16-bit, gemm operand variants, dequant) in
Triton's CPU interpreter on tiny shapes, each against the oracle and the gemm path.

int4 weights match the float32 oracle up to one-ulp output flips here
(``INTERPRETER_INT4_*``); 16-bit weights keep the kernel tolerances.
"""

import attrs
import pytest
import torch

import backends.triton._configs as configs
import backends.triton._launch as launch
from backends.triton import (
    EmulationMemoryWarning,
    TritonEmulationBackend,
    TritonW4A16Backend,
)
from backends.triton._configs import (
    GemmTiles,
    GemvTiles,
    MoETiles,
)
from backends.triton._fused import Path, fused_moe, use_gemv
from backends.triton._launch import ExpertMatrix, _ptx_target, int4_words_fit
from core.config import MoEConfig
from core.errors import DTypeError
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
from tests.backends.weight_views import strided, strided_weights
from tests.tolerances import (
    INTERPRETER_INT4_REL_L2,
    KERNEL_VS_ORACLE,
    REL_L2_VS_ORACLE,
    rel_l2,
)

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


@pytest.mark.parametrize("case", GEMV_CASES[:4], ids=lambda c: c[0].name)
def test_tma_reads_equal_plain_loads(
    case: PathCase, generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The paired GEMV's TMA reads (``GemvTiles.tma``; the interpreter emulates the
    descriptor) give the plain loads' output bit for bit: the same words meet the
    same inputs, whatever the groups (g32 over 64-column steps, the whole row), the
    zero points and the K tail. Both w13 and w2 go through a descriptor."""
    built: list[tuple[int, ...]] = []
    real = launch._words_descriptor

    def spy(words: torch.Tensor, tiles: GemvTiles) -> object:
        built.append(tuple(words.shape))
        return real(words, tiles)

    monkeypatch.setattr(launch, "_words_descriptor", spy)
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
    assert launch.tma_fit(prepared.w13, tiles)
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


def _gemm_tiles(
    w13_k: int = 64,
    w2_k: int = 32,
    *,
    swap: bool = False,
    halves: bool = False,
    group_m: int = 0,
    words: bool = False,
) -> MoETiles:
    w13 = GemmTiles(
        block_n=32, block_k=w13_k, swap_ab=swap, nibble_halves=halves,
        group_m=group_m, int4_words=words,
    )  # fmt: skip
    w2 = attrs.evolve(w13, block_k=w2_k, split_k=2)
    return MoETiles(block_m=16, w13=w13, w2=w2)


GEMM_VARIANTS = {
    "swap": _gemm_tiles(swap=True),
    "halves": _gemm_tiles(halves=True),
    "halves-swap": _gemm_tiles(swap=True, halves=True),
    # w2 K = 64 in one chunk: two scale groups of 32 per half
    "halves-w2-chunk-64": _gemm_tiles(32, 64, halves=True),
    # 3 row blocks per group over 4 (w13) / 3 (w2) column tiles: a partial last group
    "group-3": _gemm_tiles(group_m=3),
    "group-1-halves-swap": _gemm_tiles(swap=True, halves=True, group_m=1),
    # int32 words: w13 K = 96 in steps of 64 (a masked tail; 2 groups of 32 per step)
    "words-swap": _gemm_tiles(swap=True, words=True),
    "words-swap-w2-chunk-64": _gemm_tiles(32, 64, swap=True, words=True),
    # the Gluon kernel's tiles: off CUDA the Triton word kernel runs them
    "mma-fallback": MoETiles(
        block_m=16, w13=configs.MMA_TILES, w2=attrs.evolve(configs.MMA_TILES, split_k=2)
    ),
    # w13's K split: float32 partials, summed and activated by launch_activate
    "w13-split-2-words-swap": MoETiles(
        block_m=16,
        w13=GemmTiles(block_n=32, block_k=32, swap_ab=True, int4_words=True, split_k=2),
        w2=GemmTiles(block_n=32, block_k=32, swap_ab=True, int4_words=True),
    ),
    # K = 96 in steps of 32 split 4 ways: the last split has no step; halves on w13
    "w13-split-4-halves": MoETiles(
        block_m=16,
        w13=GemmTiles(block_n=32, block_k=32, nibble_halves=True, split_k=4),
        w2=GemmTiles(block_n=32, block_k=32, split_k=2),
    ),
    "mma-fallback-w13-split-2": MoETiles(
        block_m=16,
        w13=attrs.evolve(configs.MMA_TILES, split_k=2),
        w2=attrs.evolve(configs.MMA_TILES, split_k=2),
    ),
    # programmatic dependent launch: plain launches where the GPU lacks it
    "mma-fallback-w13-split-2-pdl-ignored-off-sm90": MoETiles(
        block_m=16,
        w13=attrs.evolve(configs.MMA_TILES, split_k=2),
        w2=attrs.evolve(configs.MMA_TILES, split_k=2),
        pdl=True,
    ),
}


@pytest.mark.parametrize("tiles", GEMM_VARIANTS.values(), ids=GEMM_VARIANTS.keys())
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0].name}-{c[1]}-{c[2]}")
def test_gemm_operand_variants_match_oracle(
    tiles: MoETiles, case: PathCase, generator: torch.Generator
) -> None:
    """Swapped operands, nibble halves (K-permuted inputs, D = 96 a partial chunk) and
    int32 words (shift-and-convert dequantization; the inline PTX runs on the GPU)."""
    run_path("gemm", case, 5, generator, tiles=tiles)


def test_mma_tiles_with_8_row_blocks_need_the_gluon_kernel(
    generator: torch.Generator,
) -> None:
    """The Triton kernels cannot take 8-row blocks: off CUDA that is an error, not a
    Triton compile failure."""
    tiles = MoETiles(block_m=8, w13=configs.MMA_TILES, w2=configs.MMA_TILES)
    case: PathCase = (SCHEMES[0], "silu", torch.bfloat16, 2, False)
    with pytest.raises(ValueError, match=r"GemmTiles.mma with 8-row blocks .* cpu"):
        run_path("gemm", case, 5, generator, tiles=tiles)


def _emulation_layer_matches_oracle(
    tiles: MoETiles,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    generator: torch.Generator,
    *,
    drop: bool,
) -> None:
    """triton-emulation's GEMM with ``tiles`` on the tiny layer, five tokens (with
    ``drop``, token 2's first choice held elsewhere), against the oracle."""
    config = tiny_config()
    weights = weights_for(scheme, dtype, generator)
    with pytest.warns(EmulationMemoryWarning):
        prepared = TritonEmulationBackend().prepare(weights, config, dtype=dtype)
    hidden_TD = torch.randn(5, D, generator=generator).to(dtype)
    routing = route_topk(torch.randn(5, E, generator=generator), config)
    if drop:
        ids = routing.topk_ids.clone()
        ids[2, 0] = -1
        routing = Routing(topk_weights=routing.topk_weights, topk_ids=ids)
    w13, w2 = prepared.w13, prepared.w2
    out = fused_moe(hidden_TD, w13, w2, routing, config, tiles=tiles)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[dtype]


def test_nibble_halves_leave_16_bit_weights_alone(generator: torch.Generator) -> None:
    """16-bit weights read unpermuted inputs whatever the tiles ask for."""
    tiles = _gemm_tiles(swap=True, halves=True)
    _emulation_layer_matches_oracle(
        tiles, SCHEMES[0], torch.bfloat16, generator, drop=False
    )


@pytest.mark.parametrize(
    "chunked", [False, True], ids=["one-chunk", "chunk-per-expert"]
)
@pytest.mark.parametrize(
    "case",
    [GEMV_CASES[0], GEMV_CASES[1], GEMV_CASES[3], GEMV_CASES[4]],
    ids=lambda c: f"{c[0].name}-{c[1]}-{c[2]}",
)
def test_dequant_prefill_path_matches_oracle_and_gemm(
    case: PathCase,
    chunked: bool,
    generator: torch.Generator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if chunked:  # a scratch of one byte still holds one expert: E chunks
        monkeypatch.setattr(configs, "DEQUANT_SCRATCH_BYTES", 1)
    assert_matches_gemm(*run_path("dequant", case, 5, generator))


def test_dequant_path_with_a_w13_split(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiles that split w13's K also work chunk by chunk on the dequant path: each
    chunk's activation reads and writes only the pairs of its own experts."""
    monkeypatch.setattr(configs, "DEQUANT_SCRATCH_BYTES", 1)  # one expert a chunk
    tiles = GEMM_VARIANTS["w13-split-2-words-swap"]
    case: PathCase = (SCHEMES[1], "gelu", torch.float16, 2, False)
    run_path("dequant", case, 5, generator, tiles=tiles)


def test_dequant_path_refuses_16_bitweights_for(generator: torch.Generator) -> None:
    dense = ExpertMatrix(data=torch.zeros(E, 2 * F, D, dtype=torch.bfloat16))
    routing = route_topk(torch.randn(1, E, generator=generator), tiny_config())
    with pytest.raises(DTypeError, match="dequant path needs int4"):
        fused_moe(
            torch.zeros(1, D, dtype=torch.bfloat16),
            dense,
            dense,
            routing,
            tiny_config(),
            path="dequant",
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


@pytest.mark.parametrize("path", ["gemv", "gemm", "dequant"])
def test_strided_weights_are_copied_contiguous_at_prepare(
    path: Path, generator: torch.Generator
) -> None:
    """``from_quantized`` takes strided views as they are; the kernels read rows."""
    weights = weights_for(SCHEMES[1], torch.bfloat16, generator)  # zero points too
    assert weights.w13_zero_point is not None
    strided = strided_weights(weights)
    assert not strided.w13_qdata.is_contiguous()
    config = tiny_config()
    prepared = TritonW4A16Backend().prepare(strided, config, dtype=torch.bfloat16)
    for b in (prepared.w13, prepared.w2):
        assert b.data.is_contiguous()
        assert b.scale is not None
        assert b.scale.is_contiguous()
    hidden_TD = torch.randn(3, D, generator=generator).to(torch.bfloat16)
    routing = route_topk(torch.randn(3, E, generator=generator), config)
    out = fused_moe(hidden_TD, prepared.w13, prepared.w2, routing, config, path=path)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert rel_l2(expected, out) < INTERPRETER_INT4_REL_L2[torch.bfloat16]


def test_expert_matrix_refuses_strided_rows() -> None:
    data = torch.zeros(2, 8, 4, dtype=torch.uint8)
    scale = torch.ones(2, 8, 2)
    with pytest.raises(ValueError, match=r"ExpertMatrix\.data needs a contiguous"):
        ExpertMatrix(data=strided(torch.zeros(2, 4, 8, dtype=torch.uint8)))
    with pytest.raises(ValueError, match=r"ExpertMatrix\.scale needs a contiguous"):
        ExpertMatrix(data=data, scale=strided(torch.ones(2, 2, 8)), group_size=4)
    with pytest.raises(ValueError, match=r"zero_point needs the scale's strides"):
        ExpertMatrix(
            data=data,
            scale=scale,
            zero_point=torch.zeros(2, 16, 2, dtype=torch.uint8)[:, ::2],
            group_size=4,
        )
    one_group = torch.ones(2, 8, 1).expand(2, 8, 1)  # size-1 last dimension: any stride
    assert ExpertMatrix(data=data, scale=one_group, group_size=8).scale is one_group


@pytest.mark.parametrize(
    "tiles",
    [None, GEMM_VARIANTS["halves-swap"], GEMM_VARIANTS["words-swap"]],
    ids=["interpreter", "halves-swap", "words-swap"],
)
def test_group_per_row_with_k_below_block_k(
    tiles: MoETiles | None, generator: torch.Generator
) -> None:
    """Group -1 with K = 48 (w13) and 24 (w2), both below BLOCK_K and not powers of 2."""
    d, f = 48, 24
    config = MoEConfig(num_experts=E, top_k=2, hidden_size=d, intermediate_size=f)
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=-1)
    w13 = torch.randn(E, 2 * f, d, generator=generator) * 0.2
    w2 = torch.randn(E, d, f, generator=generator) * 0.2
    weights = quantize_expert_weights(w13, w2, scheme, scale_dtype=torch.bfloat16)
    hidden_TD = torch.randn(5, d, generator=generator).to(torch.bfloat16)
    routing = route_topk(torch.randn(5, E, generator=generator), config)
    check_w4a16(weights, config, hidden_TD, routing, path="gemm", tiles=tiles)


def test_w13_split_refuses_w2_nibble_halves() -> None:
    """The activation of a K-split w13 writes w2's input unpermuted."""
    with pytest.raises(ValueError, match=r"w2\.nibble_halves needs w13\.split_k == 1"):
        MoETiles(
            block_m=16,
            w13=GemmTiles(block_n=32, block_k=64, split_k=2),
            w2=GemmTiles(block_n=32, block_k=32, nibble_halves=True),
        )
    tiles = MoETiles(  # w2 halves with an unsplit w13, or a split w13 alone, are fine
        block_m=16,
        w13=GemmTiles(block_n=32, block_k=64, nibble_halves=True, split_k=2),
        w2=GemmTiles(block_n=32, block_k=32),
    )
    assert tiles.w13.split_k == 2


@pytest.mark.parametrize(
    ("shape", "dtype", "perm_out", "match"),
    [
        ((2, 5, 48), torch.float32, 32, r"unpermuted, got perm_out=32"),
        (
            (3, 5, 48),
            torch.float32,
            0,
            r"\(2, N, 48\) partials, got shape \(3, 5, 48\)",
        ),
        ((2, 5, 24), torch.float32, 0, r"got shape \(2, 5, 24\)"),
        ((5, 48), torch.float32, 0, r"got shape \(5, 48\)"),
        ((2, 5, 48), torch.bfloat16, 0, r"float32 partials, got torch.bfloat16"),
    ],
)
def test_w13_split_checks_its_partials(
    shape: tuple[int, ...], dtype: torch.dtype, perm_out: int, match: str
) -> None:
    """A K-split w13 writes float32 (split, pairs, 2F) partials in plain K order."""
    with pytest.raises(ValueError, match=match):
        launch._check_split_rows(torch.empty(shape, dtype=dtype), 2, 24, perm_out)


def test_w13_split_on_16_bit_weights(generator: torch.Generator) -> None:
    """triton-emulation's GEMM with w13's K split (and a pair held elsewhere)."""
    tiles = GEMM_VARIANTS["w13-split-2-words-swap"]
    _emulation_layer_matches_oracle(
        tiles, SCHEMES[1], torch.float16, generator, drop=True
    )


def test_inline_ptx_is_for_cuda_tensors_only() -> None:
    """Intel's Triton (XPU) and the interpreter get the same bits from plain Triton ops."""
    assert not _ptx_target(torch.empty(1))
    assert not _ptx_target(torch.empty(1, device="meta"))
