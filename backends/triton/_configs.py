"""Tile configurations of the fused-MoE kernels, per shape class, and the path rules.

Measured on one NVIDIA H200 (torch 2.11, triton 3.6, from 2026-12-02; the Hopper
warpgroup kernel's rows on an H100) with
``bench/sweep_tiles.py`` and the probes beside it; bench/TUNING.md has the numbers and
bench/sweeps/ the raw logs. The int4 decode row on the Gluon kernel is in
``_configs_mma.py``, the tile objects in ``_tiles.py``; this module imports only stdlib,
attrs and those two. ``INTERPRETER`` keeps CPU tests small and fast.
"""

import functools
from typing import Final

import attrs

from backends.triton._configs_mma import (
    mma_tiles,
    wgmma_decode_row,
    wgmma_max_per_expert,
    wgmma_tiles,
)
from backends.triton._tiles import (
    NUM_SMS_H200 as NUM_SMS_H200,
    GemmTiles,
    GemvTiles,
    MoETiles,
)

INTERPRETER: Final = MoETiles(
    block_m=16,
    w13=GemmTiles(block_n=32, block_k=64),
    w2=GemmTiles(block_n=32, block_k=32, split_k=2),
)
"""CPU interpreter: small tiles; split-K 2 so its reduction path is tested too."""


