"""The tile table's int4 decode row on the Gluon kernel (``backends/triton/_configs_mma.py``).

Host-side only (no kernel runs): the forms, row blocks and K splits that
``choose_tiles`` gives where the Gluon kernel runs, and the split rules behind them.
"""

import attrs
import pytest
import torch

import backends.triton._configs as configs
import backends.triton._configs_mma as mma_configs
from backends.triton._launch import ExpertMatrix
from backends.triton._tiles import MoETiles


def test_int4_tiles_rule_with_the_mma_kernel() -> None:
    """Where the Gluon kernel runs, the decode row takes it: 8-row blocks up to 6
    pairs per expert (a 2-stage ring of 2-step copy groups), 16-row ones with the
    input through that ring at 7 and 8, then 16 with a 3-stage ring of one step a
    group (the input through the 2-stage ring for small experts), all with
    programmatic dependent launch; the prefill rows stay."""

    def tiles(pairs: int, experts: int, hidden: int = 7168) -> MoETiles:
        return configs.choose_tiles(
            num_pairs=pairs, num_experts=experts, hidden_size=hidden,
            intermediate_size=2048, mma=True,
        )  # fmt: skip

    assert tiles(512, 256).w13 == attrs.evolve(mma_configs.MMA_TILES, split_k=2)
    assert tiles(512, 256).block_m == 8
    assert tiles(1536, 256).block_m == 8  # 6 per expert
    assert not tiles(1536, 256).w13.x_shared
    shared = attrs.evolve(mma_configs.MMA_TILES, x_shared=True)
    for pairs in (1537, 2048):  # 7 and 8 per expert
        assert tiles(pairs, 256).block_m == 16
        assert tiles(pairs, 256).w13 == shared
        assert tiles(pairs, 256).w2 == shared  # DeepSeek-V3's w2: 16 steps, 1 split
    assert tiles(2048, 128).block_m == 16  # 16 per expert
    assert tiles(2048, 128).w13.num_stages == mma_configs.MMA_RING_STAGES
    assert tiles(2048, 128).w13.copy_steps == 1
    assert not tiles(2048, 128).w13.x_shared  # a large expert
    assert tiles(2048, 128, hidden=2048).w13 == shared  # a small one
    assert tiles(2048, 128).w2.mma
    assert tiles(2, 8).w2.split_k > 1
    assert not tiles(2049, 128).w13.mma  # 17 per expert: nibble halves
    sixteen = configs.choose_tiles(
        num_pairs=512, num_experts=256, hidden_size=7168, intermediate_size=2048,
        sixteen_bit=True, mma=True,
    )  # fmt: skip
    assert not sixteen.w13.mma
    # programmatic dependent launch with the Gluon kernel's rows only
    assert all(
        tiles(p, e).pdl for p, e in ((2, 8), (512, 256), (2048, 256), (2048, 128))
    )
    assert not tiles(2049, 128).pdl
    assert not sixteen.pdl


def test_mma_w2_split_for_long_reductions() -> None:
    """In 8-row blocks the w2 GEMM splits K until <= MMA_MAX_STEPS steps a split."""
    assert mma_configs.MMA_MAX_STEPS == 32
    assert mma_configs.mma_split_for(1, 14336) == 4  # Mixtral: 112 steps, then 56, 28
    assert mma_configs.mma_split_for(8, 14336) == 8  # already short enough
    assert mma_configs.mma_split_for(1, 2048) == 1  # DeepSeek-V3: 16 steps
    assert mma_configs.mma_split_for(1, 128 * 32) == 1
    assert mma_configs.mma_split_for(1, 128 * 32 + 1) == 2
    assert mma_configs.mma_split_for(1, 1 << 24) == 8  # at most 8 ways

    def tiles(pairs: int, experts: int, inter: int) -> MoETiles:
        return configs.choose_tiles(
            num_pairs=pairs, num_experts=experts, hidden_size=4096,
            intermediate_size=inter, mma=True,
        )  # fmt: skip

    assert tiles(32, 8, 14336).block_m == 8
    assert tiles(32, 8, 14336).w2.split_k == 4  # Mixtral-8x7B at M = 16
    assert tiles(128, 8, 14336).block_m == 16  # 16 per expert: the split as before
    assert tiles(128, 8, 14336).w2.split_k == configs.split_for(8 * 64, 14336, 128)


