"""The int4 decode row's tiles where the Gluon MMA kernel runs (``mma_tiles``).

Part of the tile table of ``_configs.py`` (``int4_tiles`` takes this row when ``mma``);
its forms, splits and thresholds, each with the measurements that chose it (one NVIDIA
H200, torch 2.11, triton 3.6; the warpgroup kernel's rows on an H100, same versions;
bench/TUNING.md, bench/sweeps/). Imports only stdlib,
attrs and ``_tiles.py``.
"""

from typing import Final

import attrs

from backends.triton._tiles import NUM_SMS_H200, GemmTiles, MoETiles

MMA_TILES: Final = GemmTiles(
    block_n=128, block_k=128, num_warps=4, num_stages=2, swap_ab=True,
    int4_words=True, mma=True, copy_steps=2,
)  # fmt: skip
"""The int4 decode row's tiles where the Gluon kernel runs (``int4_tiles``), 8-row
blocks: a 2-stage cp.async ring of 2-step copy groups (``GemmTiles.copy_steps``)."""
WGMMA_TILES: Final = GemmTiles(
    block_n=64, block_k=128, num_warps=4, num_stages=2, swap_ab=True,
    int4_words=True, mma=True, wgmma=True, copy_steps=2, x_shared=True,
)  # fmt: skip
"""The warpgroup-MMA kernel's tiles (Hopper: ``wgmma_target``), in ``WGMMA_BLOCK``-row
blocks, each MMA waited for (``_launch.WGMMA_ASYNC``), the words through a 2-stage
cp.async ring of 2-step copy groups, and with them the input in logical K order
(``x_shared``: where K is whole 128-column steps, and for w2 where w13 is unsplit on
a Gluon kernel; else, and on the dequant and nibble-halves paths, through registers:
``_fused._logical_inputs``). The input ring measured on an H100
(bench/sweeps/probe_mma_set25_h100.log; ms, graph replay at M <= 64, eager above,
against the same tiles with the input through registers): Mixtral M = 36 / 64 / 128 /
256 0.317 / 0.309 / 0.442 / 0.712 (0.807 in a second timing) against 0.333 / 0.381
(the 3-stage form then in the table) / 0.553 / 0.837, Qwen3-235B M = 256 0.618
against 0.667, Qwen3-30B-A3B M = 256 0.189 against 0.202, DeepSeek-V3 M = 288 2.49
against 2.56. Nsight Compute had shown the registers' form waiting on each step's
input loads (bench/TUNING.md, "The warpgroup kernel's input through its ring"). From
``INT4_FEW_PER_EXPERT`` + 1 to
``wgmma_max_per_expert`` pairs per expert, and in the decode row
(``wgmma_decode_row``: 9-16 pairs, ``wgmma_decode_tiles``). Measured on an H100
(bench/sweeps/probe_mma17_wgmma_h100.log for the form, probe_mma18_wgmma_ring_h100.log
and probe_mma19_wgmma_groups_h100.log for the ring; ms, eager, against the same kernel
with its words one step ahead in registers, the table's form before): Mixtral
M = 128 / 256 / 512 (32 / 64 / 128 pairs an expert) 0.559 / 0.885 / 1.509 against
0.629 / 0.965 / 1.603, Qwen3-235B M = 512 0.896 against 1.032, Qwen3-30B-A3B M = 512
0.282 against 0.309. One-step copy groups (2-4 stages) were 4-14% slower at 16 and 32
pairs an expert (Qwen3-30B-A3B M = 256 aside, where the 2-step form's two runs gave
0.311 and 0.203 ms; at 64 pairs, in the one run that had both, 1% faster: 0.874
against 0.887), 4-step ones slower than the 2-step ones everywhere (ties with the
registers' form at Mixtral M = 128 and 256)."""
WGMMA_BLOCK: Final = 32
WGMMA_MAX_PER_EXPERT: Final = 128
"""The most pairs per expert (ceiling average) at which experts of at least
``WGMMA_LARGE_EXPERT`` take the warpgroup kernel: measured faster there at Mixtral
M = 512 (1.509 ms with the ring, 1.594 without, against 1.774 for the Triton
nibble-halves GEMM, H100), the gain shrinking from 19% at 32 pairs. Above, up to the
dequant path, the nibble-halves GEMM stays. Measured at 32, 64 and 128; 17-31 are
taken as 32 (the GEMM it replaces there is the one it beat at 32)."""
WGMMA_MAX_PER_EXPERT_SMALL: Final = 80
"""The same bound for experts below ``WGMMA_LARGE_EXPERT``. Eager, ms, against the
nibble-halves GEMM it replaces (H100, bench/sweeps/probe_mma_set20_h100.log): at 80
pairs Qwen3-235B (M = 1280) 1.903 against 2.304, Qwen3-30B-A3B 0.533 against 0.697,
DeepSeek-V3 (M = 2560) 9.57 against 9.94; at 96 a tie on Qwen3-235B (2.414 against
2.419) and a loss on DeepSeek-V3 (12.55 against 10.46), at 112 both lost (2.83
against 2.51; 13.93 against 10.83), where Qwen3-30B-A3B still won (0.719 against
0.791). At 128 DeepSeek-V3 (M = 4096) lost too, 14.11 ms against 12.83 (H200, the
benchmark runs of a1942ca and 10df655)."""


