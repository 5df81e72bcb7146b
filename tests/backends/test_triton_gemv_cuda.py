"""The int4 decode path on a CUDA GPU (marker ``cuda``): the byte kernel
(``_moe_gemv_kernel``) and the int32-word kernel (``_moe_gemv_words_kernel``).

Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts, ``K`` top_k.
"""

import attrs
import pytest
import torch

import backends.triton._configs as configs
from backends.triton import TritonW4A16Backend
from backends.triton._fused import fused_moe, mma_runs, use_gemv
from backends.triton._tiles import GemvTiles
from core.config import Activation, MoEConfig
from core.scheme import Int4Scheme
from tests.backends.triton_cuda_cases import (
    SCHEMES,
    assert_same_outputs,
    check_fused,
    check_graph_replays,
    gpu_routing,
    int4_weights,
)

pytestmark = pytest.mark.cuda


def _float16(tiles: GemvTiles) -> GemvTiles:
    """``tiles`` (and their w2 tiles) with float16 chains instead of integer products."""
    w2 = tiles.w2_tiles
    return attrs.evolve(
        tiles, int_dot=False, w2_tiles=None if w2 is None else _float16(w2)
    )


KERNELS = {
    "bytes": GemvTiles(block_n=16, block_k=512),
    "words": GemvTiles(block_n=8, block_k=512, num_warps=1, words=True),
    "paired": GemvTiles(block_n=16, block_k=512, num_warps=1, words=True, paired=True),
    "pdl": GemvTiles(
        block_n=8,
        block_k=512,
        num_warps=1,
        words=True,
        paired=True,
        prefetch=True,
        pdl=True,
    ),
    "bulk": _float16(configs.GEMV_PAIRED),
    "intdot": configs.GEMV_PAIRED,
    "intdot_few": configs.GEMV_PAIRED_FEW,
    "intdot_at_step": attrs.evolve(
        configs.GEMV_PAIRED,
        inputs_ahead=False,
        w2_tiles=attrs.evolve(
            configs.GEMV_PAIRED.w2_tiles or configs.GEMV_PAIRED, inputs_ahead=False
        ),
    ),
}
"""Each kernel with fixed tiles, whatever the table picks (words: the one-word kernel
at the tile of the table before the paired one; paired: ``GEMV_PAIRED`` before TMA
reads; pdl: ``GEMV_PAIRED_FEW`` in float16 chains, with programmatic dependent
launch; bulk: ``GEMV_PAIRED`` in float16 chains, TMA (bulk tensor copy) reads, w2 on
its own tiles, inputs a step ahead as the table's; intdot and intdot_few: ``GEMV_PAIRED`` and ``GEMV_PAIRED_FEW`` as the
table has them, products in integers, ``GemvTiles.int_dot``, the first with its
scales, zero points and inputs a step ahead, ``GemvTiles.inputs_ahead``;
intdot_at_step: ``GEMV_PAIRED`` with those loads at their step, as before). The keys are
``-k`` selectors of bench/gpu_session.sh's jobs."""


def _check(
    config: MoEConfig,
    scheme: Int4Scheme,
    dtype: torch.dtype,
    tokens: int,
    *,
    kernel: str,
    drop: bool = False,
) -> None:
    check_fused(
        config, scheme, dtype, tokens, seed=tokens + 11, path="gemv", drop=drop,
        gemv_tiles=KERNELS[kernel],
    )  # fmt: skip


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
def test_gemv_schemes(scheme: Int4Scheme, dtype: torch.dtype, kernel: str) -> None:
    config = MoEConfig(num_experts=64, top_k=8, hidden_size=1024, intermediate_size=512)
    _check(config, scheme, dtype, 3, kernel=kernel, drop=True)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "swigluoai"])