def test_mma_w13_split_for_long_or_few_programs() -> None:
    """In 8-row blocks of <= 4 pairs an expert, w13 splits K in two above
    MMA_MAX_STEPS steps, or at it with fewer than two waves of programs (expected busy
    experts times column tiles)."""
    assert mma_configs.mma_w13_split(7168, 1e6) == 2  # DeepSeek-V3: 56 steps
    assert mma_configs.mma_w13_split(4096, 791) == 2  # 32 steps, under two waves
    assert mma_configs.mma_w13_split(4096, 792) == 1
    assert mma_configs.mma_w13_split(4096 - 127, 10) == 2  # 32 steps, the last partial
    assert mma_configs.mma_w13_split(4096 - 128, 10) == 1  # 31 steps
    assert mma_configs.mma_w13_split(2048, 10) == 1  # Qwen3-30B-A3B: 16 steps
    assert mma_configs.expected_busy_experts(1, 8) == pytest.approx(1.0)
    assert mma_configs.expected_busy_experts(16, 8) == pytest.approx(
        8 * (1 - 0.875**16)
    )
    assert mma_configs.expected_busy_experts(10**6, 256) == pytest.approx(256.0)

    def tiles(m: int, model: tuple[int, int, int, int]) -> MoETiles:
        e, k, d, f = model
        return configs.choose_tiles(
            num_pairs=m * k, num_experts=e, hidden_size=d, intermediate_size=f,
            mma=True,
        )  # fmt: skip

    mixtral, deepseek = (8, 2, 4096, 14336), (256, 8, 7168, 2048)
    qwen235, qwen30 = (128, 8, 4096, 1536), (128, 8, 2048, 768)
    # Mixtral: 112 column tiles an expert; 5.3 busy at M = 4, 7.0 at 8, 7.9 at 16
    assert [tiles(m, mixtral).w13.split_k for m in (2, 4, 8, 16, 32)] == [2, 2, 2, 1, 1]
    assert [tiles(m, deepseek).w13.split_k for m in (1, 16, 64, 128)] == [2, 2, 2, 2]
    assert tiles(256, deepseek).w13.split_k == 1  # 8 per expert: not split
    assert tiles(512, deepseek).w13.split_k == 1  # 16 per expert: 16-row blocks
    assert [tiles(m, qwen235).w13.split_k for m in (4, 16, 64)] == [2, 1, 1]
    assert [tiles(m, qwen30).w13.split_k for m in (4, 16, 64)] == [1, 1, 1]


def _with(
    pairs: int, experts: int, hidden: int, inter: int, *, mma: bool, wgmma: bool
) -> MoETiles:
    return configs.choose_tiles(
        num_pairs=pairs, num_experts=experts, hidden_size=hidden,
        intermediate_size=inter, mma=mma, wgmma=wgmma,
    )  # fmt: skip


MIXTRAL = (8, 4096, 14336)
QWEN3_235B = (128, 4096, 1536)