def wgmma_large_expert(hidden: int, inter: int) -> bool:
    """Whether experts of these sizes have ``WGMMA_LARGE_EXPERT`` weights or more."""
    return hidden * inter >= WGMMA_LARGE_EXPERT


def wgmma_max_per_expert(hidden: int, inter: int) -> int:
    """The warpgroup kernel's most pairs per expert for experts of these sizes.

    ``WGMMA_MAX_PER_EXPERT`` for large ones (``wgmma_large_expert``), else
    ``WGMMA_MAX_PER_EXPERT_SMALL``.
    """
    large = wgmma_large_expert(hidden, inter)
    return WGMMA_MAX_PER_EXPERT if large else WGMMA_MAX_PER_EXPERT_SMALL


WGMMA_DECODE_MIN_PER_EXPERT: Final = 15
"""From this many pairs per expert the decode row takes the warpgroup kernel for every
expert size (``wgmma_decode_row``); experts of at least ``MMA_SHARED_INPUT_MAX_EXPERT``
from ``WGMMA_DECODE_EARLY_MIN_PER_EXPERT``. For the smaller experts, graph replay, ms,
two routing draws, the 16-row form against the ``mma.sync`` row with the input through
the ring (H100, bench/sweeps/probe_mma_set21_graph_h100.log): at 15 pairs Qwen3-235B
(M = 240) 0.601 / 0.602 against 0.638 / 0.643, Qwen3-30B-A3B 0.185 / 0.185 against
0.187 / 0.188; at 12 level or behind (0.563 / 0.558 against 0.556 / 0.558; 0.173 / 0.173
against 0.168 / 0.167), at 9 too (0.530 / 0.526 against 0.527 / 0.521; 0.157 / 0.157
against 0.154 / 0.154); 13 and 14 were not measured. At 16 (probe_mma18 and 19, the
same form against the same row): Qwen3-235B M = 256 0.639 / 0.640 against 0.689 /
0.706, Qwen3-30B-A3B 0.200 / 0.203 against 0.203-0.207."""
WGMMA_DECODE_WIDE_PER_EXPERT: Final = 16
"""At this many pairs per expert (the decode row's most, ``INT4_FEW_PER_EXPERT``)
experts of at least ``WGMMA_LARGE_EXPERT`` take ``WGMMA_BLOCK``-row blocks
(``wgmma_decode_row``); below, and for smaller experts, 16-row ones."""
WGMMA_DECODE_EARLY_MIN_PER_EXPERT: Final = 9
"""From this many pairs per expert (one past ``MMA_SMALL_BLOCK``) experts of at least
``MMA_SHARED_INPUT_MAX_EXPERT`` take the warpgroup kernel's 16-row blocks of
``WGMMA_TILES`` (``wgmma_decode_row``). Against the ``mma.sync`` row's 16-row blocks
of a 3-stage ring (H100, bench/sweeps/probe_mma_set21_h100.log; graph replay at
M <= 64, eager above, ms, two routing draws at Mixtral, one elsewhere): 18-24% less
time but for one Mixtral M = 60 draw (9%). Mixtral M = 36 / 48 / 60 (9,
12, 15 pairs an expert) 0.329 / 0.322 / 0.392 and 0.332 / 0.322 / 0.338 against
0.414 / 0.412 / 0.432 and 0.417 / 0.416 / 0.444 (32-row blocks of 3 stages, the form
then at 16 pairs, 0.364-0.378; all before the input ring); DeepSeek-V3 M = 288 / 384 /
480 2.50 / 2.66 / 3.01 against 3.30 / 3.45 / 3.68. Smaller experts keep the ``mma.sync`` row with the input through
the ring (Qwen3-235B M = 144 / 192 / 240 0.542 / 0.566 / 0.623 on the warpgroup kernel
against 0.535 / 0.567 / 0.659, Qwen3-30B-A3B 0.166 / 0.181 / 0.190 against 0.163 /
0.176 / 0.192: from 3% behind to 5% ahead, eager, one draw each, where the table run
twice drifted by up to 4%), up to ``WGMMA_DECODE_MIN_PER_EXPERT`` (replayed, it won
at 15 pairs only). The threshold reuses ``MMA_SHARED_INPUT_MAX_EXPERT``: no
expert size between Qwen3-235B's 2^22.6 and DeepSeek-V3's 2^23.8 was measured. At 8
pairs 16-row blocks of the warpgroup kernel tied the ``mma.sync`` row (16-row blocks
with the input through the ring; Mixtral M = 32, 0.331 against 0.327 ms) and at 4 lost
(M = 16, against its 8-row blocks: 0.316 against 0.303)."""
WGMMA_LARGE_EXPERT: Final = 1 << 25
"""``hidden * intermediate`` (Mixtral's 4096 x 14336) from which the decode row's
warpgroup tiles at ``WGMMA_DECODE_WIDE_PER_EXPERT`` pairs are ``WGMMA_BLOCK`` rows with
``WGMMA_DECODE_STAGES`` stages (below it, and at 9-15 pairs for every size that
takes the kernel there, ``WGMMA_DECODE_SMALL_BLOCK`` rows of ``WGMMA_TILES``), and
the warpgroup kernel goes up to ``WGMMA_MAX_PER_EXPERT`` pairs (below,
``WGMMA_MAX_PER_EXPERT_SMALL``). No expert
size between DeepSeek-V3's 2^23.8 and Mixtral's 2^25.8 was measured: the threshold
sits between them."""
WGMMA_DECODE_STAGES: Final = 2
"""Ring stages of the decode row for experts of at least ``WGMMA_LARGE_EXPERT`` (then
the form is ``WGMMA_TILES``'s). Mixtral M = 64 (16 pairs an expert), graph replay, ms,
two routing draws on an H100 with the input through the ring (probe_mma_set25):
2 stages 0.309 / 0.310 against 3 stages' 0.357 / 0.360 (3 stages there take 96 KB of
shared memory for w13, two programs a multiprocessor). Before the input ring
(probe_mma18 and 19, five draws): 3 stages 0.377-0.386 against 2 stages' 0.381-0.396,
the words-in-registers form 0.434-0.436."""
WGMMA_DECODE_SMALL_BLOCK: Final = 16
"""Row blocks of the decode row on the warpgroup kernel, but for experts of at least
``WGMMA_LARGE_EXPERT`` at 16 pairs (``wgmma_decode_row``; at 9-15 pairs:
``WGMMA_DECODE_EARLY_MIN_PER_EXPERT``). At 16 pairs an expert, for experts below
``WGMMA_LARGE_EXPERT`` (graph replay at M <= 64, eager above; ms, H100, probe_mma18
and 19, against the ``mma.sync`` row): Qwen3-235B M = 256 0.639 / 0.640 against
0.689 / 0.706 (32-row blocks 0.682 / 0.689); DeepSeek-V3 M = 512 3.162 against 3.764
(32 rows 3.166); Qwen3-30B-A3B M = 256 0.200 / 0.203 against 0.203-0.207."""
MMA_SMALL_BLOCK: Final = 8
"""Experts averaging at most this many pairs take 8-row blocks in ``MMA_TILES`` (from
``MMA_SHARED_INPUT_MIN_PER_EXPERT`` on, 16-row ones with the input through the ring);
more take 16-row blocks with the words read through a cp.async ring of
``MMA_RING_STAGES`` steps, one step a copy group (or, for small experts, the form with
the input through the ring)."""
MMA_RING_STAGES: Final = 3
MMA_SHARED_INPUT_MIN_PER_EXPERT: Final = 7
"""From this many pairs per expert (ceiling average) up to ``MMA_SMALL_BLOCK``, and
above it for experts of ``hidden * inter`` < ``MMA_SHARED_INPUT_MAX_EXPERT``, the decode
row takes 16-row blocks with the input through the ring (``GemmTiles.x_shared``; 2
stages of 2-step copy groups; 172 registers for the gated w13 instead of 227, offline
sm_90). Graph replay, ms, against the table before
(bench/sweeps/probe_mma_x_shared_h200.log, probe_mma_x_shared_rule_h200.log): Mixtral
M = 20 / 24 / 28 / 32 (5-8 pairs an expert) 0.274 / 0.279 / 0.283 / 0.289 against
0.252 / 0.278 / 0.283 / 0.322; DeepSeek-V3 M = 160 / 192 / 224 / 256 2.04 / 2.13 /
2.19 / 2.14 against 2.01 / 2.20 / 2.40 / 2.52; Qwen3-235B M = 96 / 128 (6 and 8)
0.447 / 0.462 against 0.449 / 0.531; 16 pairs an expert: Qwen3-235B M = 256 0.675
against 0.718, Qwen3-30B-A3B M = 256 0.195 against 0.219, but Mixtral M = 64 0.452
against 0.414. At <= 4 pairs an expert the 8-row form stays ahead (Mixtral M = 16
0.245 against 0.269). One run of each cell."""
MMA_SHARED_INPUT_MAX_EXPERT: Final = 1 << 23
MMA_MAX_STEPS: Final = 32
"""In 8-row blocks the w2 GEMM also splits K while its programs would run more than
this many 128-column steps (``mma_split_for``), and the w13 GEMM splits K in two
above it, or at it when its programs are fewer than ``MMA_W13_MIN_PROGRAMS``
(``mma_w13_split``)."""
MMA_W13_MIN_PROGRAMS: Final = 2 * 3 * NUM_SMS_H200
"""Two waves of the 8-row form's programs (3 a multiprocessor: 150 registers, 64 KB of
shared memory)."""
MMA_W13_SPLIT_MAX_PER_EXPERT: Final = 4
"""``mma_w13_split`` applies up to this many pairs per expert on average. DeepSeek-V3,
graph replay, ms (bench/sweeps/probe_mma_forms_split_h200.log): split 2 against 1,
1.813 vs 1.907 at M = 128 (4 per expert), but 3.056 vs 2.591 at M = 256 (8; 4 ways
2.631)."""


