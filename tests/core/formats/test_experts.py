import pytest
import torch

from core.errors import ConfigError, DTypeError, ShapeError
from core.formats import (
    Int4Projection,
    assemble_experts,
    assemble_per_expert,
    concat_rows,
    deinterleave_rows,
    split_experts,
    stack_projections,
)
from core.quantize import (
    dequantize_expert_weights,
    quantize_expert_weights,
    quantize_tensor,
)
from core.scheme import (
    INT4_ASYM,
    INT4_ASYM_G32,
    INT4_SYM,
    INT4_SYM_G32,
    Int4Mapping,
    Int4Scheme,
)
from tests.core.formats.packers import dequantize_projection
from tests.tolerances import EXACT

E, F, D = 3, 32, 64


def _proj(
    gen: torch.Generator, n: int, k: int, *, asym: bool = False
) -> Int4Projection:
    scheme = INT4_ASYM_G32 if asym else INT4_SYM_G32
    qdata, qp = quantize_tensor(
        torch.randn(n, k, generator=gen), scheme, scale_dtype=torch.bfloat16
    )
    return Int4Projection(
        qdata=qdata, scale=qp.scale, zero_point=qp.zero_point, group_size=32
    )


def test_per_expert_assembly_puts_gate_rows_before_up_rows(
    generator: torch.Generator,
) -> None:
    gate = [_proj(generator, F, D) for _ in range(E)]
    up = [_proj(generator, F, D) for _ in range(E)]
    down = [_proj(generator, D, F) for _ in range(E)]
    weights = assemble_per_expert(gate, up, down)
    assert weights.scheme == INT4_SYM_G32
    w13, w2 = dequantize_expert_weights(weights)
    for e in range(E):
        torch.testing.assert_close(
            w13[e, :F], dequantize_projection(gate[e], torch.float32), **EXACT
        )
        torch.testing.assert_close(
            w13[e, F:], dequantize_projection(up[e], torch.float32), **EXACT
        )
        torch.testing.assert_close(
            w2[e], dequantize_projection(down[e], torch.float32), **EXACT
        )


def test_fused_three_d_assembly_round_trips(generator: torch.Generator) -> None:
    w13, w2 = (
        torch.randn(E, 2 * F, D, generator=generator),
        torch.randn(E, D, F, generator=generator),
    )
    weights = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    again = assemble_experts(*split_experts(weights))
    for name, tensor in weights.tensors().items():
        assert torch.equal(again.tensors()[name], tensor), name
    assert again.scheme == weights.scheme


def test_mixed_symmetric_and_asymmetric_experts_fill_the_implicit_eight(
    generator: torch.Generator,
) -> None:
    gate = [_proj(generator, F, D, asym=e == 1) for e in range(E)]
    up = [_proj(generator, F, D) for _ in range(E)]
    down = [_proj(generator, D, F) for _ in range(E)]
    weights = assemble_per_expert(gate, up, down)
    assert weights.scheme.mapping is Int4Mapping.ASYMMETRIC
    assert weights.w2_zero_point is not None
    assert bool((weights.w2_zero_point == 8).all())
    w13, _ = dequantize_expert_weights(weights)
    torch.testing.assert_close(
        w13[0, :F], dequantize_projection(gate[0], torch.float32), **EXACT
    )
    torch.testing.assert_close(
        w13[1, :F], dequantize_projection(gate[1], torch.float32), **EXACT
    )


def test_deinterleave_rows_splits_gate_and_up(generator: torch.Generator) -> None:
    fused = _proj(generator, 2 * F, D)
    split = deinterleave_rows(fused)
    assert torch.equal(split.qdata[:F], fused.qdata[0::2])
    assert torch.equal(split.scale[F:], fused.scale[1::2])