@pytest.mark.parametrize(
    ("per_expert", "shape", "split", "pdl"),
    [
        (17, MIXTRAL, 1, False),  # the prefill row's form from here
        (32, MIXTRAL, 1, False),  # Mixtral M = 128
        (128, MIXTRAL, 1, False),  # Mixtral M = 512: WGMMA_MAX_PER_EXPERT
        (17, QWEN3_235B, 1, False),  # every expert size past 16
        (64, QWEN3_235B, 1, False),  # Qwen3-235B M = 1024
        (80, QWEN3_235B, 1, False),  # Qwen3-235B M = 1280: WGMMA_MAX_PER_EXPERT_SMALL
        (80, (256, 7168, 2048), 1, False),  # DeepSeek-V3 M = 2560
        (81, (2, 4096, 8192), 1, False),  # 2^25 weights exactly: a large expert's bound
        (128, (2, 4096, 8192), 1, False),
        (32, (256, 7168, 2048), 1, False),  # DeepSeek-V3 M = 1024
    ],
)
def test_hopper_takes_the_warpgroup_kernel_where_it_was_faster(
    per_expert: int, shape: tuple[int, int, int], split: int, pdl: bool
) -> None:
    """``wgmma``: 32-row blocks of ``WGMMA_TILES`` (a 2-stage ring of 2-step copy
    groups) from 17 to ``wgmma_max_per_expert`` pairs per expert (128 for experts of at
    least ``WGMMA_LARGE_EXPERT``, else 80), unsplit, without PDL (the prefill
    row's)."""
    experts, hidden, inter = shape
    pairs = per_expert * experts
    got = _with(pairs, experts, hidden, inter, mma=True, wgmma=True)
    assert got.block_m == mma_configs.WGMMA_BLOCK == 32
    assert got.w13 == mma_configs.WGMMA_TILES
    assert (got.w13.wgmma, got.w13.num_stages, got.w13.copy_steps) == (True, 2, 2)
    assert got.w2 == attrs.evolve(mma_configs.WGMMA_TILES, split_k=split)
    assert got.pdl is pdl
    # the same sizes without Hopper (or without the Gluon kernel): no warpgroup tiles
    assert not _with(pairs, experts, hidden, inter, mma=True, wgmma=False).w13.wgmma
    assert not _with(pairs, experts, hidden, inter, mma=False, wgmma=True).w13.wgmma


@pytest.mark.parametrize(
    ("shape", "block_m", "split"),
    [
        (MIXTRAL, 32, 1),  # Mixtral M = 64: a large expert
        ((2, 4096, 8192), 32, 4),  # 2^25 weights exactly: the decode row's split
        ((2, 4096, 8191), 16, 4),  # one column fewer: a smaller expert's form
        (QWEN3_235B, 16, 1),  # Qwen3-235B M = 256
        ((128, 2048, 768), 16, 1),  # Qwen3-30B-A3B M = 256
        ((256, 7168, 2048), 16, 1),  # DeepSeek-V3 M = 512
    ],
)
def test_hopper_decode_row_at_16_pairs_takes_the_warpgroup_kernel(
    shape: tuple[int, int, int], block_m: int, split: int
) -> None:
    """At ``WGMMA_DECODE_WIDE_PER_EXPERT`` pairs per expert: experts of at least
    ``WGMMA_LARGE_EXPERT`` in 32-row blocks, smaller ones in 16-row blocks, both of
    ``WGMMA_TILES`` (2 stages, the input through the ring); the decode row's w2
    split, with PDL."""
    experts, hidden, inter = shape
    pairs = 16 * experts
    got = _with(pairs, experts, hidden, inter, mma=True, wgmma=True)
    form = mma_configs.WGMMA_TILES  # 2 stages of 2-step groups, the input ring
    assert (form.num_stages, form.copy_steps, form.x_shared) == (2, 2, True)
    assert got == mma_configs.wgmma_decode_tiles(
        split=split, large=hidden * inter >= mma_configs.WGMMA_LARGE_EXPERT
    )
    assert (got.block_m, got.w13, got.pdl) == (block_m, form, True)
    assert got.w2 == attrs.evolve(form, split_k=split)
    want = _with(pairs, experts, hidden, inter, mma=True, wgmma=False)
    assert got.w2.split_k == want.w2.split_k  # the row it replaces has that split
    assert not want.w13.wgmma