GEMV_FEW: Final = GemvTiles(block_n=16, block_k=512)
"""Decode GEMV on bytes, for int4 weights that are not whole aligned int32 words
(``int4_words_fit``: K or the group not a multiple of 8); there ``use_gemv`` allows at
most ``GEMV_FEW_PAIRS`` pairs. Before the half2 word GEMV this also served <= 8 pairs
of small experts (M = 1: 0.071 ms vs 0.075 for 32 x 256 on Qwen3-235B, H200)."""
GEMV_PAIRED_FEW: Final = GemvTiles(
    block_n=8, block_k=512, num_warps=1, words=True, paired=True, prefetch=True,
    pdl=True, int_dot=True,
)  # fmt: skip
"""Decode GEMV on int32 words, two words of a group per float16 chain
(``_kernels_gemv_pairs.py``), 8 rows, each step's words, scales and inputs loaded one
step ahead, with programmatic dependent launch: for grids that do not fill the GPU
(``pick_gemv_tiles``; of the measured shapes only Qwen3-30B-A3B at M = 1, 768 w13
programs). H200, graph replay of the whole layer, ms
(``bench/sweeps/sweep_words_tma_mix_h200.log``): Qwen3-30B-A3B M = 1 0.0200-0.0202
against 0.0210 for the TMA tiles with this w2, 0.0248 for ``GEMV_PAIRED``. Earlier
sweeps: ``sweep_words_paired_h200.log`` (paired against one word a chain; 16 x 256,
8 x 1024 slower), ``sweep_words_pdl_h200.log`` (``pdl``: 0.0199 against
0.0216-0.0220). A persistent grid (``sweep_words_persistent_h200.log``, the tree of
a6a820a) and a streamed one (``sweep_words_stream_h200.log``, commit e733cbb) were
slower in every cell but a tie or two. Products in integers (``int_dot``, both
GEMVs; ``bench/sweeps/probe_int_dot_h100.log``, H100, graph replay): Qwen3-30B-A3B
M = 1 0.0191 against 0.0199 ms in float16 chains."""
GEMV_PAIRED: Final = GemvTiles(
    block_n=8, block_k=512, num_warps=1, words=True, paired=True, pdl=True, tma=True,
    loop_stages=3, int_dot=True, inputs_ahead=True, w2_tiles=attrs.evolve(
        GEMV_PAIRED_FEW, block_n=16, prefetch=False, tma=True, loop_stages=3,
        inputs_ahead=True,
    ),
)  # fmt: skip
"""The paired decode GEMV reading its weight words by TMA (``GemvTiles.tma``: one
``[rows, 512 / 8]`` bulk copy per matrix and step, Triton-pipelined 3 stages deep
through shared memory, so the gated w13 step holds 96 registers instead of 255 with
loads in registers one step ahead): w13 8 x 512, w2 16 x 512 (``w2_tiles``), both with
programmatic dependent launch; wherever the grid fills the GPU (``pick_gemv_tiles``).
H200, graph replay of the whole layer, ms (``bench/sweeps/sweep_words_tma_mix_h200.log``;
the previous table, ``GEMV_PAIRED_FEW`` up to 8 pairs and 16 x 512 without TMA past
them, in brackets): Mixtral M = 1 0.0843 (0.0833), M = 4 0.247 (0.272); Qwen3-30B-A3B
M = 4 0.0457 (0.0480), M = 16 0.117 (0.126); Qwen3-235B M = 1 0.0428 (0.0472), M = 4
0.109 (0.123), M = 16 0.360 (0.416); DeepSeek-V3 M = 1 0.0731 (0.0822), M = 4 0.224
(0.255), M = 16 0.795 (0.910). 8 rows on both was within 6% of it (1-4% faster at
Mixtral M = 4 and Qwen3-235B M = 1), 16 rows on both up to 11% slower; TMA on w13
alone (w2 as ``GEMV_PAIRED_FEW``) was 1-2% faster at M = 1 of Mixtral and Qwen3-235B
and up to 16% slower elsewhere, on w2 alone slower in 11 of 12 cells. Boxes of
32-byte rows (a 4-D view giving each half of a group in its own copy; commit 762aaec,
``sweep_words_tma_h200.log``) were 1.04-1.28x slower than the table. Where TMA does not
apply (``tma_fit``, ``tma_target``) the same tiles run plain, unpipelined loads.
Products in integers (``int_dot``, both GEMVs; ``_kernels_gemv_ints.py``: 616 SASS
a gated step against 824 offline under Triton 3.6) took, on an H100 (graph
replay, ms, ``bench/sweeps/probe_int_dot_h100.log``; float16 chains in brackets):
Mixtral M = 1 / 4 0.0836 / 0.2246 (0.0870 / 0.2344); Qwen3-30B-A3B M = 4 0.0428
(0.0459); Qwen3-235B M = 1 / 4 0.0407 / 0.1113 (0.0434 / 0.1157); DeepSeek-V3 M = 1 /
4 0.0810 / 0.2519 (0.0813 / 0.2593); faster or level in all 12 GEMV cells measured
(M = 1, 4 and 16 of the four models), on w13 and w2 each, most on both. Scales,
zero points and inputs a step ahead in registers (``inputs_ahead``, both GEMVs; the
words still come through the TMA pipeline) took, on an H100 (graph replay, ms, two
routing draws, each form timed twice; ``bench/sweeps/probe_int_dot_set6_ahead_h100.log``;
without it in brackets): Mixtral M = 1 0.0772-0.0778 (0.0841-0.0847); Qwen3-235B
M = 1 0.0384-0.0389 (0.0412-0.0413), M = 4 0.1094-0.1121 (0.1142-0.1169);
DeepSeek-V3 M = 1 0.0769-0.0776 (0.0812-0.0819), M = 4 0.2400-0.2620
(0.2437-0.2669); Qwen3-30B-A3B M = 4 0.0415-0.0421 (0.0442-0.0451): faster in every
cell, 1.6-8%; ahead on w13 alone or w2 alone gained less, but for DeepSeek-V3, where
w2 alone gained as much and w13 alone nothing."""
GEMV_16BIT: Final = GemvTiles(block_n=8, block_k=256, num_warps=2)
"""Decode GEMV on 16-bit weights (triton-emulation): <= ``GEMV_FEW_PAIRS`` pairs of
experts below ``GEMV_16BIT_MAX_EXPERT``, <= ``GEMV_16BIT_TINY_PAIRS`` below
``GEMV_16BIT_TINY_EXPERT`` (``use_gemv``). Three launches instead of the grouped GEMM's
five (no alignment): at M = 1 (bench/sweeps/probe_emulation_gemv_h200.log, ms)
Qwen3-30B-A3B eager 0.063 vs 0.152 for the GEMM, graph-replayed 0.044 vs 0.042;
Qwen3-235B eager 0.141 vs 0.190, replayed 0.107 vs 0.098. Larger experts stay on the
GEMM, faster there both ways (Mixtral 0.188 vs 0.211-0.231 replayed, DeepSeek-V3 0.188
vs 0.195-0.273). Of 16 x 128, 32 x 128, 16 x 256 (4 warps) and 8 x 256 (2 warps) this
was fastest replayed on the three 128- and 256-expert models."""
GEMV_16BIT_MAX_EXPERT: Final = 1 << 23
"""``hidden * intermediate`` below which triton-emulation takes the 16-bit GEMV
(``GEMV_16BIT``): Qwen3-235B (6.3 M) and Qwen3-30B-A3B (1.6 M); Mixtral (58.7 M) and
DeepSeek-V3 (14.7 M) keep the GEMM."""
GEMV_16BIT_TINY_EXPERT: Final = 1 << 21
"""``hidden * intermediate`` below which triton-emulation's 16-bit GEMV takes up to
``GEMV_16BIT_TINY_PAIRS`` pairs (Qwen3-30B-A3B, 1.6 M). H100, c91bab4
(bench/sweeps/probe_emulation_gemv_c91bab4_h100.log, ms replayed / eager, the GEMV in
``GEMV_16BIT``'s tiles, its "8x256 w2" row, against the GEMM): Qwen3-30B-A3B M = 2
(16 pairs) 0.068 / 0.081 against 0.066 / 0.154 (the GEMV's three launches against the
GEMM's five); M = 4 0.102 / 0.114 against 0.099 / 0.112 and M = 8 0.177 / 0.188
against 0.168 / 0.181, so the GEMM keeps those. Qwen3-235B (6.3 M) lost 2-7% both
ways at M = 1-4 on this host (7-11% at 8-16), where the H200's probe had it 26% less
time eager at M = 1: it keeps ``GEMV_FEW_PAIRS``."""
GEMV_16BIT_TINY_PAIRS: Final = 16
GEMV_FEW_PAIRS: Final = 8
GEMV_MAX_PAIRS: Final = 128
ALIGN_ONE_LAUNCH_MAX_PAIRS: Final = 2048
"""Up to this many routed pairs the alignment is one launch whose programs each count
every expert's pairs; above, a count launch first. H200, graph replay
(``bench/probe_align.py``, ``sweeps/probe_align_h200.log``), alignment alone: one
launch 4.9-6.7 us against 6.4-8.2 up to 512 pairs, 9.1-10.3 against 9.8-10.5 at 2048
(DeepSeek-V3's a tie), slower from 8192 (22.1-24.1 against 19.2-20.9; 78-83 against
57-62 at 32768). Whole layers on the gemm path at M = 4-64: 1.5-2.4 us faster in 7
of 9 cells, the other two within the spread of two replays of one form."""
GEMV_MAX_PAIRS_MMA: Final = 64
"""``use_gemv`` takes the GEMV up to ``GEMV_FEW_PAIRS`` routed pairs (and <= one per two
experts; 16-bit experts below ``GEMV_16BIT_TINY_EXPERT`` up to
``GEMV_16BIT_TINY_PAIRS``); where w13 reads as int32 words (``int4_words_fit``) up to
``GEMV_MAX_PAIRS`` at <= one per expert, and up to ``GEMV_MAX_PAIRS_MMA`` at <= one per
two experts where the Gluon decode GEMM runs (``mma_runs``): the pair-major GEMV reads
an expert once per pair routed to it, the GEMM once per row block. Against that
kernel's 8-row form with copy groups (bench/sweeps/probe_mma_copy_rule_h200.log, graph
replay, ms, GEMV vs GEMM): at 128 pairs (M = 16) the GEMM won or tied (Qwen3-235B
0.360 vs 0.274,
Qwen3-30B-A3B 0.117 vs 0.103, DeepSeek-V3 0.790 vs 0.778); at 64 (M = 8) DeepSeek-V3
0.413 vs 0.436, Qwen3-30B-A3B 0.068 vs 0.069, Qwen3-235B 0.195 vs 0.186; at 32 and
below the GEMV won on the 128- and 256-expert models by 10-50%. Mixtral at M = 4 (8
pairs on 8 experts) took 0.236 vs 0.225 with the table's w2 split
(probe_mma_narrow_tiles_h200.log; 0.233 vs 0.228 in the run before), at M = 1 (2
pairs) 0.084 vs 0.088. Before that kernel: the paired GEMV against the GEMM at one
pair per expert (M = 16 of the 128-expert models;
bench/sweeps/sweep_words_paired_h200.log, ms, graph replay, one run):
Qwen3-235B 0.417 vs 0.502, Qwen3-30B-A3B 0.127 vs 0.147. The one-word kernel before it
only tied there in a sweep and lost in a benchmark run (Qwen3-235B 0.479 vs 0.436;
``sweeps/bench_h200_22b8951.log``), so that rule stopped at one pair per two experts.
The word GEMV at 64 and 128 pairs and <= one per two experts
(bench/sweeps/sweep_words_m8_16_h200.log): DeepSeek-V3 M = 8 / 16 0.559 / 1.073 vs
0.783 / 1.278; Qwen3-235B M = 8 0.258 vs 0.326, Qwen3-30B-A3B 0.082 vs 0.098. Past
128 pairs, and expert counts between 8 and 128, not measured. Byte GEMV against the
swapped nibble-halves GEMM (bench/sweeps/sweep_operands_round2_h200.log): at M = 1 the
GEMV was faster on all four model shapes (Mixtral 0.135 vs 0.144 ms, Qwen3-235B 0.073 vs
0.082, DeepSeek-V3 0.136 vs 0.142, Qwen3-30B 0.029 vs 0.038); at M = 4 (32 pairs) the
GEMM won on Qwen3-235B and DeepSeek-V3, and the word GEMV then beat both; at M = 16 (128
pairs) the byte GEMV lost to the GEMM on DeepSeek-V3 by 1.3x (1.34 vs 1.72). One pair
per expert (8 experts, Mixtral, bench/sweeps/sweep_words_round2_mixtral_h200.log and
sweep_words_mixtral_m2_8_h200.log): the word GEMV at M = 3 / 4 took 0.239 / 0.300 ms
against the GEMM's 0.291 / 0.382; at M = 6 and 8 (1.5 and 2 pairs per expert) the GEMM
won (0.340 vs 0.424, 0.431 vs 0.559)."""
GEMV_WIDE_GPUS: Final = ("H100 80GB HBM3",)
GEMV_WIDE_MIN_EXPERTS: Final = 128
GEMV_WIDE_PAIRS_PER_EXPERT: Final = 0.75
GEMV_WIDE_MAX_PAIRS: Final = 256
"""On the GPUs named here (a substring of the device's name: the H100 SXM measured,
not its PCIe or NVL forms) and for at least ``GEMV_WIDE_MIN_EXPERTS`` experts of
groups of two words or more (where the GEMV runs the paired kernel's integer
products), ``use_gemv`` takes the GEMV where the Gluon GEMM runs up to this many pairs
a expert (rounded down), and at most ``GEMV_WIDE_MAX_PAIRS`` (the most measured),
instead of ``GEMV_MAX_PAIRS_MMA`` at one per two. With integer products the GEMV was
the faster there in most draws (the second Qwen3-235B one below lost) on an H100
(bench/sweeps/probe_int_dot_set3_h100.log, graph replay, ms, two routing draws, GEMV
against the table): DeepSeek-V3 M = 12 / 16 / 24 / 32 (96-256
pairs) 0.613 / 0.737 / 1.039 / 1.387 against 0.706 / 0.831 / 1.143 / 1.497 (6-13% in
all eight draws); Qwen3-30B-A3B M = 12 (96 pairs) 0.087 / 0.086 against 0.100 / 0.099,
Qwen3-235B 0.257 / 0.248 against 0.288 / 0.242; at M = 16 (128 pairs) the 128-expert
models were level (-3% to +7%), past it the GEMM won (Qwen3-235B M = 24 0.464 against
0.374). Mixtral (8 experts) is left out: at M = 4 the GEMV won on one draw (0.222
against 0.236) and lost on the other (0.213 against 0.160). On the H200 the GEMM is
the faster side (it scales with the bandwidth, the GEMV hardly does: Qwen3-235B M = 16
GEMM 0.238 ms in its record against 0.310-0.338 on the H100), so it keeps the rule
above until measured."""
GEMV_BY_DEFAULT: Final = True
"""Whether ``auto`` takes the decode GEMV where ``use_gemv`` allows it."""
GEMV_INTERPRETER: Final = GemvTiles(block_n=16, block_k=64)
"""Decode GEMV in the CPU interpreter: small tiles, several steps and groups per step."""
DEQUANT_PAIRS_PER_EXPERT: Final = 256
"""From this many routed pairs per expert on, triton-w4a16 dequantizes a chunk of
experts to 16 bits and runs the 16-bit grouped GEMM on it instead of dequantizing in
registers (which repeats the work for every row block). M = 4096: Mixtral 6.9 vs
12.1-13.6 ms, Qwen3-235B 5.9 vs 7.7 ms; M = 1024 at 64 pairs per expert (Qwen3-235B)
the in-register GEMM still won (2.6 vs 3.9 ms), and at 128 (DeepSeek-V3, M = 4096) the
two tied (20.8 vs 20.0 ms)."""
DEQUANT_SCRATCH_BYTES: Final = 1 << 30
"""Bound of that path's 16-bit scratch buffer; it always holds at least one expert."""
DEQUANT_BLOCK_R: Final = 64
DEQUANT_BLOCK_K: Final = 128
DEQUANT_WARPS: Final = 4
"""That path's dequant kernel: tiles of rows x columns (powers of two), warps. On an
H100 (``bench/probe_dequant.py``, 2026-12-05) this tile wrote at 0.93-0.95 of the
copy rate as bytes and as words, the best tile of each matrix 1-3% faster (a different
one each), tiles of 8-16 or 128 codes a thread up to 30% slower: the tile the kernel
had before stays, and so does its byte form: the int32-word form (``dequantize_experts``'
``words=True``, inline PTX) tied it in the kernel alone but took 3-6% longer in
Mixtral's M = 4096 layer in both calls that timed it. On the H200 (same probe, tree of
10df655) this tile wrote at 0.87-0.90 of the copy rate and the word tiles at 0.82-0.95;
in whole layers words were 0-3% faster except Mixtral M = 4096, 4-6% slower, as on
the H100: the byte form stays."""


