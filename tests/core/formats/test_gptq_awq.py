import pytest
import torch

from core.errors import ConfigError, ShapeError
from core.formats import Int4Projection, from_awq, from_gptq
from tests.core.formats.packers import (
    awq_dequantize,
    awq_pack,
    dequantize_projection,
    gptq_dequantize,
    gptq_pack,
    gptqmodel_v1_qzeros,
)
from tests.tolerances import EXACT

K, N, G = 64, 16, 32


def _codes(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(0, 16, shape, generator=gen, dtype=torch.int64)


def _scales(gen: torch.Generator, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return (torch.rand(K // G, N, generator=gen) * 0.1 + 0.01).to(dtype)


def _assert_plain_groups_exact(
    proj: Int4Projection,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    qzeros: torch.Tensor,
    *,
    v1: bool,
) -> None:
    """``proj`` dequantizes exactly like the format's own math in groups of ``G``."""
    expected_KN = gptq_dequantize(
        qweight, scales, qzeros, (torch.arange(K) // G).tolist(), v1=v1
    )
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float16).T, expected_KN, **EXACT
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gptq_v1_asymmetric_is_exact(
    generator: torch.Generator, dtype: torch.dtype
) -> None:
    codes, zeros = (
        _codes(generator, K, N),
        torch.randint(1, 16, (K // G, N), generator=generator),
    )
    qweight, qzeros = gptq_pack(codes, zeros)
    scales = _scales(generator, dtype)
    g_idx = torch.arange(K, dtype=torch.int32) // G
    proj = from_gptq(qweight, scales, qzeros, g_idx, group_size=G)
    expected_KN = gptq_dequantize(qweight, scales, qzeros, g_idx.tolist())
    torch.testing.assert_close(
        dequantize_projection(proj, dtype).T, expected_KN, **EXACT
    )
    assert proj.zero_point is not None
    assert torch.equal(proj.zero_point.T.long(), zeros)


def test_gptq_v2_stores_zero_points_directly(generator: torch.Generator) -> None:
    codes, zeros = _codes(generator, K, N), _codes(generator, K // G, N)
    qweight, qzeros = gptq_pack(codes, zeros, v1=False)
    scales = _scales(generator)
    proj = from_gptq(qweight, scales, qzeros, checkpoint_format="gptq_v2")
    g_idx = (torch.arange(K) // G).tolist()
    expected_KN = gptq_dequantize(qweight, scales, qzeros, g_idx, v1=False)
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float16).T, expected_KN, **EXACT
    )


def test_gptq_symmetric_is_zero_point_eight(generator: torch.Generator) -> None:
    codes = _codes(generator, K, N)
    qweight, qzeros = gptq_pack(codes, torch.full((K // G, N), 8))
    scales = _scales(generator)
    proj = from_gptq(qweight, scales, qzeros, symmetric=True)
    assert proj.zero_point is None
    expected_KN = gptq_dequantize(
        qweight, scales, qzeros, (torch.arange(K) // G).tolist()
    )
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float16).T, expected_KN, **EXACT
    )
    kept = from_gptq(qweight, scales, qzeros, symmetric=False)
    assert kept.zero_point is not None
    assert bool((kept.zero_point == 8).all())


def test_gptq_symmetric_refuses_other_zero_points(generator: torch.Generator) -> None:
    qweight, qzeros = gptq_pack(_codes(generator, K, N), torch.full((K // G, N), 7))
    with pytest.raises(ConfigError, match="every zero point equal to 8"):
        from_gptq(qweight, _scales(generator), qzeros, symmetric=True)


def test_gptq_v1_code_fifteen_is_read_only_as_gptqmodels_borrow(
    generator: torch.Generator,
) -> None:
    """A zero point of 0 in GPTQModel's v1 is a stored 15 that borrowed from the nibble
    above (a chain of them at columns 3-5, one at a word's last nibble, column 7):
    refused by default, exact with ``v1_word_carry``."""
    codes = _codes(generator, K, N)
    zeros = torch.randint(1, 16, (K // G, N), generator=generator)
    zeros[0, 3:6] = 0
    zeros[1, 7] = 0
    qweight, v2 = gptq_pack(codes, zeros, v1=False)
    v1 = gptqmodel_v1_qzeros(v2)
    scales = _scales(generator)
    with pytest.raises(
        ConfigError,
        match="qzeros must hold GPTQ v1 codes 0-14 unless GPTQModel wrote them, got a 15",
    ):
        from_gptq(qweight, scales, v1)
    proj = from_gptq(qweight, scales, v1, v1_word_carry=True)
    assert proj.zero_point is not None
    assert torch.equal(proj.zero_point.T.long(), zeros)
    _assert_plain_groups_exact(proj, qweight, scales, v2, v1=False)


def test_gptq_v1_word_carry_changes_nothing_without_a_fifteen(
    generator: torch.Generator,
) -> None:
    zeros = torch.randint(1, 16, (K // G, N), generator=generator)
    qweight, v1 = gptq_pack(_codes(generator, K, N), zeros)
    _, v2 = gptq_pack(_codes(generator, K, N), zeros, v1=False)
    assert torch.equal(gptqmodel_v1_qzeros(v2), v1)  # the two v1 writers agree here
    scales = _scales(generator)
    carried = from_gptq(qweight, scales, v1, v1_word_carry=True)
    plain = from_gptq(qweight, scales, v1)
    assert carried.zero_point is not None
    assert plain.zero_point is not None
    assert torch.equal(carried.zero_point, plain.zero_point)


@pytest.mark.parametrize("v1", [True, False], ids=["v1", "v2"])
def test_gptq_unknown_format_reads_symmetric_zero_points(
    v1: bool, generator: torch.Generator
) -> None:
    qweight, qzeros = gptq_pack(
        _codes(generator, K, N), torch.full((K // G, N), 8), v1=v1
    )
    scales = _scales(generator)
    proj = from_gptq(qweight, scales, qzeros, checkpoint_format=None)
    assert proj.zero_point is None
    _assert_plain_groups_exact(proj, qweight, scales, qzeros, v1=v1)


def test_gptq_unknown_format_refuses_asymmetric_zero_points(
    generator: torch.Generator,
) -> None:
    zeros = torch.randint(1, 16, (K // G, N), generator=generator)
    qweight, qzeros = gptq_pack(_codes(generator, K, N), zeros)
    with pytest.raises(ConfigError, match=r"not all the symmetric 8 .*got none: pass"):
        from_gptq(qweight, _scales(generator), qzeros, checkpoint_format=None)


def _padded_qzeros(code: int, pad: int, n: int, rows: int) -> torch.Tensor:
    """qzeros ``(rows, ceil(n/8))`` with every real nibble ``code`` and the nibbles
    past ``n`` in the last word ``pad``."""
    nibbles = [code] * n + [pad] * (-n % 8)
    words = [
        sum(v << (4 * j) for j, v in enumerate(nibbles[i : i + 8]))
        for i in range(0, len(nibbles), 8)
    ]
    signed = [w - (1 << 32) if w >= 1 << 31 else w for w in words]
    return torch.tensor([signed] * rows, dtype=torch.int32)


@pytest.mark.parametrize("pad", [0, 15])
@pytest.mark.parametrize("v1", [True, False], ids=["v1", "v2"])
def test_gptq_unknown_format_ignores_the_padding_of_the_last_qzeros_word(
    v1: bool, pad: int, generator: torch.Generator
) -> None:
    """N = 12: qzeros hold 2 words per row, the last with 4 padding nibbles that
    neither decide the format nor count as a v1 stored 15."""
    n = 12
    qweight, _ = gptq_pack(_codes(generator, K, n), torch.full((K // G, n), 8))
    qzeros = _padded_qzeros(7 if v1 else 8, pad, n, K // G)
    scales = (torch.rand(K // G, n, generator=generator) * 0.1 + 0.01).half()
    proj = from_gptq(qweight, scales, qzeros, checkpoint_format=None)
    assert proj.zero_point is None
    expected_KN = gptq_dequantize(
        qweight, scales, qzeros, (torch.arange(K) // G).tolist(), v1=v1
    )
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float16).T, expected_KN, **EXACT
    )


def test_gptq_block_relabelled_g_idx_is_honoured(generator: torch.Generator) -> None:
    codes, zeros = (
        _codes(generator, K, N),
        torch.randint(1, 16, (K // G, N), generator=generator),
    )
    qweight, qzeros = gptq_pack(codes, zeros)
    scales = _scales(generator)
    g_idx = [1] * G + [0] * G
    proj = from_gptq(qweight, scales, qzeros, torch.tensor(g_idx, dtype=torch.int32))
    expected_KN = gptq_dequantize(qweight, scales, qzeros, g_idx)
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float16).T, expected_KN, **EXACT
    )


def test_gptq_act_order_g_idx_is_refused(generator: torch.Generator) -> None:
    qweight, qzeros = gptq_pack(_codes(generator, K, N), torch.full((K // G, N), 8))
    g_idx = torch.randperm(K, generator=generator) // G
    with pytest.raises(ConfigError, match="act-order"):
        from_gptq(qweight, _scales(generator), qzeros, g_idx)


def test_gptq_group_size_that_does_not_divide_is_refused(
    generator: torch.Generator,
) -> None:
    qweight, qzeros = gptq_pack(_codes(generator, K, N), torch.full((K // G, N), 8))
    with pytest.raises(ShapeError, match="does not divide the input dim 64"):
        from_gptq(qweight, _scales(generator), qzeros, group_size=48)
    three_rows = torch.ones(3, N, dtype=torch.float16)
    with pytest.raises(ShapeError, match="do not divide the input dim 64"):
        from_gptq(qweight, three_rows, None)


def test_gptq_declared_group_must_match_shapes(generator: torch.Generator) -> None:
    qweight, qzeros = gptq_pack(_codes(generator, K, N), torch.full((K // G, N), 8))
    with pytest.raises(ConfigError, match="imply group_size=32"):
        from_gptq(qweight, _scales(generator), qzeros, group_size=16)


def test_gptq_stacked_experts_match_per_expert(generator: torch.Generator) -> None:
    packed = [
        gptq_pack(
            _codes(generator, K, N),
            torch.randint(1, 16, (K // G, N), generator=generator),
        )
        for _ in range(3)
    ]
    scales = [_scales(generator) for _ in range(3)]
    stacked = from_gptq(
        torch.stack([p[0] for p in packed]),
        torch.stack(scales),
        torch.stack([p[1] for p in packed]),
    )
    for e in range(3):
        one = from_gptq(packed[e][0], scales[e], packed[e][1])
        assert torch.equal(stacked.qdata[e], one.qdata)
        assert stacked.zero_point is not None
        assert one.zero_point is not None
        assert torch.equal(stacked.zero_point[e], one.zero_point)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_awq_is_exact(generator: torch.Generator, dtype: torch.dtype) -> None:
    codes, zeros = _codes(generator, K, N), _codes(generator, K // G, N)
    qweight, qzeros = awq_pack(codes, zeros)
    scales = _scales(generator, dtype)
    proj = from_awq(qweight, scales, qzeros, group_size=G)
    expected_KN = awq_dequantize(qweight, scales, qzeros, G)
    torch.testing.assert_close(
        dequantize_projection(proj, dtype).T, expected_KN, **EXACT
    )
    assert proj.zero_point is not None
    assert torch.equal(proj.zero_point.T.long(), zeros)


def test_awq_interleave_is_not_identity(generator: torch.Generator) -> None:
    codes = torch.arange(8).repeat(K, N // 8)
    qweight, qzeros = awq_pack(codes, torch.zeros(K // G, N, dtype=torch.int64))
    proj = from_awq(qweight, _scales(generator), qzeros)
    assert int(qweight[0, 0]) == 0x75316420  # nibbles hold columns 0,2,4,6,1,3,5,7
    assert torch.equal(
        proj.qdata[:8, 0],
        torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], dtype=torch.uint8) * 17,
    )


def test_awq_group_size_that_does_not_divide_is_refused(
    generator: torch.Generator,
) -> None:
    qweight, qzeros = awq_pack(_codes(generator, K, N), _codes(generator, K // G, N))
    with pytest.raises(ShapeError, match="group_size=24 does not divide"):
        from_awq(qweight, _scales(generator), qzeros, group_size=24)


def _partial_group_tensors(
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """K=96 quantized with group 64: two scale rows, the last group partial."""
    k = 96
    codes, zeros = _codes(gen, k, N), _codes(gen, 2, N)
    scales = (torch.rand(2, N, generator=gen) * 0.1 + 0.01).to(torch.float16)
    return codes, zeros, scales, torch.arange(k, dtype=torch.int32) // 64


def test_partial_last_group_is_refused_not_misread(
    generator: torch.Generator,
) -> None:
    codes, zeros, scales, g_idx = _partial_group_tensors(generator)
    qweight, qzeros = gptq_pack(codes, zeros, v1=False)
    with pytest.raises(ConfigError, match="implying group_size=48"):
        from_gptq(qweight, scales, qzeros, checkpoint_format="gptq_v2")
    with pytest.raises(
        ShapeError, match="group size 64 does not divide the input dim 96"
    ):
        from_gptq(qweight, scales, qzeros, g_idx, checkpoint_format="gptq_v2")
    with pytest.raises(
        ShapeError, match="group_size=64 does not divide the input dim 96"
    ):
        from_gptq(qweight, scales, qzeros, group_size=64, checkpoint_format="gptq_v2")
    aw_qweight, aw_qzeros = awq_pack(codes, zeros)
    with pytest.raises(ConfigError, match="implying group_size=48"):
        from_awq(aw_qweight, scales, aw_qzeros)


def test_gptq_g_idx_must_have_one_entry_per_input_column(
    generator: torch.Generator,
) -> None:
    qweight, qzeros = gptq_pack(_codes(generator, K, N), torch.full((K // G, N), 8))
    short = torch.arange(K // 2, dtype=torch.int32) // G
    with pytest.raises(ShapeError, match=r"g_idx must have shape \(K,\) = \(64,\)"):
        from_gptq(qweight, _scales(generator), qzeros, short)


def test_declared_group_larger_than_k_with_one_row_is_exact(
    generator: torch.Generator,
) -> None:
    # AutoGPTQ / AutoAWQ with group 128 on K=64 store ceil(64/128) = 1 scale row.
    codes, zeros = (
        _codes(generator, K, N),
        torch.randint(1, 16, (1, N), generator=generator),
    )
    scales = (torch.rand(1, N, generator=generator) * 0.1 + 0.01).to(torch.float16)
    qweight, qzeros = gptq_pack(codes, zeros)
    proj = from_gptq(qweight, scales, qzeros, group_size=128)
    assert proj.group_size == K
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float16).T,
        gptq_dequantize(qweight, scales, qzeros, [0] * K),
        **EXACT,
    )
    aw_qweight, aw_qzeros = awq_pack(codes, zeros)
    aw_proj = from_awq(aw_qweight, scales, aw_qzeros, group_size=128)
    torch.testing.assert_close(
        dequantize_projection(aw_proj, torch.float16).T,
        awq_dequantize(aw_qweight, scales, aw_qzeros, K),
        **EXACT,
    )


def _gptq_packed(
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qweight, qzeros = gptq_pack(_codes(gen, K, N), torch.randint(1, 16, (K // G, N)))
    return qweight, _scales(gen), qzeros


def test_gptq_qzeros_too_narrow_for_n_are_refused(generator: torch.Generator) -> None:
    """qzeros ``(K/G, N/8)`` with a word column missing: zero points for 8 of 16 rows."""
    qweight, scales, qzeros = _gptq_packed(generator)
    with pytest.raises(
        ShapeError, match=r"qzeros must be \(K/G=2, N/8=2\), got \(2, 1\)"
    ):
        from_gptq(qweight, scales, qzeros[:, :1], group_size=G)


def test_gptq_scales_of_another_n_are_refused(generator: torch.Generator) -> None:
    """scales ``(K/G, N)`` must have the N columns that qweight packs, and two dims."""
    qweight, scales, qzeros = _gptq_packed(generator)
    with pytest.raises(
        ShapeError,
        match=r"scales must be \(K/G, N\) with N=16 from qweight, got \(2, 8\)",
    ):
        from_gptq(qweight, scales[:, :8], qzeros, group_size=G)
    with pytest.raises(ShapeError, match=r"scales must be \(K/G, N\) with N=16"):
        from_gptq(qweight, scales[None], qzeros, group_size=G)


def test_gptq_one_dim_scales_are_a_shape_error(generator: torch.Generator) -> None:
    """1-D scales: a ShapeError naming them, not an IndexError from a transpose."""
    qweight, scales, qzeros = _gptq_packed(generator)
    with pytest.raises(
        ShapeError,
        match=r"scales must be \(K/G, N\) with N=16 from qweight, got \(16,\)",
    ):
        from_gptq(qweight, scales[0], qzeros, group_size=G)


def test_awq_qzeros_of_another_group_count_are_refused(
    generator: torch.Generator,
) -> None:
    """AWQ qzeros ``(K/G, N/8)`` must have the scales' group count."""
    qweight, qzeros = awq_pack(
        _codes(generator, K, N), torch.randint(0, 16, (K // G, N), generator=generator)
    )
    with pytest.raises(
        ShapeError, match=r"qzeros must be \(K/G=2, N/8=2\), got \(1, 2\)"
    ):
        from_awq(qweight, _scales(generator), qzeros[:1])


def test_gptq_qzeros_wider_than_n_are_refused(generator: torch.Generator) -> None:
    """qzeros with a word column too many (another projection's, say) are not cut."""
    qweight, scales, qzeros = _gptq_packed(generator)
    wide = torch.cat([qzeros, qzeros], dim=-1)
    with pytest.raises(
        ShapeError, match=r"qzeros must be \(K/G=2, N/8=2\), got \(2, 4\)"
    ):
        from_gptq(qweight, scales, wide, group_size=G)


def test_gptq_asymmetric_without_qzeros_is_refused(generator: torch.Generator) -> None:
    """``symmetric=False`` and no zero points: refused, not read as zero point 8."""
    qweight, scales, _ = _gptq_packed(generator)
    with pytest.raises(ConfigError, match=r"symmetric=False .* needs qzeros, got None"):
        from_gptq(qweight, scales, None, group_size=G, symmetric=False)


def test_stacks_whose_experts_disagree_are_refused(generator: torch.Generator) -> None:
    """A stack of 2 experts' qweight with 1 expert's scales or zero points, in either
    format: the leading dims must match, not broadcast or pass."""
    qweight, scales, qzeros = _gptq_packed(generator)
    two = torch.stack([qweight, qweight])
    with pytest.raises(
        ShapeError, match=r"scales must have the leading dims of qweight"
    ):
        from_gptq(two, scales[None], torch.stack([qzeros, qzeros]), group_size=G)
    with pytest.raises(
        ShapeError, match=r"qzeros must have the leading dims of qweight"
    ):
        from_gptq(two, torch.stack([scales, scales]), qzeros[None], group_size=G)
    aq, az = awq_pack(
        _codes(generator, K, N), torch.randint(0, 16, (K // G, N), generator=generator)
    )
    s = _scales(generator)
    with pytest.raises(
        ShapeError, match=r"scales must have the leading dims of qweight"
    ):
        from_awq(torch.stack([aq, aq]), s[None], torch.stack([az, az]))
    with pytest.raises(
        ShapeError, match=r"qzeros must have the leading dims of qweight"
    ):
        from_awq(torch.stack([aq, aq]), torch.stack([s, s]), az[None])
