"""triton-w4a16's GEMM paths (operand variants: swapped operands, nibble halves,
int32 words, grouped row blocks, w13's K split; the dequant prefill path) in
Triton's CPU interpreter on tiny shapes, each against the oracle (and the dequant
path against the gemm path); the tile checks, strided weights and 16-bit weights.

int4 weights match the float32 oracle up to one-ulp output flips here
(``INTERPRETER_INT4_*``); 16-bit weights keep the kernel tolerances.
"""

from types import SimpleNamespace
from typing import cast

import attrs
import pytest
import torch

import backends.triton._configs as configs
import backends.triton._configs_mma as mma_configs
import backends.triton._launch as launch
from backends.triton import (
    EmulationMemoryWarning,
    TritonEmulationBackend,
    TritonW4A16Backend,
    TritonW4A16Prepared,
)
from backends.triton._fused import Path, _dequant_scratch, fused_moe
from backends.triton._launch import ExpertMatrix, ptx_target
from backends.triton._launch_dequant import dequantize_experts
from backends.triton._tiles import GemmTiles, MoETiles
from core.config import MoEConfig
from core.errors import DTypeError
from core.quantize import dequantize_expert, quantize_expert_weights
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
    run_path,
    tiny_config,
    weights_for,
)
from tests.backends.weight_views import strided, strided_weights
from tests.tolerances import INTERPRETER_INT4_REL_L2, REL_L2_VS_ORACLE, rel_l2