def test_gemv_activations(activation: Activation, kernel: str) -> None:
    config = MoEConfig(
        num_experts=16,
        top_k=2,
        hidden_size=2880,
        intermediate_size=2880,
        activation=activation,
    )  # gpt-oss sizes: 2880 is not a multiple of the 256-column step
    _check(config, SCHEMES[0], torch.bfloat16, 2, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_gemv_router_weight_on_input(kernel: str) -> None:
    config = MoEConfig(
        num_experts=16,
        top_k=1,
        hidden_size=512,
        intermediate_size=256,
        renormalize=False,  # top-1 renormalized weighs 1: weighting twice would pass
        apply_router_weight_on_input=True,
    )
    _check(config, SCHEMES[5], torch.bfloat16, 5, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "size",
    [
        (8, 2, 4096, 14336, 1),
        (8, 2, 4096, 14336, 4),
        (256, 8, 7168, 2048, 16),
        (128, 8, 2048, 768, 8),
        (128, 8, 4096, 1536, 16),
    ],
)
def test_gemv_model_shapes(size: tuple[int, int, int, int, int], kernel: str) -> None:
    e, k, d, f, t = size
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    prepared = TritonW4A16Backend().prepare(
        int4_weights(
            config, SCHEMES[2], torch.bfloat16, torch.Generator().manual_seed(0)
        ),
        config,
        dtype=torch.bfloat16,
    )
    # words: <= 128 pairs and <= one per expert; where the Gluon GEMM runs <= 64
    # pairs and <= one per two experts, on an H100 with >= 128 experts 3/4 a expert
    mma = mma_runs(prepared.w13, prepared.w2)
    most = (
        min(configs.GEMV_MAX_PAIRS_MMA, e // 2)
        if mma
        else min(configs.GEMV_MAX_PAIRS, e)
    )
    if mma and e >= 128 and "H100 80GB HBM3" in torch.cuda.get_device_name():
        most = e * 3 // 4  # the H100 measured (GEMV_WIDE_GPUS): 3/4 pair an expert
    assert use_gemv(t * k, prepared.w13, prepared.w2, enabled=True) is (t * k <= most)
    _check(config, SCHEMES[2], torch.bfloat16, t, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_gemv_cuda_graph(kernel: str) -> None:
    config = MoEConfig(num_experts=64, top_k=8, hidden_size=1024, intermediate_size=512)
    weights = int4_weights(
        config, SCHEMES[2], torch.bfloat16, torch.Generator().manual_seed(3)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)
    hidden_TD = torch.randn(2, 1024, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, 2)
    check_graph_replays(
        lambda: fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, path="gemv",
            gemv_tiles=KERNELS[kernel],
        ),
        hidden_TD, routing, weights, config,
    )  # fmt: skip


WORD_TILES = [  # (block_n, block_k, warps, w2_split): the table's candidates, H200
    (16, 256, 1, None), (8, 256, 1, None), (32, 128, 1, None), (32, 128, 2, None),
    (64, 128, 2, None), (16, 256, 2, None), (32, 256, 4, None), (64, 128, 2, 3),
    (16, 64, 2, 2), (8, 512, 1, None),
]  # fmt: skip


@pytest.mark.parametrize(
    "tile", WORD_TILES, ids=lambda t: "{}x{}-w{}-split{}".format(*t)
)
@pytest.mark.parametrize(
    "scheme", [SCHEMES[0], SCHEMES[7], SCHEMES[4]], ids=lambda s: s.name
)
@pytest.mark.parametrize("paired", [False, True], ids=["words", "paired"])
def test_gemv_word_tiles(
    tile: tuple[int, int, int, int | None], scheme: Int4Scheme, paired: bool
) -> None:
    """Word tiles with one group per step or several (g32 and g128, block_k 64..256),
    the whole row as one group, a K tail (D = 1152 in 256-column steps), K splits, and
    gpt-oss biases."""
    bn, bk, warps, split = tile
    config = MoEConfig(
        num_experts=32, top_k=4, hidden_size=1152, intermediate_size=768,
        activation="swigluoai", expert_bias=True,
    )  # fmt: skip
    dtype = torch.float16 if scheme.has_zero_point else torch.bfloat16
    tiles = GemvTiles(
        block_n=bn, block_k=bk, num_warps=warps, w2_split=split, words=True,
        paired=paired,
    )  # fmt: skip
    check_fused(
        config, scheme, dtype, 2, seed=4, path="gemv", drop=True, gemv_tiles=tiles
    )


def _outlier_and_zero_token(x: torch.Tensor) -> torch.Tensor:
    """One input 3000x the rest in token 0, token 1 all zeros (all-zero steps)."""
    x = x.clone()
    x[0, 5] = 3000.0
    x[1] = 0.0
    return x


HIDDEN_SHAPES = {  # (dtype, map of the N(0, 1) hidden states)
    "bf16-1e5": (torch.bfloat16, lambda x: x * 1e5),  # products past float16's range
    "bf16-1e-6": (torch.bfloat16, lambda x: x * 1e-6),  # below float16's normals
    "bf16-1e15": (torch.bfloat16, lambda x: x * 1e15),  # 1e30 after gate * up
    "fp16-1e-2": (torch.float16, lambda x: x * 1e-2),  # see below
    "bf16-outlier-zero-token": (torch.bfloat16, _outlier_and_zero_token),
}


@pytest.mark.parametrize("shape", HIDDEN_SHAPES)
@pytest.mark.parametrize(
    "scheme", [SCHEMES[0], SCHEMES[7], SCHEMES[4]], ids=lambda s: s.name
)
@pytest.mark.parametrize("kernel", ["words", "paired", "bulk", "intdot"])
def test_word_gemv_inputs_of_any_magnitude(
    shape: str, scheme: Int4Scheme, kernel: str
) -> None:
    """The word GEMV multiplies in float16 pairs: each step's input is scaled by a
    power of two first, so bf16 inputs far outside float16's range (or below its
    normals) and a step of zeros keep the float32 reference's relative error. The
    integer form (``intdot``) puts each 16 inputs on the power-of-two grid of their
    largest, so the same holds, and a 3000x outlier rounds only its column's others.

    float16 activations: the layer itself leaves float16's range first (the gated
    product is about x^2 here: at 1e-4 inputs 98% of the float16 outputs are 0, at
    1e-2 the float16 intermediate and output alone cost 4e-4), so they are checked
    at 1e-2, a step exponent far from 0. The oracle's output must be representable
    (< 1% zeros), or the comparison would say nothing."""
    dtype, shape_hidden = HIDDEN_SHAPES[shape]
    config = MoEConfig(
        num_experts=32, top_k=4, hidden_size=1024, intermediate_size=512,
        activation="gelu",
    )  # fmt: skip
    expected = check_fused(
        config, scheme, dtype, 3, seed=6, path="gemv", gemv_tiles=KERNELS[kernel],
        shape_hidden=shape_hidden,
    )  # fmt: skip
    live = expected[expected.abs().sum(dim=1) > 0]  # the token of zeros aside
    assert (live == 0).float().mean().item() < 0.01


@pytest.mark.parametrize(
    "tiles",
    [
        GemvTiles(block_n=16, block_k=512, prefetch=True),
        GemvTiles(block_n=32, block_k=256, prefetch=True),
        GemvTiles(block_n=16, block_k=512, loop_stages=2),
        GemvTiles(block_n=32, block_k=256, loop_stages=3),
        GemvTiles(block_n=16, block_k=512, w2_split=2),
        GemvTiles(block_n=32, block_k=256, w2_split=3),
        GemvTiles(block_n=16, block_k=512, prefetch=True, w2_split=2),
        GemvTiles(block_n=16, block_k=256, num_warps=1, words=True, prefetch=True),
        GemvTiles(block_n=16, block_k=512, num_warps=1, words=True, prefetch=True),
        GemvTiles(
            block_n=8, block_k=256, num_warps=1, words=True, prefetch=True, w2_split=3
        ),
        GemvTiles(block_n=16, block_k=256, num_warps=1, words=True, loop_stages=3),
        GemvTiles(
            block_n=16, block_k=512, num_warps=1, words=True, paired=True, prefetch=True
        ),
        GemvTiles(
            block_n=8,
            block_k=256,
            num_warps=1,
            words=True,
            paired=True,
            prefetch=True,
            w2_split=3,
        ),
        GemvTiles(
            block_n=16, block_k=256, num_warps=1, words=True, paired=True, loop_stages=3
        ),
    ],
    ids=[
        "prefetch-16x512",
        "prefetch-32x256",
        "stages2-16x512",
        "stages3-32x256",
        "split2-16x512",
        "split3-32x256",
        "prefetch-split2-16x512",
        "words-prefetch-16x256",
        "words-prefetch-16x512-k-tail",
        "words-prefetch-split3-8x256",
        "words-stages3-16x256",
        "paired-prefetch-16x512-k-tail",
        "paired-prefetch-split3-8x256",
        "paired-stages3-16x256",
    ],
)
@pytest.mark.parametrize(
    "scheme", [SCHEMES[0], SCHEMES[7], SCHEMES[4]], ids=lambda s: s.name
)
def test_gemv_loop_variants(tiles: GemvTiles, scheme: Int4Scheme) -> None:
    config = MoEConfig(num_experts=32, top_k=4, hidden_size=1536, intermediate_size=768)
    dtype = torch.float16 if scheme.has_zero_point else torch.bfloat16
    check_fused(
        config, scheme, dtype, 3, seed=9, path="gemv", drop=True, gemv_tiles=tiles
    )


def test_gemv_rule_splits_w2_when_programs_are_few() -> None:
    """Few pairs and a long w2 reduction (Mixtral-like at M = 1): K is split, and the
    split forward matches the oracle and replays under a CUDA graph."""
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=1024, intermediate_size=4096)
    assert configs.gemv_split_for(2 * 1024 // 16, 4096, 512) == 4
    weights = int4_weights(
        config, SCHEMES[0], torch.bfloat16, torch.Generator().manual_seed(5)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)
    hidden_TD = torch.randn(1, 1024, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, 1)
    check_graph_replays(
        lambda: fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, path="gemv"
        ),
        hidden_TD, routing, weights, config, reroute=False, replays=2,
    )  # fmt: skip


@pytest.mark.parametrize(
    "size", [(8, 2, 4096, 14336, 1), (128, 8, 2048, 768, 1), (64, 4, 1024, 512, 3)]
)
def test_pdl_matches_serial_launches(size: tuple[int, int, int, int, int]) -> None:
    """Programmatic dependent launch lets the w2 GEMV and the top-k sum start before
    the kernel ahead of them ends: a wait in the wrong place would read a partial
    intermediate. Eager and graph-replayed outputs must equal, bit for bit, those of
    the same kernels launched one after the other, over many forwards with fresh
    inputs (w2 split 4 at Mixtral's shape, 1 at the others)."""
    serial = attrs.evolve(KERNELS["pdl"], pdl=False)
    assert_same_outputs(
        size, SCHEMES[0], KERNELS["pdl"], serial, seed=4, forwards=10, drop=False
    )


def _without_tma(tiles: GemvTiles) -> GemvTiles:
    w2 = tiles.w2_tiles
    return attrs.evolve(
        tiles, tma=False, loop_stages=None,
        w2_tiles=None if w2 is None else _without_tma(w2),
    )  # fmt: skip


@pytest.mark.parametrize(
    "size",
    [(8, 2, 4096, 14336, 1), (128, 8, 2048, 768, 1), (64, 4, 1152, 768, 3)],
    ids=["mixtral-w2-split", "qwen3-30b-w2-k-tail", "w13-k-tail"],
)
@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[7]], ids=lambda s: s.name)
def test_bulk_copy_reads_equal_plain_loads(
    size: tuple[int, int, int, int, int], scheme: Int4Scheme
) -> None:
    """``GEMV_PAIRED`` reads its words by TMA, pipelined through shared memory: its
    eager and graph-replayed outputs must equal, bit for bit, those of the same tiles
    with plain loads (the same words meet the same inputs), over fresh inputs; with a
    K split (Mixtral's w2), K tails (a last box past K reads zeros) and an expert
    held elsewhere."""
    plain = _without_tma(KERNELS["bulk"])
    assert_same_outputs(
        size, scheme, KERNELS["bulk"], plain, seed=8, forwards=5, drop=True
    )


