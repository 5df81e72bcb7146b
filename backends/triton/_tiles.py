"""The tile objects of the fused-MoE kernels: one GEMM's, one GEMV's, a layer's.

Frozen attrs values checked at construction; the tuned values, per shape class, and the
path rules are in ``_configs.py``. Imports only stdlib and attrs.
"""

from typing import Final

import attrs

NUM_SMS_H200: Final = 132
"""Multiprocessors of the GPU the tile table was measured on (an NVIDIA H200); the
table's rules size grids in its waves."""


@attrs.frozen(kw_only=True)
class GemmTiles:
    """Tiles of one grouped GEMM.

    Attributes:
        block_n: output columns per program.
        block_k: reduction elements per step.
        split_k: programs sharing one output tile along the reduction (on w13 see
            ``MoETiles``).
        num_warps: warps per program.
        num_stages: software-pipeline depth.
        swap_ab: compute the transposed product (weights as the dot's first
            operand), so Hopper's tensor cores read the dequantized tile from
            registers instead of a shared-memory copy of it.
        nibble_halves: int4 only: dot the tile's low and high nibbles as two halves
            against an activation whose K is permuted to match (even columns of each
            ``block_k`` chunk, then odd), instead of interleaving them in registers.
        group_m: launch order: 0 runs every row block of a column tile before the
            next tile; ``g`` > 0 runs ``g`` row blocks across all column tiles before
            the next ``g`` (their input rows stay in L2).
        int4_words: int4 only, instead of ``nibble_halves``: read the codes as int32
            words (8 codes each) in K order and dequantize each word with one
            inline-PTX block on the GPU (shifts and converts in the interpreter).
            Taken where ``K % 8 == 0`` and the group size is a multiple of 8;
            needs ``swap_ab`` (Triton 3.6 fails to compile the unswapped tile:
            "Illegal shared layout" in its dot-operand pass).
        mma: with ``int4_words``: run the Gluon kernel ``_kernels_mma.py`` instead,
            whose threads load the words of their own ``mma.sync`` A fragments and
            feed the dequantized codes to the tensor cores from registers. CUDA
            sm_80+ only (``mma_target``); elsewhere, and for row blocks other than 8,
            16 or 32, the Triton word kernel runs with the same tiles (8-row blocks
            are then an error: its dots need 16 rows). Needs
            ``block_k`` 128 and ``block_n`` a multiple of ``16 * num_warps``. Its
            ``num_stages``: 1 loads each step's words one step ahead in registers;
            ``s`` > 1 copies them ``s - 1`` steps ahead into a shared-memory ring
            (``cp.async``).
        copy_steps: with ``mma`` and a ring (``num_stages`` > 1; an error elsewhere):
            K steps each group of ring slots holds, copied one right after the other
            (1, 2 or 4). A row's 64 bytes of one step are then read back to back
            with its next steps' instead of a step later: the H200 read 2.4 TB/s
            from 64 bytes a row at a time and 3.9-4.1 TB/s from two such reads back
            to back (bench/sweeps/probe_read_tiles_h200.log).
        x_shared: with ``mma`` and a ring: the activation comes through the ring too
            (each step's ``(block_m, 128)`` tile copied with its words) and enters
            the MMA in four 32-column sub-steps read from shared memory, instead of
            being loaded a step ahead into registers (64 registers a thread for two
            steps of 16 rows, 128 of 32).
        wgmma: with ``mma``: on Hopper (sm_90, ``wgmma_target``) run the warpgroup-MMA
            kernel ``_kernels_wgmma.py`` instead, whose tensor cores read the row
            block's tokens from shared memory (the words still dequantized into the
            register A operand), so row blocks of 32 tokens cost no spills. Needs
            ``num_warps`` 4 or 8 (whole warpgroups) and ``block_n``
            ``16 * num_warps`` (one 64-row tile a warpgroup: with two the gated w13
            on 4 warps spilled 72-568 bytes a thread, offline sm_90);
            ``num_stages`` and ``copy_steps`` form the words' ring as for
            ``mma.sync``. There ``x_shared`` means the input in logical K order,
            copied with the words into ``(block_m, 128)`` ring slots that the
            tensor cores read as they are, where K is whole 128-column steps (w2's
            input is then w13's output written so, w13's ``permute_logical(x)``);
            elsewhere the warpgroup kernel stores each step's activation from
            registers into its own two shared slots. Off Hopper the ``mma.sync``
            kernel takes the same tiles, its input through registers.
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False
    nibble_halves: bool = False
    group_m: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    int4_words: bool = False
    mma: bool = False
    copy_steps: int = 1
    x_shared: bool = False
    wgmma: bool = False

    def __attrs_post_init__(self) -> None:
        if self.copy_steps not in (1, 2, 4):
            msg = f"GemmTiles.copy_steps must be 1, 2 or 4, got {self.copy_steps}"
            raise ValueError(msg)
        ring = self.mma and self.num_stages > 1  # the Gluon kernel's cp.async ring
        for name, on in (
            ("copy_steps > 1", self.copy_steps > 1),
            ("x_shared", self.x_shared),
        ):
            if on and not ring:
                msg = (
                    f"GemmTiles.{name} needs mma=True and num_stages > 1 (the Gluon "
                    f"kernel's cp.async ring), got mma={self.mma}, "
                    f"num_stages={self.num_stages}"
                )
                raise ValueError(msg)
        if self.wgmma and (
            not self.mma
            or self.num_warps not in (4, 8)
            or self.block_n != 16 * self.num_warps
        ):
            msg = (
                "GemmTiles.wgmma needs mma=True, num_warps 4 or 8 and block_n 16 * "
                "num_warps (one 64-row tile a warpgroup), got "
                f"mma={self.mma}, num_warps={self.num_warps}, block_n={self.block_n}"
            )
            raise ValueError(msg)
        if self.mma and not self.int4_words:
            raise ValueError("GemmTiles: mma needs int4_words=True")
        if self.mma and (self.block_k != 128 or self.block_n % (16 * self.num_warps)):
            msg = (
                "GemmTiles: mma needs block_k 128 and block_n a multiple of "
                f"16 * num_warps = {16 * self.num_warps}, got block_k {self.block_k}, "
                f"block_n {self.block_n}"
            )
            raise ValueError(msg)
        if self.int4_words and self.nibble_halves:
            raise ValueError(
                "GemmTiles: int4_words and nibble_halves are two dequantization "
                "schemes; set at most one"
            )
        if self.int4_words and not self.swap_ab:
            raise ValueError("GemmTiles: int4_words needs swap_ab=True")


@attrs.frozen(kw_only=True)
class GemvTiles:
    """Tiles of the decode GEMV.

    Attributes:
        block_n: output rows per program.
        block_k: reduction elements per step.
        num_warps: warps per program.
        prefetch: load the next step's weights (the word kernel: also its scales,
            zero points and inputs) before this step's math.
        loop_stages: software-pipeline depth Triton is asked for on the K loop
            (``None``: its default).
        w2_split: K splits of the w2 GEMV (``None``: ``gemv_split_for``).
        words: read int32 words of 8 codes (``_kernels_gemv_words.py``) where the
            weights allow it (``int4_words_fit``). ``prefetch`` and ``loop_stages``
            apply to the int4 kernels (bytes and words), not the 16-bit one.
        paired: sum two words of one group per float16 chain, scaling and
            accumulating once for both (``_kernels_gemv_pairs.py``), where
            ``words`` applies and groups hold two words or more (``G >= 16``).
        pdl: programmatic dependent launch on sm_90 and newer (``launch_pdl``): the
            word and paired w13 GEMVs let the next kernel launch as soon as all their
            programs have started, and the w2 GEMV (word kernels) and the top-k sum
            start early and wait (``griddepcontrol.wait``) before reading what the
            kernel before them wrote; their launch latency hides behind its tail.
        tma: the paired kernel reads its weight words by bulk tensor copies (TMA, a
            tensor descriptor of the words as ``[E * rows, K / 8]``, a step's
            ``[block_n, block_k / 8]`` words a copy), which Triton pipelines through
            shared memory ``loop_stages`` deep; on sm_90 and newer and in the CPU
            interpreter (``tma_target``), for weights ``tma_fit`` accepts. Elsewhere
            the same tiles read by plain loads, unpipelined (``gemv_loop_stages``).
        w2_tiles: tiles of the w2 GEMV (``None``: these). Its ``w2_split`` and
            ``w2_tiles`` are not read (``w2_split`` here is the w2 GEMV's).
        int_dot: the paired kernel's products in integers (``_kernels_gemv_ints.py``):
            each 16 inputs of a pair of words rounded to 15-bit integers on the
            power-of-two grid of their largest, codes and inputs multiplied and summed
            as bytes by ``dp4a``, instead of float16 chains; where ``paired`` applies
            (groups of one word run the one-word kernel's float16 chains).
        inputs_ahead: the paired kernel loads each step's scales, zero points and
            inputs one step ahead in registers (as loaded; converted at their step),
            while its words come at their step (through the TMA pipeline where
            ``tma`` applies). Outputs equal those without it bit for bit. Excludes
            ``prefetch``, which loads all of the next step ahead. The other GEMV
            kernels (one word a chain, bytes, 16-bit) have no such form and ignore it.
    """

    block_n: int
    block_k: int
    num_warps: int = 4
    prefetch: bool = False
    loop_stages: int | None = None
    w2_split: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1))
    )
    words: bool = False
    paired: bool = False
    pdl: bool = False
    tma: bool = False
    w2_tiles: "GemvTiles | None" = None
    int_dot: bool = False
    inputs_ahead: bool = False

    def __attrs_post_init__(self) -> None:
        if self.inputs_ahead and self.prefetch:
            raise ValueError(
                "GemvTiles: inputs_ahead loads part of what prefetch loads one step "
                "ahead; set at most one"
            )


@attrs.frozen(kw_only=True)
class MoETiles:
    """Row-block size shared by both GEMMs, and each GEMM's tiles.

    ``w13.split_k`` > 1: the w13 GEMM writes float32 K-split partials of its gate and
    up rows, and one more launch sums them and applies the activation
    (``launch_activate``); that launch writes w2's input in plain K order, so
    ``w2.nibble_halves`` must then be off.

    ``pdl``: programmatic dependent launch on sm_90 and newer (``pdl_target``) along
    the ``gemm`` path: the Gluon GEMMs (``GemmTiles.mma``; the Triton GEMM launches
    plainly), the activation of a split w13 and the top-k sum are launched with
    ``launch_pdl`` and wait (``griddepcontrol.wait``) before their first read; the
    Gluon GEMMs let the next kernel launch after their K loop, the activation at
    once. So each launch's latency hides behind the tail of the kernel before it.
    The alignment launches plainly and does not let w13 start early: that cost
    Qwen3-30B-A3B M = 4 5 us (bench/TUNING.md).
    """

    block_m: int
    w13: GemmTiles
    w2: GemmTiles = attrs.field()
    pdl: bool = False

    @w2.validator
    def _plain_input(self, attribute: object, value: GemmTiles) -> None:
        del attribute
        if self.w13.split_k > 1 and value.nibble_halves:
            msg = (
                "MoETiles.w2.nibble_halves needs w13.split_k == 1 (a K-split w13's "
                f"activation writes w2's input unpermuted), got w13.split_k = "
                f"{self.w13.split_k}"
            )
            raise ValueError(msg)