def next_pow2(x: int) -> int:
    """The smallest power of two >= ``x`` (1 for ``x <= 1``), in host integers."""
    return 1 << max(0, (x - 1).bit_length())


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for host integers (``triton.cdiv`` costs microseconds a call)."""
    return -(-a // b)


def split_for(tiles_out: int, k: int, block_k: int) -> int:
    """Split K until about two waves of programs fill the GPU (decode only)."""
    split = 1
    while tiles_out * split < 2 * NUM_SMS_H200 and k // (split * 2) >= 4 * block_k:
        split *= 2
    return min(split, 8)


GEMV_PROGRAMS_PER_SM: Final = 8
"""The w2 GEMV splits K until it has this many programs per SM (``gemv_split_for``)."""
GEMV_MAX_STEPS: Final = 8
"""The w2 GEMV also splits K while its programs have more than this many steps
(``gemv_split_for``)."""
GEMV_MAX_SPLIT: Final = 8
"""``gemv_split_for`` splits K at most this many ways (the sweeps measured 2, 4, 8)."""


def gemv_split_for(programs: int, k: int, block_k: int) -> int:
    """K splits of the w2 GEMV: for few programs or long ones, >= 2 steps each.

    Doubles the split while the programs are fewer than ``GEMV_PROGRAMS_PER_SM`` per
    SM or have more than ``GEMV_MAX_STEPS`` steps, as long as each split keeps >= 2
    steps; at most ``GEMV_MAX_SPLIT``.

    Mixtral-8x7B at M = 1 has 512 programs of 28 steps; split 4 took its w2 GEMV from
    64 to 50 us (H100, bench/sweeps/probe_gemv_h100_split_words_tc.log). At M = 4 it
    has 2048 programs, still of 28 steps: split 4 took the layer from 0.2485 to 0.2330
    ms (H200, graph replay, ``GEMV_PAIRED``; split 8 0.2307, 2 0.2370;
    bench/sweeps/sweep_words_w2_split_h200.log). The other model shapes have w2
    reductions of 2-4 steps and >= 2048 programs at M = 1, and keep one split: in that
    sweep a forced split of 2 cost Qwen3-235B and DeepSeek-V3 1-4.5% at M = 1 and 4,
    4 and 8 up to 47%.
    """
    split = 1
    target = GEMV_PROGRAMS_PER_SM * NUM_SMS_H200
    while (
        (programs * split < target or ceil_div(k, split * block_k) > GEMV_MAX_STEPS)
        and split < GEMV_MAX_SPLIT
        and k // (2 * split) >= 2 * block_k
    ):
        split *= 2
    return split


SIXTEEN_BIT_MIN_PAIRS: Final = 512
"""16-bit weights take ``sixteen_bit_prefill_tiles`` from this many routed pairs (and
more than 8 per expert): the classes the emulation sweep measured (M >= 256)."""


PREFILL_GROUP_M: Final = 8
"""Launch order of the prefill tiles (``GemmTiles.group_m``): 8 row blocks across all
column tiles, then the next 8, so a wave's input rows stay in L2. From ``sweep_tiles.py
group`` (H200, bench/sweeps/sweep_group_h200.log), M = 4096 against the old order (0):
bf16 weights Mixtral 5.57 vs 6.23 ms (``torch._grouped_mm`` 5.96), Qwen3-235B 3.02 vs
3.32, DeepSeek-V3 8.45 vs 9.47; int4 in registers DeepSeek-V3 13.0 vs 13.6 (M = 1024
5.36 vs 5.55); Qwen3-30B within noise. 32 was sometimes much slower."""


def sixteen_bit_prefill_tiles(per_expert: int) -> MoETiles:
    """GEMM tiles for 16-bit weights (triton-emulation, the dequant path) at prefill.

    From ``sweep_tiles.py emulation`` (H200, bench/sweeps/sweep_emulation_h200.log):
    128-row blocks of 128 x 64, 8 warps, 3 stages from 64 pairs per expert (Mixtral
    M = 1024 1.74 vs 1.93 ms for 64-row blocks, Qwen3-235B M = 1024 1.53 vs 1.87,
    DeepSeek-V3 M = 4096 10.3 vs 11.4), the ungated w2 GEMM 256 columns wide
    (``sweep_emulation2_h200.log``: Mixtral M = 1024 1.58 vs 1.76 ms, M = 4096 5.42 vs
    5.56, Qwen3-235B M = 4096 2.94 vs 3.02, DeepSeek-V3 M = 4096 8.45 vs 8.66); 64 x 256
    at 32-63 (DeepSeek-V3 M = 1024 6.05 vs 7.07); 32-row blocks, 4 warps, 4 stages
    below (Qwen3-30B M = 256 0.34 vs 0.48). All in ``PREFILL_GROUP_M`` launch order.
    """
    if per_expert >= 64:
        tiles = GemmTiles(
            block_n=128, block_k=64, num_warps=8, num_stages=3, group_m=PREFILL_GROUP_M
        )
        return MoETiles(block_m=128, w13=tiles, w2=attrs.evolve(tiles, block_n=256))
    if per_expert >= 32:
        tiles = GemmTiles(
            block_n=256, block_k=64, num_warps=8, num_stages=3, group_m=PREFILL_GROUP_M
        )
        return MoETiles(block_m=64, w13=tiles, w2=tiles)
    tiles = GemmTiles(
        block_n=128, block_k=64, num_warps=4, num_stages=4, group_m=PREFILL_GROUP_M
    )
    return MoETiles(block_m=32, w13=tiles, w2=tiles)


@functools.lru_cache(maxsize=1024)
def choose_tiles(
    *,
    num_pairs: int,
    num_experts: int,
    hidden_size: int,
    intermediate_size: int,
    sixteen_bit: bool = False,
    mma: bool = False,
    wgmma: bool = False,
) -> MoETiles:
    """Tiles for one forward; pure over the (host-known) sizes, so cached per sizes.

    ``sixteen_bit``: the GEMMs read 16-bit weights (triton-emulation, or the dequant
    path's scratch) and take ``sixteen_bit_tiles``; int4 weights take
    ``int4_tiles``. ``mma``: the Gluon MMA kernel can run (``GemmTiles.mma``: a CUDA
    sm_80+ device and weights of whole int32 words), so the int4 decode row takes
    ``MMA_TILES``; ``wgmma``: the warpgroup kernel runs too (Hopper), so
    ``int4_tiles`` takes ``wgmma_tiles`` where they were faster.
    """
    per_expert = -(-num_pairs // num_experts)
    if sixteen_bit:
        return sixteen_bit_tiles(
            num_pairs, num_experts, per_expert, hidden_size, intermediate_size
        )
    return int4_tiles(
        num_pairs, num_experts, per_expert, hidden_size, intermediate_size,
        mma=mma, wgmma=mma and wgmma,
    )  # fmt: skip


INT4_FEW_PER_EXPERT: Final = 16
"""Up to this many routed pairs per expert the int4 GEMM takes the decode row (on
Hopper, every expert takes the warpgroup kernel at 16: ``int4_tiles``)."""
INT4_LARGE_EXPERT: Final = 1 << 22
"""``hidden * intermediate`` from which the decode row's blocks grow to 32 rows when
experts average more than 8 pairs (``int4_tiles``)."""


def int4_tiles(
    num_pairs: int,
    num_experts: int,
    per_expert: int,
    hidden: int,
    inter: int,
    *,
    mma: bool = False,
    wgmma: bool = False,
) -> MoETiles:
    """The in-register int4 GEMM; the dequantized tile is the dot's register operand.

    From ``sweep_tiles.py operands`` (H200, bench/sweeps/sweep_operands_*.log),
    swapped operands with nibble halves (low and high nibbles dotted as two halves
    against a K-permuted input) beat the unswapped interleaved tile at every measured
    size, 10-22% at decode and up to 1.5x at prefill (DeepSeek-V3 M = 4096 13.8 vs
    20.7 ms). Up to ``INT4_FEW_PER_EXPERT`` pairs per expert (decode): 64 x 128
    tiles read as int32 words (``GemmTiles.int4_words``), 16-row blocks (32 for
    large experts averaging more than 8 pairs), w2 split-K to about two waves.
    Above: 64-row blocks of 128 x 64 with nibble halves, in ``PREFILL_GROUP_M``
    order. ``bench/probe_decode.py`` (bench/sweeps/probe_decode_h200.log, ms):
    words against halves 0.338 vs 0.359 (Mixtral M = 4), 0.068 vs 0.075
    (Qwen3-30B M = 4), within 1% at M = 16-256 except Mixtral M = 64 (0.676 vs
    0.650), where 32-row blocks of words take 0.518 (Qwen3-235B M = 256: 0.878 vs
    1.024; but Qwen3-30B M = 256: 0.417 vs 0.288, hence ``INT4_LARGE_EXPERT``); at
    prefill words lost (DeepSeek-V3 M = 1024 6.20 vs 5.40).

    With ``mma`` the decode row runs the Gluon kernel (``MMA_TILES``, 128 x 128, 4
    warps) in 8-row blocks up to ``MMA_SMALL_BLOCK`` pairs per expert (but see
    ``MMA_SHARED_INPUT_MIN_PER_EXPERT`` below), the words
    through a 2-stage cp.async ring of 2-step copy groups and the w2 split also by
    ``mma_split_for``, the w13 split by ``mma_w13_split`` (up to
    ``MMA_W13_SPLIT_MAX_PER_EXPERT`` pairs per expert); else in 16-row blocks with
    a 3-stage ring of one step a group, the w2 split as before; from
    ``MMA_SHARED_INPUT_MIN_PER_EXPERT`` pairs per expert (past ``MMA_SMALL_BLOCK``
    only for experts below ``MMA_SHARED_INPUT_MAX_EXPERT``) in 16-row blocks of
    ``MMA_TILES`` with the input through the ring, the splits as the form it
    replaces would take them (a w13 split lost
    there: Mixtral M = 64 0.455 vs 0.416 ms, Qwen3-235B M = 256 0.792 vs 0.719;
    bench/sweeps/probe_mma_forms_split_h200.log). The copy groups read each row's
    64-byte pieces of two steps back to back (bench/sweeps/probe_mma_copy_h200.log
    and probe_mma_copy_rule_h200.log, graph replay, ms, against the one-step
    registers form): DeepSeek-V3 M = 64 1.65 vs 2.06, Qwen3-235B M = 64 0.40 vs 0.52,
    Mixtral M = 16 0.30 vs 0.35; in 16-row blocks they lost (Mixtral M = 64 0.44 vs
    0.42). Before them (``bench/probe_mma.py``, graph replay, ms, against the word
    GEMM above (bench/sweeps/probe_mma2_h200.log): DeepSeek-V3
    M = 64 2.06 vs 2.82, Qwen3-235B M = 64 0.52 vs 0.70, Mixtral M = 16 0.36 vs
    0.47, Qwen3-30B-A3B M = 64 0.14 vs 0.21; the ring in 16-row blocks
    (probe_mma4_h200.log) against registers: Mixtral M = 64 0.42 vs 0.44,
    Qwen3-235B M = 256 0.73 vs 0.81, DeepSeek-V3 M = 256 2.67 vs 2.79 (the word
    GEMM: 0.52, 0.88, 3.27). In 8-row blocks the ring was 1-4% faster than the
    registers' 16-byte loads but slower than their 8-byte ones of probe_mma3.

    With ``wgmma`` (Hopper) the warpgroup kernel's ``wgmma_tiles`` take the sizes
    past ``INT4_FEW_PER_EXPERT`` pairs per expert up to ``wgmma_max_per_expert``, and
    its ``wgmma_decode_row`` the decode row from ``WGMMA_DECODE_MIN_PER_EXPERT`` (from
    ``WGMMA_DECODE_EARLY_MIN_PER_EXPERT`` for experts of at least
    ``MMA_SHARED_INPUT_MAX_EXPERT``).
    """
    few = per_expert <= INT4_FEW_PER_EXPERT
    if wgmma and not few and per_expert <= wgmma_max_per_expert(hidden, inter):
        return wgmma_tiles(split=1, pdl=False)
    if few:
        w2_out = min(num_experts, num_pairs) * -(-hidden // 64)
        split = split_for(w2_out, inter, 128)
        if wgmma and (row := wgmma_decode_row(per_expert, hidden, inter, split=split)):
            return row
        if mma:
            return mma_tiles(
                num_pairs, num_experts, per_expert, hidden, inter, split=split
            )
        tiles = GemmTiles(
            block_n=64, block_k=128, num_warps=4, num_stages=4, swap_ab=True,
            int4_words=True,
        )  # fmt: skip
        large = per_expert > 8 and hidden * inter >= INT4_LARGE_EXPERT
        return MoETiles(
            block_m=32 if large else 16,
            w13=tiles,
            w2=attrs.evolve(tiles, split_k=split),
        )
    tiles = GemmTiles(
        block_n=128, block_k=64, num_warps=4, num_stages=3, swap_ab=True,
        nibble_halves=True, group_m=PREFILL_GROUP_M,
    )  # fmt: skip
    return MoETiles(block_m=64, w13=tiles, w2=tiles)


def sixteen_bit_tiles(
    num_pairs: int, num_experts: int, per_expert: int, hidden: int, inter: int
) -> MoETiles:
    """GEMM tiles for 16-bit weights.

    From ``SIXTEEN_BIT_MIN_PAIRS`` pairs and more than 8 per expert,
    ``sixteen_bit_prefill_tiles``. Below, the row block is sized from the expected
    pairs per expert, so that at decode sizes each busy expert gets one block and its
    weights are read once; 16-row blocks take 32 x 256 columns (128 contiguous bytes
    per row and step), larger ones 64 x 128 (32 x 256 was 1.6-2.7x slower there;
    bench/TUNING.md), with the w2 split sized as in that sweep.
    """
    if num_pairs >= SIXTEEN_BIT_MIN_PAIRS and per_expert > 8:
        return sixteen_bit_prefill_tiles(per_expert)
    busy = min(num_experts, num_pairs)
    if per_expert <= 64:
        block_m = min(64, max(16, next_pow2(per_expert)))
        w2_out = busy * -(-hidden // 64)
        if block_m == 16:
            tiles = GemmTiles(block_n=32, block_k=256, num_warps=4, num_stages=3)
        else:
            tiles = GemmTiles(block_n=64, block_k=128, num_warps=4, num_stages=4)
        return MoETiles(
            block_m=block_m,
            w13=tiles,
            w2=attrs.evolve(tiles, split_k=split_for(w2_out, inter, 128)),
        )
    block_m = 64 if per_expert <= 256 else 128
    tiles = GemmTiles(block_n=128, block_k=64, num_warps=8 if block_m == 128 else 4)
    return MoETiles(block_m=block_m, w13=tiles, w2=tiles)
