"""The warpgroup kernel's input through its ring in logical K order (marker ``cuda``).

``GemmTiles.x_shared`` on ``wgmma`` tiles with a ring: w2's input is w13's output
written in logical K order (``LOGICAL_OUT``), w13's is ``permute_logical(x)``, and
each step's ``(block_m, 128)`` tile is copied as it is into a ring slot that the
tensor cores read. The MMAs then meet the same 16-bit values in the same order as
with the activation stored from registers, so the outputs must equal that form's bit
for bit; each case also checks the oracle, and all but the graph case which form ran
(a spy on the launch).
Off Hopper the same tiles run ``mma.sync``, and the checks are against the oracle only.
Shape legend as in test_triton_cuda.py.
"""

from typing import Any

import attrs
import pytest
import torch

import backends.triton._launch as launch
from backends.triton import TritonW4A16Backend
from backends.triton._configs_mma import wgmma_decode_tiles
from backends.triton._fused import fused_moe
from backends.triton._launch import wgmma_target
from backends.triton._tiles import GemmTiles, MoETiles
from core.config import MoEConfig
from core.reference import moe_forward_reference
from core.scheme import Int4Scheme
from tests.backends.triton_cuda_cases import (
    SCHEMES,
    assert_same_outputs,
    gpu_routing,
    int4_weights,
    run_without_host_sync,
)
from tests.tolerances import REL_L2_VS_ORACLE, rel_l2

pytestmark = pytest.mark.cuda

RING = GemmTiles(
    block_n=64, block_k=128, num_warps=4, num_stages=3, swap_ab=True,
    int4_words=True, mma=True, wgmma=True, copy_steps=2,
)  # fmt: skip
"""A warpgroup ring of 64 x 128 tiles of 4 warps (3 stages; the table's has 2), the
input in registers: the cases set ``x_shared`` and the depths they need."""


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool, bool]]:
    """Record each Gluon launch's ``(wgmma, x_ring, LOGICAL_OUT)`` in order."""
    calls: list[tuple[bool, bool, bool]] = []
    real = launch._launch_gluon

    def spy(*args: Any, **kwargs: Any) -> None:
        meta = args[2]
        calls.append((kwargs["wgmma"], kwargs["x_ring"], meta["LOGICAL_OUT"]))
        real(*args, **kwargs)

    monkeypatch.setattr(launch, "_launch_gluon", spy)
    return calls


def _hopper() -> bool:
    return wgmma_target(torch.empty(1, device="cuda"))