def mma_split_for(split: int, k: int) -> int:
    """``split`` (``split_for``'s) doubled while a split has > ``MMA_MAX_STEPS`` steps.

    At most 8 ways. Mixtral-8x7B's w2 (K = 14336, 112 steps) in 8-row blocks, graph
    replay, ms: split 2 against ``split_for``'s 1
    (bench/sweeps/probe_mma_copy_rule_h200.log) 0.251 vs 0.290 at M = 8, 0.297 vs 0.307
    at M = 16, 0.336 vs 0.373 at M = 32; then split 4 against 2
    (bench/sweeps/probe_mma_w13split_h200.log, L2 flushed by a read) 0.1455 vs 0.1491 at
    M = 2, 0.1994 vs 0.2150 at M = 4, 0.1804 vs 0.1966 at M = 8, 0.2414 vs 0.2431 at
    M = 16, 0.3426 vs 0.3445 at M = 32 (8 ways: within 2% of 4). Doubling the split of
    the other models' w2 (6-16 steps) cost 1-7%.
    """
    while -(-k // (split * 128)) > MMA_MAX_STEPS and split < 8:
        split *= 2
    return split


def mma_w13_split(k: int, programs: float) -> int:
    """K splits of the w13 GEMM in 8-row blocks: 2 or 1 (``MoETiles``).

    Two where its programs would run more than ``MMA_MAX_STEPS`` 128-column steps, or
    exactly that many while fewer than ``MMA_W13_MIN_PROGRAMS`` (``programs``: the
    expected busy experts times the column tiles). Graph replay, ms, L2 flushed by a
    read (bench/sweeps/probe_mma_w13split_h200.log), split 2 against 1, each with the
    w2 split of ``mma_split_for``: DeepSeek-V3 (56 steps) 0.745 vs 0.812 at M = 16,
    1.494 vs 1.603 at M = 64; Mixtral-8x7B (32 steps, 112 tiles an expert) 0.1346 vs
    0.1455 at M = 2 (3.3 busy experts), 0.1894 vs 0.1994 at M = 4 (5.3), 0.1746 vs
    0.1804 at M = 8 (7.0), but 0.2469 vs 0.2414 at M = 16 and 0.3533 vs 0.3426 at
    M = 32; Qwen3-235B-A22B (32 steps, 12 tiles) 0.1131 vs 0.1154 at M = 4, 0.2542 vs
    0.2586 at M = 16, 0.4080 vs 0.4010 at M = 64; Qwen3-30B-A3B (16 steps) 0.0913 vs
    0.0930 at M = 16, 0.1305 vs 0.1224 at M = 64. Four ways were slower than two
    wherever two won. The w13 split adds a launch (``launch_activate``).
    """
    steps = -(-k // 128)
    few = programs < MMA_W13_MIN_PROGRAMS
    return 2 if steps > MMA_MAX_STEPS or (steps == MMA_MAX_STEPS and few) else 1


def expected_busy_experts(num_pairs: int, num_experts: int) -> float:
    """Experts that ``num_pairs`` uniformly routed pairs reach, on average."""
    return num_experts * (1.0 - (1.0 - 1.0 / num_experts) ** num_pairs)


def mma_tiles(
    num_pairs: int,
    num_experts: int,
    per_expert: int,
    hidden: int,
    inter: int,
    *,
    split: int,
) -> MoETiles:
    """``int4_tiles``'s decode row on the Gluon kernel; ``split``: ``split_for``'s w2 split.

    8-row blocks of ``MMA_TILES`` up to ``MMA_SMALL_BLOCK`` pairs per expert, with the
    w2 split of ``mma_split_for`` and the w13 split of ``mma_w13_split``; 16-row blocks
    with the input through the ring from ``MMA_SHARED_INPUT_MIN_PER_EXPERT`` (past
    ``MMA_SMALL_BLOCK`` for small experts only), with the splits the form they replace
    would take; else 16-row blocks of a ``MMA_RING_STAGES``-stage ring, one step a copy.
    All with programmatic dependent launch (``MoETiles.pdl``: 1-3 us a layer,
    bench/sweeps/probe_pdl_edges_h200.log).
    """
    small = per_expert <= MMA_SMALL_BLOCK
    split13 = 1
    if small:
        split = mma_split_for(split, inter)
        if per_expert <= MMA_W13_SPLIT_MAX_PER_EXPERT:
            tiles13 = -(-inter // MMA_TILES.block_n)  # gated: gate and up rows
            busy = expected_busy_experts(num_pairs, num_experts)
            split13 = mma_w13_split(hidden, busy * tiles13)
    shared = per_expert >= MMA_SHARED_INPUT_MIN_PER_EXPERT and (
        small or hidden * inter < MMA_SHARED_INPUT_MAX_EXPERT
    )
    if shared:
        form, block_m = attrs.evolve(MMA_TILES, x_shared=True), 16
    elif small:
        form, block_m = MMA_TILES, MMA_SMALL_BLOCK
    else:
        form = attrs.evolve(MMA_TILES, num_stages=MMA_RING_STAGES, copy_steps=1)
        block_m = 16
    return MoETiles(
        block_m=block_m,
        w13=attrs.evolve(form, split_k=split13),
        w2=attrs.evolve(form, split_k=split),
        pdl=True,
    )


def wgmma_tiles(*, split: int, pdl: bool) -> MoETiles:
    """``WGMMA_TILES`` in ``WGMMA_BLOCK``-row blocks, w13 unsplit, w2 ``split`` ways.

    Measured against the table on an H100 (graph replay at M <= 64, eager above, ms,
    bench/sweeps/probe_mma17_wgmma_h100.log, with the words in registers): Mixtral
    M = 128, 256, 512 0.624, 0.898, 1.594 vs 0.774, 1.036, 1.774; Qwen3-235B M = 512
    1.028 vs 1.218; Qwen3-30B-A3B M = 512 0.309 vs 0.368; DeepSeek-V3 M = 1024 5.16 vs
    5.32 (the ring's gains on top: ``WGMMA_TILES``).
    """
    return MoETiles(
        block_m=WGMMA_BLOCK,
        w13=WGMMA_TILES,
        w2=attrs.evolve(WGMMA_TILES, split_k=split),
        pdl=pdl,
    )


def wgmma_decode_tiles(*, split: int, large: bool) -> MoETiles:
    """The decode row's two forms on the warpgroup kernel (``wgmma_decode_row``).

    ``large``: ``WGMMA_BLOCK``-row blocks of a ``WGMMA_DECODE_STAGES``-stage ring; else
    ``WGMMA_DECODE_SMALL_BLOCK``-row blocks of ``WGMMA_TILES``. w13 unsplit, w2
    ``split`` ways (the decode row's), with programmatic dependent launch, as the
    ``mma.sync`` row they replace.
    """
    form, block = WGMMA_TILES, WGMMA_DECODE_SMALL_BLOCK
    if large:
        form = attrs.evolve(WGMMA_TILES, num_stages=WGMMA_DECODE_STAGES)
        block = WGMMA_BLOCK
    return MoETiles(
        block_m=block, w13=form, w2=attrs.evolve(form, split_k=split), pdl=True
    )


def wgmma_decode_row(
    per_expert: int, hidden: int, inter: int, *, split: int
) -> MoETiles | None:
    """The decode row on the warpgroup kernel, or ``None`` where ``mma.sync`` stays.

    From ``WGMMA_DECODE_MIN_PER_EXPERT`` pairs per expert (``per_expert``: the ceiling
    average, at most ``INT4_FEW_PER_EXPERT`` here) for every expert size, from
    ``WGMMA_DECODE_EARLY_MIN_PER_EXPERT`` for experts of at least
    ``MMA_SHARED_INPUT_MAX_EXPERT``. The 32-row form of ``wgmma_decode_tiles`` only
    at ``WGMMA_DECODE_WIDE_PER_EXPERT`` and for experts of at least
    ``WGMMA_LARGE_EXPERT`` (``wgmma_large_expert``); else its 16-row form.
    """
    early = hidden * inter >= MMA_SHARED_INPUT_MAX_EXPERT
    first = WGMMA_DECODE_EARLY_MIN_PER_EXPERT if early else WGMMA_DECODE_MIN_PER_EXPERT
    if per_expert < first:
        return None
    wide = per_expert >= WGMMA_DECODE_WIDE_PER_EXPERT
    return wgmma_decode_tiles(
        split=split, large=wide and wgmma_large_expert(hidden, inter)
    )
