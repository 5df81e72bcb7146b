"""The int4 grouped GEMM's operand variants on a CUDA GPU (marker ``cuda``).

The tile table takes swapped operands with nibble halves for int4; the other
combinations (and the int32-word dequantization with its inline PTX) stay reachable
through ``tiles`` and are checked here against the oracle, with the bf16 and fp16 bit-pattern codes, zero points and group sizes below,
equal to and above the half-chunk. Shape legend as in test_triton_cuda.py.
"""

import attrs
import pytest
import torch

from backends.triton._configs import GemmTiles, MoETiles
from core.config import MoEConfig
from core.scheme import Int4Scheme
from tests.backends.triton_cuda_cases import SCHEMES, check_fused

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
) -> MoETiles:
    t = GemmTiles(
        block_n=block_n, block_k=block_k, num_warps=4, num_stages=3, swap_ab=swap,
        nibble_halves=halves, int4_words=words,
    )  # fmt: skip
    return MoETiles(block_m=block_m, w13=t, w2=attrs.evolve(t, split_k=split))


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
}


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
