"""The pure rules beside the Triton kernels: tile table, path rules, input layouts.

Host-side only (no kernel runs): ``backends/triton/_configs.py`` (the Gluon decode row:
``test_triton_configs_mma.py``), the path rules of
``_fused.py`` and the layout helpers of ``_launch.py`` and ``_launch_gemv.py``.
"""

import attrs
import pytest
import torch

import backends.triton._configs as configs
import backends.triton._fused as fused
import backends.triton._launch as launch_module
from backends.triton._configs import DEQUANT_PAIRS_PER_EXPERT, GEMV_BY_DEFAULT
from backends.triton._fused import (
    _logical_inputs,
    permute_k,
    permute_logical,
    permuted_width,
    use_dequant,
    use_gemv,
)
from backends.triton._launch import (
    ExpertMatrix,
    _whole_copies,
    int4_words_fit,
)
from backends.triton._launch_gemv import gemv_loop_stages, tma_fit
from backends.triton._tiles import GemmTiles, GemvTiles, MoETiles


def test_permute_k_puts_even_columns_first_in_each_chunk() -> None:
    x = torch.arange(2 * 10, dtype=torch.float32).reshape(2, 10)
    out = permute_k(x, 4)
    assert permuted_width(10, 4) == 12
    assert out.shape == (2, 12)
    row = [0, 2, 1, 3, 4, 6, 5, 7, 8, -1, 9, -1]  # -1: zero padding
    for r in range(2):
        want = [x[r, c].item() if c >= 0 else 0.0 for c in row]
        assert out[r].tolist() == want


def test_permute_logical_puts_each_column_where_the_words_meet_it() -> None:
    """Real column ``32c + 8r + 4h + 2i1 + i0`` of each 128 lands at logical
    ``32r + 16i1 + 8i0 + 2c + h``: a permutation, step by step, rows kept."""
    x = torch.arange(2 * 256, dtype=torch.float32).reshape(2, 256)
    out = permute_logical(x)
    assert out.shape == x.shape
    for j in range(256):
        step, q = divmod(j, 128)
        c, r, h, i1, i0 = q // 32, q // 8 % 4, q // 4 % 2, q // 2 % 2, q % 2
        logical = 128 * step + 32 * r + 16 * i1 + 8 * i0 + 2 * c + h
        assert out[:, logical].tolist() == x[:, j].tolist(), j
    assert sorted(out[1].tolist()) == x[1].tolist()