pytestmark = INTERPRETER_ONLY


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
        block_m=16,
        w13=mma_configs.MMA_TILES,
        w2=attrs.evolve(mma_configs.MMA_TILES, split_k=2),
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
        w13=attrs.evolve(mma_configs.MMA_TILES, split_k=2),
        w2=attrs.evolve(mma_configs.MMA_TILES, split_k=2),
    ),
    # Hopper's warpgroup tiles (ring forms, 16- and 32-row blocks): off CUDA the
    # Triton word kernel runs them too
    "wgmma-fallback-decode-16-rows": mma_configs.wgmma_decode_tiles(
        split=2, large=False
    ),
    "wgmma-fallback-decode-32-rows": mma_configs.wgmma_decode_tiles(
        split=2, large=True
    ),
    # programmatic dependent launch: plain launches where the GPU lacks it
    "mma-fallback-w13-split-2-pdl-ignored-off-sm90": MoETiles(
        block_m=16,
        w13=attrs.evolve(mma_configs.MMA_TILES, split_k=2),
        w2=attrs.evolve(mma_configs.MMA_TILES, split_k=2),
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
    tiles = MoETiles(block_m=8, w13=mma_configs.MMA_TILES, w2=mma_configs.MMA_TILES)
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
    assert not ptx_target(torch.empty(1))
    assert not ptx_target(torch.empty(1, device="meta"))


@pytest.mark.parametrize("hip", [None, "6.2"])
def test_inline_ptx_pdl_and_tma_are_for_nvidia_only(
    hip: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ROCm's GPUs are torch's ``cuda`` devices too: no PTX, PDL or TMA there."""
    monkeypatch.setattr(launch, "is_interpreting", lambda: False)  # cached: not the env
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(launch, "_capability", lambda _: 9)
    on_gpu = cast("torch.Tensor", SimpleNamespace(device=torch.device("cuda", 0)))
    nvidia = hip is None
    assert ptx_target(on_gpu) == nvidia
    assert launch.pdl_target(on_gpu) == nvidia
    assert launch.tma_target(on_gpu) == nvidia


@pytest.mark.parametrize("path", ["gemm", "gemv"])
def test_swigluoai_clamps_gate_and_up_past_the_limit(
    path: Path, generator: torch.Generator
) -> None:
    """Inputs large enough that gate > limit and up < -limit on routed pairs: the
    default cases stay inside +-7, so neither clamp of ``_activate`` is exercised."""
    config = tiny_config("swigluoai")
    weights = weights_for(SCHEMES[0], torch.bfloat16, generator)
    hidden_TD = (torch.randn(3, D, generator=generator) * 6).to(torch.bfloat16)
    routing = route_topk(torch.randn(3, E, generator=generator), config)
    gates, ups = [], []
    for t, expert in enumerate(routing.topk_ids.tolist()):
        for e in expert:
            w13, _ = dequantize_expert(weights, e, dtype=torch.float32)
            h = w13 @ hidden_TD[t].float()
            gates.append(h[:F])
            ups.append(h[F:])
    limit = config.swiglu_limit
    assert bool((torch.cat(gates) > limit).any())
    assert bool((torch.cat(ups) < -limit).any())
    assert bool((torch.cat(ups) > limit).any())
    check_w4a16(weights, config, hidden_TD, routing, path=path)


def _random_prepared(
    e: int, d: int, f: int, scheme: Int4Scheme, generator: torch.Generator
) -> tuple[QuantizedExpertWeights, TritonW4A16Prepared]:
    """``e`` random experts quantized (float32 scales) and prepared for triton-w4a16."""
    weights = quantize_expert_weights(
        torch.randn(e, 2 * f, d, generator=generator),
        torch.randn(e, d, f, generator=generator),
        scheme,
        scale_dtype=torch.float32,
    )
    config = MoEConfig(num_experts=e, top_k=1, hidden_size=d, intermediate_size=f)
    return weights, TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)


@pytest.mark.parametrize("group", [32, 256, -1])
@pytest.mark.parametrize("mapping", list(Int4Mapping), ids=lambda m: m.name)
def test_dequant_kernel_on_groups_wider_than_its_column_tile(
    group: int, mapping: Int4Mapping, generator: torch.Generator
) -> None:
    """The dequant path's kernel on K = 512: a group of 256 spans two 128-column tiles,
    each of which must read its own group's scales (the interpreter cases have groups
    of 32 and whole rows of <= 128 only). Bit-exact against core's float32 dequant."""
    scheme = Int4Scheme(mapping=mapping, group_size=group)
    weights, prepared = _random_prepared(1, 512, 256, scheme, generator)
    expected = dequantize_expert(weights, 0, dtype=torch.float32)
    for b, want in zip((prepared.w13, prepared.w2), expected, strict=True):
        out = torch.empty(1, *want.shape)
        dequantize_experts(b, 0, 1, out)
        torch.testing.assert_close(out[0], want, rtol=0.0, atol=0.0)


@pytest.mark.parametrize(
    ("block_r", "block_k"), [(16, 64), (128, 256), (32, 512), (8, 1024)]
)
@pytest.mark.parametrize("group", [32, 128, -1])
@pytest.mark.parametrize("words", [False, True], ids=["bytes", "words"])
def test_dequant_kernel_tiles_of_several_groups_and_tails(
    words: bool, group: int, block_r: int, block_k: int, generator: torch.Generator
) -> None:
    """The dequant kernel's tiles as the GPU takes them: up to 32 scale groups a tile
    (group 32 in 1024 columns), a column tile wider than the row (w2's K = 224 or 256
    in 512 or 1024), rows not a multiple of the tile (3 x 448 w13 rows in 128-row
    tiles) and a chunk that starts past expert 0; read as bytes and as int32 words.
    Bit-exact against core's float32 dequant."""
    scheme = Int4Scheme(mapping=Int4Mapping.ASYMMETRIC, group_size=group)
    f = 256 if group == 128 else 224
    weights, prepared = _random_prepared(4, 384, f, scheme, generator)
    for index, b in enumerate((prepared.w13, prepared.w2)):
        out = torch.full((3, *b.data.shape[1:2], 2 * b.data.shape[2]), float("nan"))
        assert b.words_fit
        dequantize_experts(b, 1, 4, out, block_r=block_r, block_k=block_k, words=words)
        for e in range(1, 4):
            want = dequantize_expert(weights, e, dtype=torch.float32)[index]
            torch.testing.assert_close(out[e - 1], want, rtol=0.0, atol=0.0)


def test_dequant_kernel_reads_words_only_where_they_fit(
    generator: torch.Generator,
) -> None:
    """A w2 of K = 100 (50 bytes a row, not whole int32 words): ``words=True`` is
    refused by name; by default it reads bytes, bit-exact."""
    scheme = Int4Scheme(mapping=Int4Mapping.SYMMETRIC, group_size=-1)
    weights, prepared = _random_prepared(1, 256, 100, scheme, generator)
    w2 = prepared.w2
    assert not w2.words_fit
    out = torch.empty(1, 256, 100)
    with pytest.raises(ValueError, match="words=True needs int4 data readable as"):
        dequantize_experts(w2, 0, 1, out, words=True)
    dequantize_experts(w2, 0, 1, out)
    want = dequantize_expert(weights, 0, dtype=torch.float32)[1]
    torch.testing.assert_close(out[0], want, rtol=0.0, atol=0.0)


def test_dequant_scratch_stays_within_its_byte_bound(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DEQUANT_SCRATCH_BYTES`` bounds the 16-bit scratch in bytes: room for two
    experts' larger matrix gives chunks of two experts, and no more bytes."""
    weights = weights_for(SCHEMES[0], torch.bfloat16, generator)
    prepared = TritonW4A16Backend().prepare(
        weights, tiny_config(), dtype=torch.bfloat16
    )
    per_expert = 2 * max(prepared.w13.data[0].numel(), prepared.w2.data[0].numel())
    bound = 2 * per_expert * 2 + 100  # two experts of 16-bit values, in bytes
    monkeypatch.setattr(configs, "DEQUANT_SCRATCH_BYTES", bound)
    scratch, step = _dequant_scratch(
        prepared.w13, prepared.w2, torch.bfloat16, torch.device("cpu")
    )
    assert step == 2
    assert scratch.numel() * scratch.element_size() <= bound
