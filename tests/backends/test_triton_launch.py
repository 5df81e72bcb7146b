"""The Gluon launch's meta-parameters (``backends/triton/_launch.py``), on CPU: the
kernels are replaced by a recorder, so nothing is compiled or run."""

from collections.abc import Callable

import attrs
import pytest
import torch

import backends.triton._launch as launch
from backends.triton._tiles import GemmTiles


class _Recorder:
    """Stands in for a Gluon kernel: ``kernel[grid](**meta)`` records the meta."""

    def __init__(self) -> None:
        self.meta: list[dict[str, object]] = []

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: object, **meta: object) -> None:
            self.meta.append(meta)

        return launch


@pytest.mark.parametrize(
    ("stages", "copy_steps", "overlap", "want_async"),
    [
        (1, 1, True, True),
        (1, 1, False, False),
        (3, 2, True, False),
        (2, 1, False, False),
    ],
)
def test_warpgroup_launch_passes_the_ring_and_overlaps_only_without_one(
    monkeypatch: pytest.MonkeyPatch,
    stages: int,
    copy_steps: int,
    overlap: bool,
    want_async: bool,
) -> None:
    """``_launch_gluon`` hands the warpgroup kernel the tiles' ring (``STAGES``,
    ``COPY_STEPS``, ``K32``), and ``WGMMA_ASYNC`` only for ringless tiles: the async
    form with a ring crashed ptxas and never ran."""
    # the dev group's Triton (pyproject) has Gluon's Hopper API; an older one fails here
    assert launch.gluon_hopper(), "the warpgroup kernel does not import on this Triton"
    import backends.triton._kernels_wgmma as kernels

    recorder = _Recorder()
    monkeypatch.setattr(kernels, "_moe_gemm_wgmma_kernel", recorder)
    monkeypatch.setattr(launch, "WGMMA_ASYNC", overlap)
    tiles = GemmTiles(
        block_n=64, block_k=128, num_warps=4, num_stages=stages, swap_ab=True,
        int4_words=True, mma=True, wgmma=True, copy_steps=copy_steps,
    )  # fmt: skip
    x = torch.empty(1, 8)
    ring = stages > 1  # the input ring takes a ring of words
    for k in (4096, 328):
        launch._launch_gluon(
            (1, 1, 1), (), {}, tiles, x, k=k, wgmma=True, x_ring=ring and k == 4096
        )
    first, second = recorder.meta
    assert first == {
        "ASYNC": want_async, "STAGES": stages, "COPY_STEPS": copy_steps, "K32": True,
        "X_RING": ring,
    }  # fmt: skip
    assert second["K32"] is False  # K % 32 != 0: 8-byte word copies
    assert second["X_RING"] is False
    if not ring:
        with pytest.raises(ValueError, match=r"x_ring needs the warpgroup kernel and"):
            launch._launch_gluon(
                (1, 1, 1), (), {}, tiles, x, k=4096, wgmma=True, x_ring=True
            )


RING = GemmTiles(
    block_n=64, block_k=128, num_warps=4, num_stages=3, swap_ab=True,
    int4_words=True, mma=True, wgmma=True, copy_steps=2, x_shared=True,
)  # fmt: skip


@pytest.mark.parametrize(
    ("logical", "form", "stages", "k", "copies", "plain_out", "error"),
    [
        ((True, False), "wgmma", 3, 4096, True, True, None),
        ((True, True), "wgmma", 2, 1536, True, False, None),
        ((False, True), "mma", 3, 4096, False, False, None),
        ((False, False), "triton", 3, 328, False, True, None),
        (
            (True, False),
            "mma",
            3,
            4096,
            True,
            False,
            r"form 'mma', num_stages=3, K=4096",
        ),
        (
            (True, False),
            "wgmma",
            1,
            4096,
            True,
            False,
            r"'wgmma', num_stages=1, K=4096",
        ),
        ((True, False), "wgmma", 3, 4160, True, False, r"num_stages=3, K=4160"),
        ((True, False), "wgmma", 3, 4096, False, False, r"whole copies False"),
        ((False, True), "triton", 3, 4096, True, False, r"output needs a Gluon kernel"),
        (
            (False, True),
            "wgmma",
            3,
            4096,
            True,
            True,
            r"no K-split w13, got form 'wgmma'",
        ),
    ],
)
def test_logical_order_only_where_the_kernel_that_runs_can(
    logical: tuple[bool, bool],
    form: str,
    stages: int,
    k: int,
    copies: bool,
    plain_out: bool,
    error: str | None,
) -> None:
    """A logical-order input is copied as it is by the warpgroup kernel's ring alone,
    on whole 128-column steps of whole 16-byte copies; only the Gluon kernels write a
    logical-order output, and only where it may leave real order (``plain_out``: N
    not whole steps, a ``perm_out``, a K-split w13's partials)."""
    tiles = GemmTiles(
        block_n=64, block_k=128, num_warps=4, num_stages=stages, swap_ab=True,
        int4_words=True, mma=True, wgmma=True, copy_steps=1,
    )  # fmt: skip

    def check() -> None:
        launch._check_logical(
            logical, form, tiles, k=k, copies=copies, plain_out=plain_out
        )

    if error is None:
        check()
        return
    with pytest.raises(ValueError, match=error):
        check()


def test_gemm_form_follows_the_tiles_the_device_and_the_row_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gemm_form``: the warpgroup kernel where its tiles, words, Hopper and its row
    blocks allow; else ``mma.sync`` where those allow; else the Triton kernel."""
    words = launch.ExpertMatrix(
        data=torch.zeros(2, 64, 256, dtype=torch.uint8), group_size=128
    )
    odd = launch.ExpertMatrix(data=torch.zeros(2, 64, 3, dtype=torch.uint8))
    x = torch.empty(1, 8)
    assert launch.gemm_form(RING, words, x, 32) == "triton"  # on CPU
    monkeypatch.setattr(launch, "wgmma_target", lambda a: True)
    monkeypatch.setattr(launch, "mma_target", lambda a: True)
    assert launch.gemm_form(RING, words, x, 32) == "wgmma"
    assert launch.gemm_form(RING, words, x, 64) == "wgmma"
    assert launch.gemm_form(attrs.evolve(RING, wgmma=False), words, x, 32) == "mma"
    assert launch.gemm_form(attrs.evolve(RING, wgmma=False), words, x, 64) == "triton"
    assert launch.gemm_form(RING, odd, x, 32) == "triton"  # rows of 6 codes: no words
    monkeypatch.setattr(launch, "wgmma_target", lambda a: False)
    assert launch.gemm_form(RING, words, x, 32) == "mma"  # Ampere takes mma.sync