@pytest.mark.parametrize(
    "size",
    [(8, 2, 4096, 14336, 1), (128, 8, 4096, 1536, 1), (64, 4, 1152, 768, 3)],
    ids=["mixtral-w2-split", "qwen3-235b", "w13-k-tail"],
)
@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[7]], ids=lambda s: s.name)
def test_inputs_ahead_equals_loads_at_their_step(
    size: tuple[int, int, int, int, int], scheme: Int4Scheme
) -> None:
    """``GemvTiles.inputs_ahead`` moves the scale, zero-point and input loads a step
    earlier and nothing else: ``GEMV_PAIRED``'s eager and replayed outputs equal those
    of its tiles without it bit for bit over fresh inputs, with a K split, a K tail
    and an expert held elsewhere. (Passed on an H100 on 2026-12-06, first as the
    ahead tiles against the table of then, bench/sweeps/cuda_ahead_ae3375f_h100.log,
    then in this form, cuda_final_305fbbc_h100.log.)"""
    assert configs.GEMV_PAIRED.inputs_ahead
    assert_same_outputs(
        size, scheme, KERNELS["intdot"], KERNELS["intdot_at_step"], seed=9, forwards=5,
        drop=True,
    )  # fmt: skip


@pytest.mark.parametrize("inputs", ["1", "1e-35", "1e30", "outlier", "inf"])
@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[7]], ids=lambda s: s.name)
@pytest.mark.parametrize("kernel", ["intdot", "intdot_few"])
def test_int_dot_ptx_matches_its_plain_triton_form(
    inputs: str, scheme: Int4Scheme, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integer GEMV's inline PTX (PRMT, LOP3, ``dp4a``) sums the same integers as
    its plain-Triton form (``ASM`` off), which the interpreter tests against float64
    (``test_triton_gemv_ints.py``): one w2-shaped GEMV (2 pairs, K = 1280: half a
    512-column step past the last whole one, float32 out) each way, equal up to float32
    rounding of the terms' size, NaN where an input is inf in both. (First run on an
    H100 on 2026-12-06: 20 passed, bench/sweeps/cuda_l2_call_h100.log.)"""
    import backends.triton._launch_gemv as launch_gemv
    from backends.triton._launch import ExpertMatrix
    from core.routing import Routing

    n, k, group = 256, 1280, scheme.group_size
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (2, n, k), generator=g)
    scale = (torch.rand(2, n, k // group, generator=g) * 0.02 + 0.005).to(
        torch.bfloat16
    )
    zero = None
    if scheme.has_zero_point:
        zero = torch.randint(0, 16, (2, n, k // group), generator=g).to(torch.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    matrix = ExpertMatrix(
        data=packed.cuda(), scale=scale.cuda(),
        zero_point=None if zero is None else zero.cuda(), group_size=group,
    )  # fmt: skip
    x = torch.randn(2, k, generator=g)
    if inputs == "outlier":
        x[:, 5] = 3000.0
    elif inputs == "inf":
        x[0, 40] = float("inf")
    else:
        x = x * float(inputs)
    x16 = x.to(torch.bfloat16).cuda()
    config = MoEConfig(num_experts=2, top_k=1, hidden_size=k, intermediate_size=n)
    routing = Routing(
        topk_weights=torch.ones(2, 1, device="cuda"),
        topk_ids=torch.tensor([[0], [1]], device="cuda"),
    )
    tiles = KERNELS[kernel].w2_tiles or KERNELS[kernel]
    outs = []
    for asm in (True, False):
        monkeypatch.setattr(launch_gemv, "ptx_target", lambda a, on=asm: on)
        out = torch.empty(2, n, device="cuda")
        launch_gemv.launch_gemv(
            x16, matrix, out, n=n, routing=routing, config=config, gated=False,
            tiles=attrs.evolve(tiles, w2_split=1),
        )  # fmt: skip
        outs.append(out.double())
    ptx, plain = outs
    assert torch.equal(ptx.isnan(), plain.isnan())
    assert (inputs == "inf") == bool(ptx[0].isnan().all())
    finite = ~ptx.isnan()
    size = (
        x16.double().abs().nan_to_num(posinf=0.0)
        @ (scale.double().repeat_interleave(group, -1).abs().amax(0) * 15).T.cuda()
    )
    assert ((ptx - plain).abs()[finite] <= (1e-6 * size)[finite]).all()