def _forward(
    size: tuple[int, int, int, int, int],
    scheme: Int4Scheme,
    dtype: torch.dtype,
    tiles: MoETiles,
    *,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, out with x_shared off, oracle)`` of one forward on ``tiles``."""
    e, k, d, f, t = size
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    weights = int4_weights(config, scheme, dtype, torch.Generator().manual_seed(seed))
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=dtype)
    hidden_TD = torch.randn(t, d, device="cuda").to(dtype)
    routing = gpu_routing(config, t, drop=True)
    plain = attrs.evolve(
        tiles,
        w13=attrs.evolve(tiles.w13, x_shared=False),
        w2=attrs.evolve(tiles.w2, x_shared=False),
    )

    def forward(chosen: MoETiles) -> torch.Tensor:
        return fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, tiles=chosen,
            path="gemm",
        )  # fmt: skip

    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    return forward(tiles), forward(plain), expected


FORMS = {
    "w2-3x2": (False, True, 3, 2),
    "both-3x2": (True, True, 3, 2),
    "w13-3x2": (True, False, 3, 2),
    "both-2x1": (True, True, 2, 1),
    "both-4x1": (True, True, 4, 1),
    "both-2x2": (True, True, 2, 2),
}
"""``(w13 x_shared, w2 x_shared, num_stages, copy_steps)``."""


@pytest.mark.parametrize(("block_m", "tokens"), [(32, 64), (16, 37), (64, 300)])
@pytest.mark.parametrize(("x13", "x2", "stages", "copy"), FORMS.values(), ids=FORMS)
def test_input_ring_equals_the_register_form(
    monkeypatch: pytest.MonkeyPatch,
    x13: bool,
    x2: bool,
    stages: int,
    copy: int,
    block_m: int,
    tokens: int,
) -> None:
    """Bit for bit the register form's outputs, within the oracle's tolerance, over
    ring depths and row blocks (a pair held elsewhere); the spy sees the ring taken
    where asked and w13 writing logical order exactly when w2 reads it."""
    t = attrs.evolve(RING, num_stages=stages, copy_steps=copy)
    tiles = MoETiles(
        block_m=block_m,
        w13=attrs.evolve(t, x_shared=x13),
        w2=attrs.evolve(t, x_shared=x2, split_k=2 if block_m == 16 else 1),
    )
    calls = _spy(monkeypatch)
    out, base, expected = _forward(
        (8, 2, 1024, 768, tokens), SCHEMES[0], torch.bfloat16, tiles, seed=3
    )
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[torch.bfloat16]
    if not _hopper():
        return
    assert torch.equal(out, base)
    assert calls[:2] == [(True, x13, x2), (True, x2, False)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "scheme", [SCHEMES[2], SCHEMES[6], SCHEMES[9]], ids=lambda s: s.name
)
def test_input_ring_schemes_and_dtypes(
    monkeypatch: pytest.MonkeyPatch, scheme: Int4Scheme, dtype: torch.dtype
) -> None:
    """Zero points, group sizes and fp16 through the ring form (both GEMMs)."""
    ring = attrs.evolve(RING, x_shared=True)
    tiles = MoETiles(block_m=32, w13=ring, w2=ring)
    calls = _spy(monkeypatch)
    out, base, expected = _forward((16, 4, 1536, 640, 96), scheme, dtype, tiles, seed=5)
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[dtype]
    if _hopper():
        assert torch.equal(out, base)
        assert calls[:2] == [(True, True, True), (True, True, False)]


@pytest.mark.parametrize(
    ("size", "w13", "want"),
    [
        # F = 328: w2's K is not whole 128-column steps, w13's is
        ((8, 2, 512, 328, 37), attrs.evolve(RING, x_shared=True), (True, False)),
        # w13 split: its float32 partials are activated apart, in real order
        (
            (8, 2, 512, 384, 37),
            attrs.evolve(RING, x_shared=True, split_k=2),
            (True, False),
        ),
        # D = 520: w13's K is not whole steps; w2 still takes w13's logical output
        ((8, 2, 520, 384, 37), attrs.evolve(RING, x_shared=True), (False, True)),
        # w13 on mma.sync (16-row blocks) writes logical order for the warpgroup w2
        (
            (8, 2, 512, 384, 37),
            attrs.evolve(RING, block_n=128, num_stages=2, wgmma=False),
            (False, True),
        ),
    ],
    ids=["w2-k328", "w13-split2", "w13-k520", "w13-mma-sync"],
)
def test_input_ring_falls_back_where_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
    size: tuple[int, int, int, int, int],
    w13: GemmTiles,
    want: tuple[bool, bool],
) -> None:
    """Where a GEMM cannot take the logical-order ring it loads the input into
    registers instead; the layer stays right (the oracle), bit for bit the form
    without ``x_shared``, and the spy sees which GEMM took the ring."""
    tiles = MoETiles(
        block_m=16, w13=w13, w2=attrs.evolve(RING, x_shared=True, split_k=2)
    )
    calls = _spy(monkeypatch)
    out, base, expected = _forward(size, SCHEMES[4], torch.bfloat16, tiles, seed=9)
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[torch.bfloat16]
    if not _hopper():
        return
    assert torch.equal(out, base)
    assert (calls[0][1], calls[1][1]) == want  # this form's w13 and w2
    assert calls[0][2] == want[1]  # w13 writes logical order iff w2 reads it


def test_input_ring_at_mixtral_m64_replays_and_makes_no_host_sync() -> None:
    """The table's Mixtral M = 64 row (the input ring on both GEMMs, PDL): eager and
    CUDA-graph replays over fresh inputs and routings equal, bit for bit, the same
    tiles with the input through registers; and a forward makes no host
    synchronization."""
    ring = wgmma_decode_tiles(split=1, large=True)
    assert (ring.pdl, ring.w13.x_shared, ring.w2.x_shared) == (True, True, True)
    registers = attrs.evolve(
        ring,
        w13=attrs.evolve(ring.w13, x_shared=False),
        w2=attrs.evolve(ring.w2, x_shared=False),
    )
    size = (8, 2, 4096, 14336, 64)
    assert_same_outputs(
        size, SCHEMES[0], ring, registers, seed=6, forwards=4, drop=True
    )
    e, k, d, f, t = size
    config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
    weights = int4_weights(
        config, SCHEMES[0], torch.bfloat16, torch.Generator().manual_seed(2)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)
    hidden_TD = torch.randn(t, d, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, t)

    def forward() -> torch.Tensor:
        return fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, tiles=ring,
            path="gemm",
        )  # fmt: skip

    forward()  # compiled before the sync check
    out = run_without_host_sync(forward)
    expected = moe_forward_reference(hidden_TD, weights, routing, config)
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[torch.bfloat16]
