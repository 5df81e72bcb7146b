# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
"""Triton decode kernel of triton-w4a16: both paired GEMVs in one launch.

``@triton.jit`` only; the typed host wrapper is ``launch_gemv_handoff`` in
``_launch_gemv_handoff.py`` (``GemvTiles.handoff``). Each program takes a job number
from a counter as it starts (``tl.atomic_add``): the first ``pairs x w13 tiles`` jobs
are w13 tiles (pair-major, ``_pairs_tile`` gated), the rest w2 tiles (pair-major, then
column tile, then K split). A w13 job counts itself done for its pair
(``_count_done``, a release); a w2 job first waits until its pair's w13 jobs are all
done (``_wait_done``, an acquire), then reads the intermediate row they wrote. So a
pair's w2 can start while later pairs' w13 still run, with no launch between them.

Jobs are numbered in the order programs start, not by program id: a w2 job waits only
on jobs handed out before it, to programs already running that wait on nothing, so
the wait always ends, however the GPU schedules programs. The counter (``count_ptr``,
int32 ``[1 + pairs]``: the job counter, then each pair's finished w13 jobs) must be
zero at launch. The intermediate's rows must not share a 128-byte line (the launcher
pads them), so no program can read a line of a row before that row is complete.
"""

import triton
import triton.language as tl

from backends.triton._kernels import _grid_dependency
from backends.triton._kernels_gemv_pairs import _pairs_tile

_ON = tl.constexpr(True)  # noqa: FBT003  # a meta-parameter's value
_OFF = tl.constexpr(False)  # noqa: FBT003


@triton.jit
def _count_done(ptr, ASM: tl.constexpr):
    """Count a w13 job done after every lane's stores (fence, barrier, release add)."""
    if ASM:
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )
    tl.debug_barrier()
    tl.atomic_add(ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_done(ptr, need):
    """Spin until ``*ptr >= need`` (acquire reads), then hold every lane to it."""
    seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    while seen < need:
        seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _moe_gemv_handoff_kernel(
    # pointers
    x_ptr, w13_ptr, s13_ptr, z13_ptr, inter_ptr, w2_ptr, s2_ptr, z2_ptr, part_ptr,
    ids_ptr, topk_weights_ptr, bias13_ptr, bias2_ptr, w13_desc, w2_desc, count_ptr,
    # sizes
    num_pairs, D, F, k2_per_split, alpha, limit,
    # strides (weights in int32 words)
    stride_xm, stride_w13e, stride_w13n, stride_s13e, stride_s13n, stride_im,
    stride_w2e, stride_w2n, stride_s2e, stride_s2n, stride_ps, stride_pm,
    stride_b13, stride_b2,
    # meta-parameters
    A_DIV: tl.constexpr, GROUP13: tl.constexpr, GROUP2: tl.constexpr,
    HAS_ZP: tl.constexpr,
    ACT: tl.constexpr, WEIGHT_ROWS: tl.constexpr, HAS_BIAS13: tl.constexpr,
    HAS_BIAS2: tl.constexpr, BLOCK_N13: tl.constexpr, BLOCK_N2: tl.constexpr,
    BLOCK_K13: tl.constexpr, BLOCK_K2: tl.constexpr, SPLIT2: tl.constexpr,
    EVEN13: tl.constexpr,
    EVEN2: tl.constexpr, PREFETCH13: tl.constexpr, PREFETCH2: tl.constexpr,
    STAGES13: tl.constexpr, STAGES2: tl.constexpr, ASM: tl.constexpr,
    TMA13: tl.constexpr, TMA2: tl.constexpr, INT_DOT13: tl.constexpr,
    INT_DOT2: tl.constexpr, PDL_NEXT: tl.constexpr,
):  # fmt: skip
    """w13 then w2 of ``_moe_gemv_pairs_kernel``, one job a program.

    w13 gated into ``inter``, w2 into ``part`` in ``SPLIT2`` K splits; jobs numbered
    as programs start (module doc). Grid: ``pairs * (cdiv(F, BLOCK_N13) +
    cdiv(D, BLOCK_N2) * SPLIT2)``.
    """
    job = tl.atomic_add(count_ptr, 1, sem="relaxed", scope="gpu")
    _grid_dependency(_OFF, PDL_NEXT)  # the top-k sum may launch and wait
    tiles13 = tl.cdiv(F, BLOCK_N13)
    jobs13 = num_pairs * tiles13
    if job < jobs13:
        p = job // tiles13
        e = tl.load(ids_ptr + p)
        if e >= 0:
            _pairs_tile(
                p, e, job % tiles13, 0, x_ptr, w13_ptr, s13_ptr, z13_ptr, inter_ptr,
                topk_weights_ptr, bias13_ptr, w13_desc, F, D, D, alpha, limit,
                stride_xm, stride_w13e, stride_w13n, stride_s13e, stride_s13n, 0,
                stride_im, stride_b13, A_DIV, GROUP13, HAS_ZP, _ON, ACT, WEIGHT_ROWS,
                HAS_BIAS13, BLOCK_N13, BLOCK_K13, EVEN13, PREFETCH13, STAGES13, ASM,
                TMA13, INT_DOT13,
            )  # fmt: skip
        _count_done(count_ptr + 1 + p, ASM)
    else:
        per_pair = tl.cdiv(D, BLOCK_N2) * SPLIT2
        p = (job - jobs13) // per_pair
        rest = (job - jobs13) % per_pair
        e = tl.load(ids_ptr + p)
        if e >= 0:
            _wait_done(count_ptr + 1 + p, tiles13)
            _pairs_tile(
                p, e, rest // SPLIT2, rest % SPLIT2, inter_ptr, w2_ptr, s2_ptr, z2_ptr,
                part_ptr, topk_weights_ptr, bias2_ptr, w2_desc, D, F, k2_per_split,
                alpha, limit, stride_im, stride_w2e, stride_w2n, stride_s2e,
                stride_s2n, stride_ps, stride_pm, stride_b2, 1, GROUP2, HAS_ZP, _OFF,
                ACT, _OFF, HAS_BIAS2, BLOCK_N2, BLOCK_K2, EVEN2, PREFETCH2, STAGES2,
                ASM, TMA2, INT_DOT2,
            )  # fmt: skip
