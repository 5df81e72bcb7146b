"""The int4 grouped GEMM's operand variants on a CUDA GPU (marker ``cuda``).

The tile table takes swapped operands with nibble halves for int4; the other
combinations (and the int32-word dequantization with its inline PTX) stay reachable
through ``tiles`` and are checked here against the oracle, with the bf16 and fp16 bit-pattern codes, zero points and group sizes below,
equal to and above the half-chunk. Shape legend as in test_triton_cuda.py.
"""

from typing import Any

import attrs
import pytest
import torch

import backends.triton._launch as launch
from backends.triton import TritonW4A16Backend
from backends.triton._configs_mma import wgmma_decode_tiles, wgmma_tiles
from backends.triton._fused import fused_moe
from backends.triton._launch import mma_target, wgmma_target
from backends.triton._tiles import GemmTiles, MoETiles
from core.config import MoEConfig
from core.reference import moe_forward_reference
from core.scheme import Int4Scheme
from tests.backends.triton_cuda_cases import (
    SCHEMES,
    assert_same_outputs,
    check_fused,
    gpu_routing,
    int4_weights,
)
from tests.tolerances import rel_l2

pytestmark = pytest.mark.cuda


def _tiles(
    block_m: int,
    block_n: int,
    block_k: int,
    *,
    swap: bool,
    halves: bool,
    split: int,
    words: bool = False,
    mma: bool = False,
) -> MoETiles:
    t = GemmTiles(
        block_n=block_n, block_k=block_k, num_warps=4, num_stages=3, swap_ab=swap,
        nibble_halves=halves, int4_words=words, mma=mma,
    )  # fmt: skip
    return MoETiles(block_m=block_m, w13=t, w2=attrs.evolve(t, split_k=split))


MMA_RING = GemmTiles(
    block_n=128, block_k=128, num_warps=4, num_stages=3, swap_ab=True,
    int4_words=True, mma=True,
)  # fmt: skip

WGMMA = GemmTiles(
    block_n=128, block_k=128, num_warps=8, num_stages=1, swap_ab=True,
    int4_words=True, mma=True, wgmma=True,
)  # fmt: skip

NARROW_SHARED = GemmTiles(
    block_n=64, block_k=128, num_warps=4, num_stages=2, swap_ab=True,
    int4_words=True, mma=True, copy_steps=4, x_shared=True, split_k=2,
)  # fmt: skip

