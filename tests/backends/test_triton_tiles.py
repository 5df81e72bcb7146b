"""The tile objects' checks at construction (``backends/triton/_tiles.py``)."""

import attrs
import pytest

from backends.triton._tiles import GemmTiles, GemvTiles


def test_gemm_tiles_refuse_two_dequantization_schemes() -> None:
    with pytest.raises(ValueError, match="at most one"):
        GemmTiles(
            block_n=32, block_k=64, swap_ab=True, nibble_halves=True, int4_words=True
        )
    with pytest.raises(ValueError, match="needs swap_ab"):
        GemmTiles(block_n=32, block_k=64, int4_words=True)


def test_gemm_tiles_mma_needs_words_and_its_tile_shape() -> None:
    with pytest.raises(ValueError, match="mma needs int4_words"):
        GemmTiles(block_n=64, block_k=128, swap_ab=True, mma=True)
    with pytest.raises(ValueError, match=r"block_k 128 .* got block_k 64"):
        GemmTiles(block_n=64, block_k=64, swap_ab=True, int4_words=True, mma=True)
    with pytest.raises(ValueError, match=r"16 \* num_warps = 128, .* block_n 64"):
        GemmTiles(
            block_n=64, block_k=128, num_warps=8, swap_ab=True, int4_words=True,
            mma=True,
        )  # fmt: skip


@pytest.mark.parametrize("copy_steps", [0, 3, 8])
def test_gemm_tiles_copy_steps_are_1_2_or_4(copy_steps: int) -> None:
    with pytest.raises(
        ValueError, match=f"copy_steps must be 1, 2 or 4, got {copy_steps}"
    ):
        GemmTiles(block_n=64, block_k=128, copy_steps=copy_steps)


def test_gemm_tiles_copy_groups_need_the_gluon_ring() -> None:
    mma = GemmTiles(
        block_n=128, block_k=128, swap_ab=True, int4_words=True, mma=True,
        num_stages=2, copy_steps=4,
    )  # fmt: skip
    assert mma.copy_steps == 4
    with pytest.raises(ValueError, match=r"needs mma=True .* mma=False, num_stages=3"):
        GemmTiles(block_n=64, block_k=128, copy_steps=2)
    with pytest.raises(ValueError, match=r"needs mma=True .* mma=True, num_stages=1"):
        attrs.evolve(mma, num_stages=1)


def test_gemm_tiles_shared_input_needs_the_gluon_ring() -> None:
    mma = GemmTiles(
        block_n=128, block_k=128, swap_ab=True, int4_words=True, mma=True,
        num_stages=2, x_shared=True,
    )  # fmt: skip
    assert mma.x_shared
    with pytest.raises(
        ValueError, match=r"x_shared needs mma=True .* mma=False, num_stages=3"
    ):
        GemmTiles(block_n=64, block_k=128, x_shared=True)
    with pytest.raises(
        ValueError, match=r"x_shared needs mma=True .* mma=True, num_stages=1"
    ):
        attrs.evolve(mma, num_stages=1)


def test_gemm_tiles_wgmma_needs_mma_whole_warpgroups_and_registers() -> None:
    wgmma = GemmTiles(
        block_n=128, block_k=128, num_warps=8, num_stages=1, swap_ab=True,
        int4_words=True, mma=True, wgmma=True,
    )  # fmt: skip
    assert wgmma.wgmma
    with pytest.raises(ValueError, match=r"wgmma needs mma=True.* got mma=False"):
        attrs.evolve(wgmma, mma=False)
    with pytest.raises(ValueError, match=r"num_warps 4 or 8.* num_warps=2"):
        attrs.evolve(wgmma, num_warps=2, block_n=32)
    with pytest.raises(ValueError, match=r"num_warps 4 or 8.* num_warps=12"):
        attrs.evolve(wgmma, num_warps=12, block_n=192)
    with pytest.raises(ValueError, match=r"16 \* num_warps .* block_n=128"):
        attrs.evolve(wgmma, num_warps=4)  # two 64-row tiles a warpgroup spill
    assert attrs.evolve(wgmma, num_warps=4, block_n=64).wgmma
    shared = attrs.evolve(wgmma, num_stages=2, x_shared=True)  # the input's ring
    assert shared.x_shared
    with pytest.raises(ValueError, match=r"x_shared needs mma=True .* num_stages=1"):
        attrs.evolve(shared, num_stages=1)
    ring = attrs.evolve(wgmma, num_stages=3, copy_steps=2)  # the words' cp.async ring
    assert (ring.num_stages, ring.copy_steps) == (3, 2)


def test_gemv_tiles_refuse_inputs_ahead_with_prefetch() -> None:
    ahead = GemvTiles(
        block_n=8, block_k=512, words=True, paired=True, inputs_ahead=True
    )
    assert ahead.inputs_ahead
    with pytest.raises(ValueError, match=r"inputs_ahead .* prefetch .* at most one"):
        attrs.evolve(ahead, prefetch=True)
