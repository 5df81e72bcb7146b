"""The Gluon launch's meta-parameters (``backends/triton/_launch.py``), on CPU: the
kernels are replaced by a recorder, so nothing is compiled or run."""

from collections.abc import Callable

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
    for k in (4096, 328):
        launch._launch_gluon((1, 1, 1), (), {}, tiles, x, k=k, wgmma=True)
    first, second = recorder.meta
    assert first == {
        "ASYNC": want_async, "STAGES": stages, "COPY_STEPS": copy_steps, "K32": True
    }  # fmt: skip
    assert second["K32"] is False  # K % 32 != 0: 8-byte word copies