VARIANTS = {
    "plain-16x32x256": _tiles(16, 32, 256, swap=False, halves=False, split=2),
    "swap-64x128x64": _tiles(64, 128, 64, swap=True, halves=False, split=1),
    "halves-64x128x128": _tiles(64, 128, 128, swap=False, halves=True, split=1),
    "halves-swap-16x64x128-split2": _tiles(
        16, 64, 128, swap=True, halves=True, split=2
    ),
    "halves-swap-64x128x64": _tiles(64, 128, 64, swap=True, halves=True, split=1),
    "halves-swap-32x64x256": _tiles(32, 64, 256, swap=True, halves=True, split=1),
    "words-swap-16x64x128-split2": _tiles(
        16, 64, 128, swap=True, halves=False, split=2, words=True
    ),
    "words-swap-64x128x64": _tiles(
        64, 128, 64, swap=True, halves=False, split=1, words=True
    ),
    "words-swap-32x64x128": _tiles(
        32, 64, 128, swap=True, halves=False, split=1, words=True
    ),
    "mma-16x64x128-split2": _tiles(
        16, 64, 128, swap=True, halves=False, split=2, words=True, mma=True
    ),
    "mma-32x128x128": _tiles(
        32, 128, 128, swap=True, halves=False, split=1, words=True, mma=True
    ),
    "mma-8x64x128-split3": _tiles(
        8, 64, 128, swap=True, halves=False, split=3, words=True, mma=True
    ),
    "mma-8x128x128-ring3-split2": attrs.evolve(
        _tiles(8, 128, 128, swap=True, halves=False, split=2, words=True, mma=True),
        w13=attrs.evolve(MMA_RING, split_k=1),
        w2=attrs.evolve(MMA_RING, split_k=2),
    ),
    "mma-8x128x128-registers-split2": MoETiles(
        block_m=8,
        w13=attrs.evolve(MMA_RING, num_stages=1),
        w2=attrs.evolve(MMA_RING, num_stages=1, split_k=2),
    ),
    "mma-8x128x128-ring2-copy2-split3": MoETiles(
        block_m=8,
        w13=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2),
        w2=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, split_k=3),
    ),
    "mma-16x64x128-ring3-copy4-split2": MoETiles(
        block_m=16,
        w13=attrs.evolve(MMA_RING, block_n=64, copy_steps=4),
        w2=attrs.evolve(MMA_RING, block_n=64, copy_steps=4, split_k=2),
    ),
    "mma-8x128x128-ring2-copy2-w13split4-split2": MoETiles(
        block_m=8,
        w13=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, split_k=4),
        w2=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, split_k=2),
    ),
    "mma-xshared-16x128x128-ring2-copy2-split3": MoETiles(
        block_m=16,
        w13=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, x_shared=True),
        w2=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, x_shared=True, split_k=3),
    ),
    "mma-xshared-32x128x128-ring3-split2": MoETiles(
        block_m=32,
        w13=attrs.evolve(MMA_RING, x_shared=True),
        w2=attrs.evolve(MMA_RING, x_shared=True, split_k=2),
    ),
    "mma-xshared-8x64x128-ring2-copy4-w13split2-split2": MoETiles(
        block_m=8, w13=NARROW_SHARED, w2=NARROW_SHARED
    ),
    "mma-xshared-32x64x128-ring2-copy2-split2": MoETiles(
        block_m=32,
        w13=attrs.evolve(NARROW_SHARED, copy_steps=2, split_k=1),
        w2=attrs.evolve(NARROW_SHARED, copy_steps=2),
    ),
    "wgmma-32x128x128-w8-split2": MoETiles(
        block_m=32, w13=WGMMA, w2=attrs.evolve(WGMMA, split_k=2)
    ),
    "wgmma-16x64x128-w4-w13split2-split3": MoETiles(
        block_m=16,
        w13=attrs.evolve(WGMMA, block_n=64, num_warps=4, split_k=2),
        w2=attrs.evolve(WGMMA, block_n=64, num_warps=4, split_k=3),
    ),
    "wgmma-8x64x128-w4": MoETiles(
        block_m=8,
        w13=attrs.evolve(WGMMA, block_n=64, num_warps=4),
        w2=attrs.evolve(WGMMA, block_n=64, num_warps=4),
    ),
    "wgmma-64x64x128-w4": MoETiles(
        block_m=64,
        w13=attrs.evolve(WGMMA, block_n=64, num_warps=4),
        w2=attrs.evolve(WGMMA, block_n=64, num_warps=4),
    ),
    "wgmma-64x128x128-w8-split2": MoETiles(
        block_m=64, w13=WGMMA, w2=attrs.evolve(WGMMA, split_k=2)
    ),
    "wgmma-32x64x128-w4-ring3-split2": MoETiles(
        block_m=32,
        w13=attrs.evolve(WGMMA, block_n=64, num_warps=4, num_stages=3),
        w2=attrs.evolve(WGMMA, block_n=64, num_warps=4, num_stages=3, split_k=2),
    ),
    "wgmma-16x64x128-w4-ring2-copy2-w13split2-split3": MoETiles(
        block_m=16,
        w13=attrs.evolve(
            WGMMA, block_n=64, num_warps=4, num_stages=2, copy_steps=2, split_k=2
        ),
        w2=attrs.evolve(
            WGMMA, block_n=64, num_warps=4, num_stages=2, copy_steps=2, split_k=3
        ),
    ),
    "words-swap-16x64x128-w13split2": attrs.evolve(
        _tiles(16, 64, 128, swap=True, halves=False, split=1, words=True),
        w13=attrs.evolve(
            _tiles(16, 64, 128, swap=True, halves=False, split=1, words=True).w13,
            split_k=2,
        ),
    ),
}
"""``mma``: the Gluon kernel; row blocks of 8, 16 and 32 tokens, splits of 2 and 3.
``_tiles`` asks for 3 stages, so the first four read the words through a three-stage
cp.async ring one step a copy group; the fifth loads them one step ahead in registers
(the table's 8-row form before copy groups); the last two copy 2 steps a group (the
table's 8-row form, here with split 3: w2 splits of 2 steps, the last one partial) and
4 (w2 split 2: 3 steps a split, so a group runs past its split's end); the ring's
look-ahead copies run past every split's end. The last two split w13's K too (4 ways
of the Gluon kernel's 2-step groups over 12 steps, 2 of the Triton word kernel's):
float32 partials that ``launch_activate`` sums and activates. ``xshared``: the input
through the ring too (``GemmTiles.x_shared``), in 8-, 16- and 32-row blocks (the
8-row one and one 32-row one in 64-column tiles), with partial last splits (w2: 704
columns in 3 splits of 2 steps) and a w13 split. ``wgmma``: the warpgroup-MMA kernel
(on Hopper; elsewhere these tiles run the ``mma.sync`` kernel), one 64-row tile a
warpgroup: 32- and 64-row blocks on two warpgroups, 8-, 16- and 64-row blocks on one
(16 with both K splits; 300 tokens give partial 64-row blocks); ``ring``: its words
through the cp.async ring (3 stages of one step; 2 of 2-step groups, with splits whose
groups run past their ends)."""