def test_logical_inputs_where_the_warpgroup_ring_takes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``x_shared`` warpgroup tiles with a ring take a logical-order input where K is
    whole 128-column steps; w2's needs an unsplit w13 on a Gluon kernel."""
    monkeypatch.setattr(launch_module, "wgmma_target", lambda a: True)
    monkeypatch.setattr(launch_module, "mma_target", lambda a: True)
    ring = GemmTiles(
        block_n=64, block_k=128, num_warps=4, num_stages=3, swap_ab=True,
        int4_words=True, mma=True, wgmma=True, copy_steps=2, x_shared=True,
    )  # fmt: skip

    def inputs(d: int, f: int, tiles: MoETiles) -> tuple[bool, bool]:
        w13 = ExpertMatrix(data=torch.zeros(2, 2 * f, d // 2, dtype=torch.uint8))
        w2 = ExpertMatrix(data=torch.zeros(2, d, f // 2, dtype=torch.uint8))
        return _logical_inputs(torch.empty(1, d), w13, w2, tiles)

    both = MoETiles(block_m=32, w13=ring, w2=ring)
    assert inputs(512, 256, both) == (True, True)
    assert inputs(512, 328, both) == (True, False)  # w2's K = 328
    assert inputs(520, 256, both) == (False, True)  # w13's K = 520
    no_x = attrs.evolve(ring, x_shared=False)
    assert inputs(512, 256, attrs.evolve(both, w13=no_x)) == (False, True)
    assert inputs(512, 256, attrs.evolve(both, w2=no_x)) == (True, False)
    split13 = attrs.evolve(both, w13=attrs.evolve(ring, split_k=2))
    assert inputs(512, 256, split13) == (True, False)  # w13 writes float32 partials
    mma13 = attrs.evolve(both, w13=attrs.evolve(ring, wgmma=False, x_shared=False))
    assert inputs(512, 256, mma13) == (False, True)  # mma.sync writes it so too
    one_stage = attrs.evolve(ring, num_stages=1, copy_steps=1, x_shared=False)
    assert inputs(512, 256, attrs.evolve(both, w2=one_stage)) == (True, False)
    assert inputs(512, 256, attrs.evolve(both, block_m=128)) == (False, False)


def test_sixteen_bit_prefill_tiles_rule() -> None:
    """16-bit weights take the emulation sweep's tiles only in the measured classes."""

    def tiles(pairs: int, experts: int, *, sixteen_bit: bool = True) -> MoETiles:
        return configs.choose_tiles(
            num_pairs=pairs,
            num_experts=experts,
            hidden_size=4096,
            intermediate_size=1536,
            sixteen_bit=sixteen_bit,
        )

    assert tiles(8192, 128).block_m == 128  # 64 pairs per expert
    assert tiles(8192, 128).w13.num_warps == 8
    assert tiles(8192, 128).w13.block_n == 128  # gated: two accumulators
    assert tiles(8192, 128).w2.block_n == 256
    assert tiles(8192, 256).w13.block_n == 256  # 32 per expert
    assert tiles(2048, 128).block_m == 32  # 16 per expert
    assert tiles(2048, 128).w13.num_stages == 4
    assert {tiles(p, 128).w2.group_m for p in (2048, 8192)} == {configs.PREFILL_GROUP_M}
    # Outside the measured classes (<= 8 per expert, few pairs): the decode rows.
    assert tiles(2048, 256).block_m == 16  # 8 per expert
    assert tiles(2048, 256).w13.block_n == 32
    assert tiles(128, 8).block_m == 16
    assert tiles(128, 8).w13.group_m == 0  # decode rows keep the plain order
    assert not tiles(128, 8).w13.swap_ab  # only int4 tiles swap operands


def test_int4_tiles_rule() -> None:
    """int4: swapped int32-word tiles up to 16 pairs per expert, nibble halves above."""

    def tiles(
        pairs: int, experts: int, hidden: int = 7168, inter: int = 2048
    ) -> MoETiles:
        return configs.choose_tiles(
            num_pairs=pairs, num_experts=experts, hidden_size=hidden,
            intermediate_size=inter,
        )  # fmt: skip

    def flags(t: MoETiles) -> set[tuple[bool, bool, bool]]:
        return {(g.swap_ab, g.int4_words, g.nibble_halves) for g in (t.w13, t.w2)}

    for pairs, experts in [(8, 256), (512, 256), (2048, 128)]:
        assert flags(tiles(pairs, experts)) == {(True, True, False)}
    for pairs, experts in [(2049, 128), (32768, 256)]:
        assert flags(tiles(pairs, experts)) == {(True, False, True)}
    assert tiles(1024, 128).block_m == 16  # 8 per expert
    assert tiles(2048, 128).block_m == 32  # 16 per expert, a large expert
    assert tiles(2048, 128, hidden=2048, inter=768).block_m == 16  # a small one
    assert tiles(2048, 128).w13.block_n == 64
    assert tiles(2049, 128).block_m == 64  # 17 per expert
    assert tiles(32768, 256).w13.block_k == 64
    assert tiles(2, 8).w2.split_k > 1  # few w2 tiles: split K
    assert tiles(32768, 256).w2.split_k == 1
    assert tiles(2049, 128).w13.group_m == configs.PREFILL_GROUP_M
    assert tiles(2048, 128).w13.group_m == 0


def test_shared_input_needs_whole_visible_16_byte_copies() -> None:
    """``x_shared`` falls back to registers unless K % 32 == 0 and rows of whole,
    visibly aligned 16-byte copies (stride of 16 elements, 16-byte start)."""
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    assert _whole_copies(x, 64)
    assert not _whole_copies(x, 48)  # K % 32 != 0
    assert not _whole_copies(torch.zeros(4, 72, dtype=torch.bfloat16)[:, :64], 64)
    shifted = torch.zeros(4 * 64 + 8, dtype=torch.bfloat16)[1 : 1 + 4 * 64]
    assert not _whole_copies(shifted.view(4, 64), 64)  # a 2-byte aligned start


def test_int4_words_fit_needs_whole_aligned_words() -> None:
    scale = torch.ones(2, 4, 2)
    fit = ExpertMatrix(
        data=torch.zeros(2, 4, 32, dtype=torch.uint8), scale=scale, group_size=32
    )
    assert int4_words_fit(fit)
    odd_k = ExpertMatrix(
        data=torch.zeros(2, 4, 30, dtype=torch.uint8), scale=scale, group_size=30
    )
    assert not int4_words_fit(odd_k)  # K = 60 is not whole words
    shifted = ExpertMatrix(
        data=torch.zeros(2 * 4 * 32 + 1, dtype=torch.uint8)[1:].view(2, 4, 32),
        scale=scale,
        group_size=32,
    )
    assert not int4_words_fit(shifted)  # storage off a 4-byte boundary
    assert not int4_words_fit(ExpertMatrix(data=torch.zeros(2, 4, 64)))  # 16-bit


def _words(k: int, group: int, *, rows: int = 16) -> ExpertMatrix:
    """int4 weights of 2 experts, ``rows`` rows of ``k`` codes (``k / 2`` bytes)."""
    return ExpertMatrix(
        data=torch.zeros(2, rows, k // 2, dtype=torch.uint8),
        scale=torch.ones(2, rows, max(1, k // group)),
        group_size=group,
    )


def test_tma_fit_needs_a_descriptor_the_hardware_takes() -> None:
    """The paired GEMV reads by TMA only with contiguous 16-byte rows, a 16-byte
    aligned base, power-of-two boxes of <= 256 per dimension, and steps that cover
    whole groups (or lie in one)."""
    tma = GemvTiles(block_n=8, block_k=512, words=True, paired=True, tma=True)
    assert tma_fit(_words(4096, 128), tma)
    assert tma_fit(_words(96, 32), attrs.evolve(tma, block_k=64))  # K tail: zeros
    assert tma_fit(_words(1536, 1536), tma)  # per-row group: steps inside it
    assert not tma_fit(_words(4104, 8), tma)  # groups of one word: not paired
    assert not tma_fit(_words(4120, 4120), tma)  # 515-word rows: not 16-byte multiples
    assert not tma_fit(_words(960, 96), tma)  # 512-code steps over 96-code groups
    assert not tma_fit(_words(4096, 128), attrs.evolve(tma, block_n=12))
    assert not tma_fit(_words(4096, 128), attrs.evolve(tma, block_k=4096))  # 512 words
    strided = _words(8192, 128)
    half = ExpertMatrix(
        data=strided.data[:, :, :2048], scale=strided.scale, group_size=128
    )
    assert int4_words_fit(half)
    assert not tma_fit(half, tma)  # rows 4096 bytes apart, 2048 read: not contiguous
    shifted = ExpertMatrix(
        data=torch.zeros(2 * 16 * 2048 + 4, dtype=torch.uint8)[4:].view(2, 16, 2048),
        scale=torch.ones(2, 16, 32),
        group_size=128,
    )
    assert int4_words_fit(shifted)
    assert not tma_fit(shifted, tma)  # base 4 bytes off a 16-byte boundary


def test_gemv_loop_stages_drop_the_pipeline_of_a_tma_fallback() -> None:
    tma = GemvTiles(block_n=8, block_k=512, words=True, paired=True, tma=True)
    staged = attrs.evolve(tma, loop_stages=3)
    assert gemv_loop_stages(staged, tma=True) == 3
    assert gemv_loop_stages(staged, tma=False) is None  # plain loads, unpipelined
    plain = attrs.evolve(staged, tma=False)
    assert gemv_loop_stages(plain, tma=False) == 3  # asked for without TMA: kept


def test_gemv_w2_split_rule() -> None:
    """Split K while programs are few or long (> 8 steps), keep >= 2 steps per
    split, and split at most 8 ways."""
    target = configs.GEMV_PROGRAMS_PER_SM * configs.NUM_SMS_H200
    assert configs.gemv_split_for(target, 4096, 512) == 1  # 8 steps: enough programs
    assert configs.gemv_split_for(target, 4608, 512) == 2  # 9 steps: long
    assert configs.gemv_split_for(target, 1 << 20, 512) == 8  # at most 8 ways
    assert configs.gemv_split_for(512, 14336, 512) == 4  # Mixtral-8x7B w2 at M = 1
    assert configs.gemv_split_for(2048, 14336, 512) == 4  # M = 4: 28 steps, long
    assert configs.gemv_split_for(2048, 2048, 512) == 1  # DeepSeek-V3: 4 steps
    assert configs.gemv_split_for(1024, 768, 512) == 1  # Qwen3-30B-A3B: K too short
    assert configs.gemv_split_for(1, 4096, 512) == 4  # 4096 / 4 = 2 steps of 512
    assert configs.gemv_split_for(1, 4096, 1024) == 2
    with pytest.raises(ValueError, match="w2_split"):
        GemvTiles(block_n=16, block_k=64, w2_split=0)


def test_gemv_is_the_decode_rule() -> None:
    w13 = ExpertMatrix(data=torch.zeros(8, 4, 2, dtype=torch.uint8))
    assert use_gemv(4, w13, enabled=True)  # 4 pairs over 8 experts
    assert not use_gemv(5, w13, enabled=True)
    many = ExpertMatrix(data=torch.zeros(256, 4, 2, dtype=torch.uint8))  # K = 4
    assert not int4_words_fit(many)
    assert use_gemv(configs.GEMV_FEW_PAIRS, many, enabled=True)
    assert not use_gemv(configs.GEMV_FEW_PAIRS + 1, many, enabled=True)  # bytes only
    words = ExpertMatrix(
        data=torch.zeros(256, 4, 8, dtype=torch.uint8), group_size=16
    )  # whole words: the word GEMV takes up to GEMV_MAX_PAIRS
    assert use_gemv(configs.GEMV_MAX_PAIRS, words, enabled=True)
    assert not use_gemv(configs.GEMV_MAX_PAIRS + 1, words, enabled=True)
    assert not use_gemv(129, words, enabled=True)  # 256 experts: <= 128 pairs
    few_words = ExpertMatrix(
        data=torch.zeros(8, 4, 8, dtype=torch.uint8), group_size=16
    )
    assert use_gemv(8, few_words, enabled=True)  # words: few pairs, one per expert
    assert not use_gemv(9, few_words, enabled=True)
    mid_words = ExpertMatrix(
        data=torch.zeros(128, 4, 8, dtype=torch.uint8), group_size=16
    )
    assert use_gemv(128, mid_words, enabled=True)  # Qwen3 at M = 16: one per expert
    assert not use_gemv(129, mid_words, enabled=True)
    wide = ExpertMatrix(data=torch.zeros(64, 4, 8, dtype=torch.uint8), group_size=16)
    assert use_gemv(64, wide, enabled=True)
    assert not use_gemv(65, wide, enabled=True)  # more pairs than experts
    dense = ExpertMatrix(data=torch.zeros(8, 4, 4, dtype=torch.bfloat16))
    assert use_gemv(4, dense, enabled=True)  # 16-bit (emulation): the same few pairs
    assert not use_gemv(5, dense, enabled=True)
    dense_many = ExpertMatrix(data=torch.zeros(256, 4, 64, dtype=torch.bfloat16))
    # 16-bit experts of 64 x 2 weights: tiny (GEMV_16BIT_TINY_EXPERT)
    assert use_gemv(configs.GEMV_16BIT_TINY_PAIRS, dense_many, enabled=True)
    assert not use_gemv(configs.GEMV_16BIT_TINY_PAIRS + 1, dense_many, enabled=True)

    def dense_experts(d: int, f: int) -> ExpertMatrix:  # shape only, on "meta"
        shape = (128, 2 * f, d)
        return ExpertMatrix(
            data=torch.empty(shape, dtype=torch.bfloat16, device="meta")
        )

    assert use_gemv(8, dense_experts(4096, 1536), enabled=True)  # Qwen3-235B: 6.3 M
    assert not use_gemv(9, dense_experts(4096, 1536), enabled=True)
    assert not use_gemv(8, dense_experts(7168, 2048), enabled=True)  # DeepSeek: 14.7 M
    tiny = dense_experts(2048, 768)  # Qwen3-30B-A3B: 1.6 M, below the tiny bound
    assert use_gemv(configs.GEMV_16BIT_TINY_PAIRS, tiny, enabled=True)
    assert not use_gemv(configs.GEMV_16BIT_TINY_PAIRS + 1, tiny, enabled=True)
    assert configs.GEMV_16BIT_TINY_EXPERT == 2048 * 1024  # the edge is not tiny
    assert not use_gemv(9, dense_experts(2048, 1024), enabled=True)
    assert use_gemv(9, dense_experts(2048, 1023), enabled=True)
    assert not use_gemv(1, w13, enabled=False)
    assert use_gemv(1, w13) is GEMV_BY_DEFAULT


def test_gemv_gives_way_to_the_mma_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the Gluon GEMM runs, the word GEMV stops at GEMV_MAX_PAIRS_MMA pairs and
    one pair per two experts."""
    import backends.triton._fused as fused

    words = ExpertMatrix(data=torch.zeros(128, 4, 8, dtype=torch.uint8), group_size=16)
    assert use_gemv(configs.GEMV_MAX_PAIRS, words, enabled=True)  # CPU: no Gluon
    monkeypatch.setattr(fused, "mma_target", lambda a: True)
    assert fused.mma_runs(words, words)
    assert use_gemv(configs.GEMV_MAX_PAIRS_MMA, words, enabled=True)
    assert not use_gemv(configs.GEMV_MAX_PAIRS_MMA + 1, words, enabled=True)
    mixtral = ExpertMatrix(data=torch.zeros(8, 4, 8, dtype=torch.uint8), group_size=16)
    assert use_gemv(4, mixtral, enabled=True)  # M = 2, top-2: one pair per two experts
    assert not use_gemv(5, mixtral, enabled=True)  # M = 4 has 8: the GEMM
    odd_w2 = ExpertMatrix(data=torch.zeros(128, 4, 3, dtype=torch.uint8), group_size=6)
    assert not fused.mma_runs(words, odd_w2)  # w2 not whole words: no Gluon kernel
    assert use_gemv(configs.GEMV_MAX_PAIRS, words, odd_w2, enabled=True)


def test_gemv_tiles_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paired int32 words wherever w13 is whole aligned words: TMA reads (w13 8 rows,
    w2 16) where the w13 grid has >= 8 programs per multiprocessor, else 8 rows
    loading one step ahead, both with programmatic dependent launch; else bytes;
    16-bit weights their own."""
    monkeypatch.setattr(fused, "is_interpreting", lambda: False)

    def w13(d: int, f: int) -> ExpertMatrix:  # shape only: (E, 2F, D/2) on "meta"
        return ExpertMatrix(
            data=torch.empty(8, 2 * f, d // 2, dtype=torch.uint8, device="meta")
        )

    few, many = configs.GEMV_PAIRED_FEW, configs.GEMV_PAIRED
    assert fused.pick_gemv_tiles(8, w13(2048, 768)) is few  # Qwen3-30B M = 1: 768
    assert fused.pick_gemv_tiles(2, w13(4096, 14336)) is many  # Mixtral M = 1: 3584
    assert fused.pick_gemv_tiles(8, w13(4096, 1536)) is many  # Qwen3-235B M = 1: 1536
    assert fused.pick_gemv_tiles(11, w13(2048, 768)) is many  # 1056 = 8 per SM
    assert fused.pick_gemv_tiles(10, w13(2048, 768)) is few  # 960
    assert fused.pick_gemv_tiles(1, w13(100, 64)) is configs.GEMV_FEW  # K = 100: bytes
    assert (few.block_n, few.prefetch, few.tma) == (8, True, False)
    assert (many.block_n, many.prefetch, many.tma, many.loop_stages) == (
        8,
        False,
        True,
        3,
    )
    assert many.w2_tiles is not None
    assert many.w2_tiles == attrs.evolve(many, block_n=16, w2_tiles=None)  # w2 16 rows
    assert attrs.evolve(
        few, prefetch=False, tma=True, loop_stages=3, inputs_ahead=True
    ) == attrs.evolve(many, w2_tiles=None)  # else the same tile
    assert many.inputs_ahead  # scales, zero points and inputs a step ahead, both GEMVs
    assert many.words
    assert many.paired
    assert many.pdl  # programmatic dependent launch where the GPU has it
    assert few.int_dot  # products by dp4a, both GEMVs
    assert many.int_dot
    assert not configs.GEMV_FEW.words
    dense = ExpertMatrix(data=torch.empty(8, 2 * 768, 2048, dtype=torch.bfloat16))
    assert fused.pick_gemv_tiles(1, dense) is configs.GEMV_16BIT


@pytest.mark.parametrize(
    ("gpu", "experts", "group", "most"),
    [
        ("NVIDIA H100 80GB HBM3", 128, 16, 96),  # Qwen3 to M = 12: 3/4 a expert
        ("NVIDIA H100 80GB HBM3", 256, 128, 192),  # DeepSeek-V3 to M = 24
        ("NVIDIA H100 80GB HBM3", 512, 16, 256),  # at most GEMV_WIDE_MAX_PAIRS
        ("NVIDIA H100 80GB HBM3", 256, 8, 64),  # one word a group: no integer GEMV
        ("NVIDIA H100 80GB HBM3", 64, 16, 32),  # below GEMV_WIDE_MIN_EXPERTS
        ("NVIDIA H100 80GB HBM3", 8, 16, 4),  # Mixtral: one per two
        ("NVIDIA H100 PCIe", 256, 16, 64),  # not measured: GEMV_MAX_PAIRS_MMA
        ("NVIDIA H200", 128, 16, 64),
        ("NVIDIA H200", 256, 16, 64),
        ("NVIDIA A100-SXM4-80GB", 256, 16, 64),
    ],
)
def test_gemv_wide_rule_where_the_gluon_gemm_runs(
    gpu: str, experts: int, group: int, most: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the Gluon GEMM runs, the GEMV takes <= 64 pairs at <= one per two
    experts; on the H100 measured, with >= 128 experts of groups of >= 16, up to 3/4
    pair a expert and 256 pairs."""
    monkeypatch.setattr(fused, "mma_runs", lambda w13, w2: True)
    monkeypatch.setattr(fused, "device_name", lambda a: gpu)
    words = ExpertMatrix(
        data=torch.zeros(experts, 4, 64, dtype=torch.uint8), group_size=group
    )
    assert use_gemv(most, words, enabled=True)
    assert not use_gemv(most + 1, words, enabled=True)
    assert not use_gemv(1, words, enabled=False)


def test_dequant_is_the_prefill_rule() -> None:
    w13 = ExpertMatrix(data=torch.zeros(8, 4, 2, dtype=torch.uint8))
    assert use_dequant(8 * DEQUANT_PAIRS_PER_EXPERT, w13)
    assert not use_dequant(8 * DEQUANT_PAIRS_PER_EXPERT - 1, w13)
    dense = ExpertMatrix(data=torch.zeros(8, 4, 4, dtype=torch.bfloat16))
    assert not use_dequant(8 * DEQUANT_PAIRS_PER_EXPERT, dense)


def test_host_integer_helpers_match_triton() -> None:
    import triton

    for a in range(1, 300):
        assert configs.next_pow2(a) == triton.next_power_of_2(a)
        for b in (1, 3, 16, 64, 128):
            assert configs.ceil_div(a, b) == triton.cdiv(a, b)


def test_pick_tiles_reads_the_dequant_scratch_as_16_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dequant path's GEMMs read 16-bit scratch: the 16-bit table, never the int4
    one (its int32-word, nibble-halves or Gluon tiles); the sizes are the layer's
    (hidden from w2's rows, intermediate from w13's), not the packed widths."""
    monkeypatch.setattr(fused, "is_interpreting", lambda: False)

    def packed(e: int, d: int, f: int) -> tuple[ExpertMatrix, ExpertMatrix]:
        def m(*shape: int) -> ExpertMatrix:  # shape only, on "meta"
            return ExpertMatrix(
                data=torch.empty(shape, dtype=torch.uint8, device="meta")
            )

        return m(e, 2 * f, d // 2), m(e, d, f // 2)

    def table(pairs: int, e: int, d: int, f: int, *, sixteen_bit: bool) -> object:
        return configs.choose_tiles(
            num_pairs=pairs, num_experts=e, hidden_size=d, intermediate_size=f,
            sixteen_bit=sixteen_bit,
        )  # fmt: skip

    w13, w2 = packed(128, 2048, 768)  # Qwen3-30B-A3B at M = 4096
    pairs = 8 * 4096
    assert fused.pick_tiles(pairs, w13, w2, dequant=True) == table(
        pairs, 128, 2048, 768, sixteen_bit=True
    )
    assert fused.pick_tiles(pairs, w13, w2) == table(
        pairs, 128, 2048, 768, sixteen_bit=False
    )
    assert fused.pick_tiles(pairs, w13, w2, dequant=True) != fused.pick_tiles(
        pairs, w13, w2
    )
    w13, w2 = packed(8, 4096, 14336)  # Mixtral at M = 1: the w2 split needs D
    assert fused.pick_tiles(2, w13, w2) == table(2, 8, 4096, 14336, sixteen_bit=False)
    assert fused.pick_tiles(2, w13, w2).w2.split_k == 4


def test_gemv_w2_split_takes_the_tiles_override_and_w2_tiles() -> None:
    """``GemvTiles.w2_split`` (a sweep's override) is taken as given; else the split
    is sized on the grid of the tiles the w2 GEMV runs (``w2_tiles``, 16 rows)."""
    import attrs

    paired = configs.GEMV_PAIRED
    assert paired.w2_tiles is not None
    assert fused.gemv_w2_split(attrs.evolve(paired, w2_split=2), 8, 4096, 1536) == 2
    # 2 pairs, D = F = 4096: 512 programs of 16 rows want split 4, of 8 rows 2
    assert fused.gemv_w2_split(paired, 2, 4096, 4096) == 4
    assert fused.gemv_w2_split(attrs.evolve(paired, w2_tiles=None), 2, 4096, 4096) == 2