def test_inconsistent_experts_are_refused(generator: torch.Generator) -> None:
    with pytest.raises(ShapeError, match="expert 1 has packed shape"):
        stack_projections("gate", [_proj(generator, F, D), _proj(generator, F, 2 * D)])
    with pytest.raises(ShapeError, match="one gate, up and down projection per expert"):
        assemble_per_expert([_proj(generator, F, D)], [], [])
    with pytest.raises(ShapeError, match="cannot stack rows"):
        concat_rows("w13", _proj(generator, F, D), _proj(generator, F, 2 * D))


def test_gate_and_up_of_other_row_counts_are_refused(
    generator: torch.Generator,
) -> None:
    """34 gate rows and 30 up rows add up to 2F = 64 but would move gate rows to up."""
    gate, up = [_proj(generator, F + 2, D)], [_proj(generator, F - 2, D)]
    with pytest.raises(
        ShapeError, match=r"w13: gate and up must have one out_features .* 34 and 30"
    ):
        assemble_per_expert(gate, up, [_proj(generator, D, F)])


def test_groups_without_one_supported_size_are_refused(
    generator: torch.Generator,
) -> None:
    w13 = stack_projections("w13", [_proj(generator, 2 * D, D)])
    qdata, qp = quantize_tensor(
        torch.randn(1, D, D, generator=generator), INT4_SYM, scale_dtype=torch.bfloat16
    )
    w2 = Int4Projection(qdata=qdata, scale=qp.scale, zero_point=None, group_size=D)
    with pytest.raises(ConfigError, match="must be one supported size"):
        assemble_experts(w13, w2)


def test_scale_dtype_mismatch_is_a_dtype_error(generator: torch.Generator) -> None:
    bf16 = _proj(generator, F, D)
    fp16 = Int4Projection(
        qdata=bf16.qdata,
        scale=bf16.scale.to(torch.float16),
        zero_point=None,
        group_size=32,
    )
    with pytest.raises(DTypeError, match=r"one scale dtype, got torch\.bfloat16"):
        concat_rows("w13", bf16, fp16)
    with pytest.raises(DTypeError, match=r"expert 1 has scale dtype torch\.float16"):
        stack_projections("gate", [bf16, fp16])


@pytest.mark.parametrize("scheme", [INT4_SYM, INT4_ASYM], ids=lambda s: s.name)
def test_whole_row_groups_split_and_assemble_with_their_own_sizes(
    scheme: Int4Scheme, generator: torch.Generator
) -> None:
    """One group a row: w13's group is D and w2's F (D != F here), and back, exactly."""
    weights = quantize_expert_weights(
        torch.randn(E, 2 * F, D, generator=generator),
        torch.randn(E, D, F, generator=generator),
        scheme,
    )
    w13, w2 = split_experts(weights)
    assert (w13.group_size, w2.group_size) == (D, F)
    again = assemble_experts(w13, w2)
    assert again.scheme == scheme
    for name, tensor in weights.tensors().items():
        assert torch.equal(again.tensors()[name], tensor), name


def test_experts_of_other_group_sizes_are_refused(generator: torch.Generator) -> None:
    qdata, qp = quantize_tensor(
        torch.randn(F, D, generator=generator),
        Int4Scheme(group_size=64),
        scale_dtype=torch.bfloat16,
    )
    g64 = Int4Projection(qdata=qdata, scale=qp.scale, zero_point=None, group_size=64)
    with pytest.raises(
        ShapeError, match="gate: expert 1 has group_size=64, expected 32 like expert 0"
    ):
        stack_projections("gate", [_proj(generator, F, D), g64])


def test_w2_of_another_intermediate_size_is_refused(generator: torch.Generator) -> None:
    w13 = stack_projections("w13", [_proj(generator, 2 * F, D)])
    w2 = stack_projections("down", [_proj(generator, D, 2 * F)])
    with pytest.raises(
        ShapeError, match=r"w13 must be \(E, 2F, D\) and w2 \(E, D, F\)"
    ):
        assemble_experts(w13, w2)