@pytest.mark.parametrize("tokens", [5, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "scheme", [SCHEMES[0], SCHEMES[6], SCHEMES[4], SCHEMES[9]], ids=lambda s: s.name
)
@pytest.mark.parametrize("tiles", VARIANTS.values(), ids=VARIANTS.keys())
def test_gemm_operand_variants(
    tiles: MoETiles, scheme: Int4Scheme, dtype: torch.dtype, tokens: int
) -> None:
    """F = 704 ends the w2 reduction in a partial chunk of every block_k above;
    groups of 32 and 64 fall below, at and above the half-chunk."""
    config = MoEConfig(num_experts=16, top_k=4, hidden_size=1536, intermediate_size=704)
    check_fused(
        config, scheme, dtype, tokens, seed=3, path="gemm", drop=True, tiles=tiles
    )


MMA = VARIANTS["mma-16x64x128-split2"]
WGMMA_TILES = VARIANTS["wgmma-32x128x128-w8-split2"]


def _spy_gluon_launches(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record each Gluon launch's ``wgmma`` (warpgroup kernel or ``mma.sync``) in order."""
    calls: list[bool] = []
    real = launch._launch_gluon

    def spy(*args: Any, **kwargs: Any) -> None:
        calls.append(kwargs["wgmma"])
        real(*args, **kwargs)

    monkeypatch.setattr(launch, "_launch_gluon", spy)
    return calls


@pytest.mark.parametrize("wait_each", [False, True], ids=["async", "sync"])
def test_wgmma_tiles_run_the_warpgroup_kernel_on_hopper(
    monkeypatch: pytest.MonkeyPatch, wait_each: bool
) -> None:
    """On an H100/H200 the ``wgmma`` cases run the warpgroup kernel, not the
    ``mma.sync`` fallback (a spy on the Gluon launch records which), in both of its
    forms: each MMA waited for (``WGMMA_ASYNC`` off) or overlapped; right either way."""
    hopper = torch.cuda.get_device_capability()[0] == 9
    x = torch.empty(1, device="cuda")
    assert wgmma_target(x) == (hopper and mma_target(x))
    if hopper:
        assert wgmma_target(x), "an sm_90 GPU without the warpgroup kernel"
    calls = _spy_gluon_launches(monkeypatch)
    monkeypatch.setattr(launch, "WGMMA_ASYNC", not wait_each)
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=512, intermediate_size=384)
    check_fused(
        config, SCHEMES[0], torch.bfloat16, 37, seed=8, path="gemm", drop=True,
        tiles=WGMMA_TILES,
    )  # fmt: skip
    assert calls == ([hopper, hopper] if mma_target(x) else [])


@pytest.mark.parametrize(
    "size",
    [(8, 2, 4096, 14336, 36), (256, 8, 7168, 2048, 288), (128, 8, 2048, 768, 1280)],
    ids=["mixtral-T36", "deepseek-v3-T288", "qwen3-30b-T1280"],
)
def test_hopper_table_rows_at_9_and_80_pairs_per_expert(
    monkeypatch: pytest.MonkeyPatch, size: tuple[int, int, int, int, int]
) -> None:
    """The table's warpgroup rows added on 2026-12-06, at model shapes: 9 pairs an
    expert (the 16-row decode form, experts of 2^23 weights or more) and 80 (the
    smaller experts' bound). On an H100/H200 the warpgroup kernel runs both GEMMs (a
    spy), elsewhere the rows they replace; against the oracle, a pair held elsewhere."""
    e, k, d, f, t = size
    hopper = wgmma_target(torch.empty(1, device="cuda"))
    calls = _spy_gluon_launches(monkeypatch)
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    check_fused(config, SCHEMES[2], torch.bfloat16, t, seed=11, path="gemm", drop=True)
    if hopper:
        assert calls == [True, True]
    else:
        assert not any(calls)


@pytest.mark.parametrize("tokens", [1, 37])
@pytest.mark.parametrize(
    "options",
    [
        {"activation": "gelu"},
        {"activation": "gelu_tanh"},
        {"activation": "swigluoai", "expert_bias": True},
        {"apply_router_weight_on_input": True, "top_k": 1, "renormalize": False},
        {"expert_bias": True},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("tiles", [MMA, WGMMA_TILES], ids=["mma", "wgmma"])
def test_mma_options(options: dict[str, object], tokens: int, tiles: MoETiles) -> None:
    """The Gluon kernel's epilogue: activations, biases, router weight on input."""
    base: dict[str, object] = {
        "num_experts": 8, "top_k": 2, "hidden_size": 512, "intermediate_size": 384,
    }  # fmt: skip
    config = MoEConfig(**{**base, **options})  # type: ignore[arg-type]
    check_fused(
        config,
        SCHEMES[2],
        torch.bfloat16,
        tokens,
        seed=5,
        path="gemm",
        drop=True,
        tiles=tiles,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "scheme", [SCHEMES[2], SCHEMES[6], SCHEMES[9]], ids=lambda s: s.name
)
def test_mma_matches_word_kernel(scheme: Int4Scheme, dtype: torch.dtype) -> None:
    """Against the Triton word kernel on the same weights and routing: the outputs
    differ by roundings only (summation order; with groups of >= 128 columns the
    Gluon kernel scales the float32 product instead of the 16-bit codes), and its
    error against the oracle is no larger."""
    config = MoEConfig(num_experts=16, top_k=4, hidden_size=1536, intermediate_size=640)
    generator = torch.Generator().manual_seed(9)
    weights = int4_weights(config, scheme, dtype, generator)
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=dtype)
    hidden_TD = torch.randn(48, config.hidden_size, device="cuda").to(dtype)
    routing = gpu_routing(config, 48)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    words = VARIANTS["words-swap-16x64x128-split2"]
    out = {}
    for name, tiles in (("mma", MMA), ("wgmma", WGMMA_TILES), ("words", words)):
        out[name] = fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, tiles=tiles,
            path="gemm",
        )  # fmt: skip
    err_words = rel_l2(expected, out["words"])
    for name in ("mma", "wgmma"):
        diff = rel_l2(out["words"], out[name])
        err = rel_l2(expected, out[name])
        assert diff < 6e-3, (name, diff, err, err_words)
        assert err <= 1.1 * err_words, (name, err, err_words)


@pytest.mark.parametrize(
    ("stages", "copy_steps", "x_shared", "wgmma"),
    [
        (1, 1, False, False),
        (3, 1, False, False),
        (2, 2, False, False),
        (2, 2, True, False),
        (1, 1, False, True),
        (3, 1, False, True),
        (2, 2, False, True),
    ],
)
@pytest.mark.parametrize("scheme", [SCHEMES[4], SCHEMES[9]], ids=lambda s: s.name)
def test_mma_k_not_a_multiple_of_32(
    scheme: Int4Scheme, stages: int, copy_steps: int, x_shared: bool, wgmma: bool
) -> None:
    """F = 328: w2 rows of 41 words, not whole 16-byte chunks (the kernel's word loads
    narrow), its last step a partial one; with ``x_shared`` w13 (K = 512) takes the
    input through the ring and w2 (K = 328) falls back to registers."""
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=512, intermediate_size=328)
    t = attrs.evolve(
        MMA_RING, num_stages=stages, copy_steps=copy_steps, x_shared=x_shared
    )
    if wgmma:  # one 64-row tile a warpgroup
        t = attrs.evolve(t, block_n=64, wgmma=True)
    tiles = MoETiles(block_m=16, w13=t, w2=attrs.evolve(t, split_k=2))
    check_fused(
        config, scheme, torch.bfloat16, 21, seed=7, path="gemm", drop=True,
        tiles=tiles,
    )  # fmt: skip