@pytest.mark.parametrize(
    ("per_expert", "shape", "split"),
    [
        (9, MIXTRAL, 1),  # Mixtral M = 36: WGMMA_DECODE_EARLY_MIN_PER_EXPERT
        (15, MIXTRAL, 1),  # Mixtral M = 60
        (9, (256, 7168, 2048), 1),  # DeepSeek-V3 M = 288
        (15, (256, 7168, 2048), 1),  # DeepSeek-V3 M = 480
        (9, (2, 4096, 2048), 4),  # 2^23 weights exactly: the decode row's split
        (15, QWEN3_235B, 1),  # smaller experts: WGMMA_DECODE_MIN_PER_EXPERT
        (15, (128, 2048, 768), 1),  # Qwen3-30B-A3B M = 240
    ],
)
def test_hopper_decode_row_from_9_pairs_takes_16_row_warpgroup_blocks(
    per_expert: int, shape: tuple[int, int, int], split: int
) -> None:
    """From ``WGMMA_DECODE_EARLY_MIN_PER_EXPERT`` to 15 pairs per expert, experts of at
    least ``MMA_SHARED_INPUT_MAX_EXPERT`` (large ones too) take 16-row blocks of
    ``WGMMA_TILES``, the decode row's w2 split, with PDL; smaller ones at 15
    (``WGMMA_DECODE_MIN_PER_EXPERT``)."""
    experts, hidden, inter = shape
    pairs = per_expert * experts
    got = _with(pairs, experts, hidden, inter, mma=True, wgmma=True)
    assert got == mma_configs.wgmma_decode_tiles(split=split, large=False)
    assert (got.block_m, got.w13, got.pdl) == (16, mma_configs.WGMMA_TILES, True)
    want = _with(pairs, experts, hidden, inter, mma=True, wgmma=False)
    assert got.w2.split_k == want.w2.split_k  # the row it replaces has that split
    assert not want.w13.wgmma


@pytest.mark.parametrize(
    ("per_expert", "shape"),
    [
        (14, QWEN3_235B),  # below 2^23 weights: not measured at 13-14
        (12, QWEN3_235B),  # level or behind, replayed
        (9, (128, 2048, 768)),  # Qwen3-30B-A3B M = 144: mma.sync won
        (14, (2, 4096, 2047)),  # one column below 2^23 weights
        (9, (2, 4096, 2047)),  # one column below 2^23 weights
        (8, MIXTRAL),  # Mixtral M = 32: a tie, mma.sync kept
        (8, (256, 7168, 2048)),
        (129, MIXTRAL),  # past WGMMA_MAX_PER_EXPERT: not measured
        (81, QWEN3_235B),  # past WGMMA_MAX_PER_EXPERT_SMALL: a tie at 96
        (81, (2, 4096, 8191)),  # just below 2^25 weights: the smaller experts' bound
        (96, (256, 7168, 2048)),  # DeepSeek-V3 M = 3072: it lost
        (128, (256, 7168, 2048)),  # DeepSeek-V3 M = 4096: it lost
        (1, MIXTRAL),
    ],
)
def test_hopper_keeps_the_other_rows_where_the_warpgroup_kernel_lost_or_was_not_run(
    per_expert: int, shape: tuple[int, int, int]
) -> None:
    experts, hidden, inter = shape
    pairs = per_expert * experts
    want = _with(pairs, experts, hidden, inter, mma=True, wgmma=False)
    assert _with(pairs, experts, hidden, inter, mma=True, wgmma=True) == want
    assert not want.w13.wgmma


def test_pick_tiles_asks_whether_the_warpgroup_kernel_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pick_tiles`` passes ``wgmma_target`` of the weights' device to the table: the
    warpgroup rows where it holds (an sm_90 answer faked on CPU), not elsewhere."""
    import backends.triton._fused as fused

    def int4(rows: int, cols: int) -> ExpertMatrix:  # shape only, never read
        data = torch.empty(8, rows, cols // 2, dtype=torch.uint8, device="meta")
        return ExpertMatrix(data=data, group_size=128)

    w13, w2 = int4(2 * 14336, 4096), int4(4096, 14336)  # Mixtral
    monkeypatch.setattr(fused, "is_interpreting", lambda: False)
    monkeypatch.setattr(fused, "mma_target", lambda a: True)
    monkeypatch.setattr(fused, "wgmma_target", lambda a: False)
    assert not fused.pick_tiles(256, w13, w2).w13.wgmma  # M = 128: 32 per expert
    monkeypatch.setattr(fused, "wgmma_target", lambda a: True)
    assert fused.pick_tiles(256, w13, w2).w13.wgmma
    assert fused.pick_tiles(256, w13, w2) == mma_configs.wgmma_tiles(split=1, pdl=False)