PDL_CASES = {
    "8-row-w13-split2-w2-split4": (
        (8, 2, 4096, 14336, 4),
        MoETiles(
            block_m=8,
            w13=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, split_k=2),
            w2=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, split_k=4),
        ),
    ),
    "16-row-xshared-w2-split2": (
        (128, 8, 2048, 768, 64),
        MoETiles(
            block_m=16,
            w13=attrs.evolve(MMA_RING, num_stages=2, copy_steps=2, x_shared=True),
            w2=attrs.evolve(
                MMA_RING, num_stages=2, copy_steps=2, x_shared=True, split_k=2
            ),
        ),
    ),
    "16-row-ring3-many-blocks": (
        (64, 4, 1024, 512, 300),
        MoETiles(block_m=16, w13=MMA_RING, w2=attrs.evolve(MMA_RING, split_k=2)),
    ),
    "wgmma-32-row-w2-split2": (
        (8, 2, 4096, 14336, 64),
        MoETiles(block_m=32, w13=WGMMA, w2=attrs.evolve(WGMMA, split_k=2)),
    ),
    "wgmma-the-table's-mixtral-m64": (  # Hopper's decode row there: the input ring
        (8, 2, 4096, 14336, 64),
        attrs.evolve(wgmma_decode_tiles(split=1, large=True), pdl=False),
    ),
    "wgmma-the-table's-16-row-decode": (  # smaller experts at 16 pairs an expert
        (128, 8, 2048, 768, 256),
        attrs.evolve(wgmma_decode_tiles(split=2, large=False), pdl=False),
    ),
    "wgmma-the-table's-w2-split2": (  # the prefill row's ring, w2 split
        (8, 2, 4096, 14336, 64),
        wgmma_tiles(split=2, pdl=False),
    ),
    "triton-words-w13-split2": (
        (16, 4, 1536, 704, 37),
        VARIANTS["words-swap-16x64x128-w13split2"],
    ),
}
"""``(E, K, D, F, T)`` and tiles: Mixtral's shape at M = 4 (the table's 8-row form with
both splits: alignment, w13, activation, w2, top-k sum), 16-row blocks with the input
through the ring, many row blocks per expert, and the Triton word kernel (launched
plainly between PDL launches)."""


@pytest.mark.parametrize(("size", "tiles"), PDL_CASES.values(), ids=PDL_CASES.keys())
def test_gemm_pdl_matches_serial_launches(
    size: tuple[int, int, int, int, int], tiles: MoETiles
) -> None:
    """``MoETiles.pdl`` lets each kernel of the gemm path after the alignment start
    before the one ahead of it ends: a wait in the wrong place would read a partial
    intermediate. Eager and graph-replayed outputs must equal, bit for bit, those of
    the same tiles launched one after the other, over fresh inputs and routings (the
    first with a pair for an expert held elsewhere)."""
    assert_same_outputs(
        size, SCHEMES[0], attrs.evolve(tiles, pdl=True), tiles, seed=6, forwards=8,
        drop=True,
    )  # fmt: skip
