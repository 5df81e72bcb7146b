"""compressed-tensors' own packing and decompression are the outside reference here."""

import attrs
import pytest
import torch
from compressed_tensors.compressors.pack_quantized.base import (
    PackedQuantizationCompressor,
)
from compressed_tensors.compressors.pack_quantized.helpers import (
    pack_to_int32,
    unpack_from_int32,
)
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationScheme,
    QuantizationStrategy,
    QuantizationType,
)

from core.errors import ConfigError, DTypeError, ShapeError
from core.formats import (
    Int4Projection,
    export_expert_weights,
    from_compressed_tensors,
    quantization_config,
    to_compressed_tensors,
)
from core.formats.experts import split_experts
from core.quantize import dequantize_expert, quantize_expert_weights
from core.scheme import INT4_ASYM_G32, INT4_SYM, INT4_SYM_G32, Int4Scheme
from tests.core.formats.packers import dequantize_projection
from tests.tolerances import EXACT


def _scheme(*, symmetric: bool, group_size: int | None) -> QuantizationScheme:
    strategy = (
        QuantizationStrategy.CHANNEL
        if group_size is None
        else QuantizationStrategy.GROUP
    )
    args = QuantizationArgs(
        num_bits=4,
        type=QuantizationType.INT,
        symmetric=symmetric,
        strategy=strategy,
        group_size=group_size,
    )
    return QuantizationScheme(targets=["Linear"], weights=args)


def _their_compress(
    gen: torch.Generator,
    n: int,
    k: int,
    *,
    symmetric: bool,
    group_size: int | None,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[dict[str, torch.Tensor], QuantizationScheme]:
    """A float weight quantized and packed by compressed-tensors' own compressor."""
    groups = 1 if group_size is None else k // group_size
    weight = torch.randn(n, k, generator=gen).to(dtype)
    scale = (torch.rand(n, groups, generator=gen) * 0.2 + 0.05).to(dtype)
    state: dict[str, torch.Tensor | None] = {"weight": weight, "weight_scale": scale}
    if not symmetric:
        state["weight_zero_point"] = torch.randint(
            -8, 8, (n, groups), generator=gen, dtype=torch.int8
        )
    scheme = _scheme(symmetric=symmetric, group_size=group_size)
    packed = PackedQuantizationCompressor.compress(state, scheme)
    return {k: v for k, v in packed.items() if v is not None}, scheme


def _their_weight(
    state: dict[str, torch.Tensor], scheme: QuantizationScheme
) -> torch.Tensor:
    unpacked = PackedQuantizationCompressor.decompress(dict(state.items()), scheme)
    weight = unpacked["weight"]
    assert weight is not None
    return weight


def _import(state: dict[str, torch.Tensor]) -> Int4Projection:
    return from_compressed_tensors(
        state["weight_packed"],
        state["weight_scale"],
        state.get("weight_zero_point"),
        state["weight_shape"],
    )


CASES = [
    pytest.param(True, 32, 24, 64, id="sym_g32"),
    pytest.param(False, 32, 24, 64, id="asym_g32_N24"),
    pytest.param(False, 64, 12, 128, id="asym_g64_N12_padded_zero"),
    pytest.param(True, None, 16, 36, id="sym_channel_K36_padded"),
    pytest.param(False, None, 13, 36, id="asym_channel_N13_K36_padded"),
]


@pytest.mark.parametrize(("symmetric", "group_size", "n", "k"), CASES)
def test_import_equals_their_decompression(
    generator: torch.Generator, symmetric: bool, group_size: int | None, n: int, k: int
) -> None:
    state, scheme = _their_compress(
        generator, n, k, symmetric=symmetric, group_size=group_size
    )
    proj = _import(state)
    assert (proj.zero_point is None) == symmetric
    theirs = _their_weight(state, scheme)
    torch.testing.assert_close(
        dequantize_projection(proj, theirs.dtype), theirs, **EXACT
    )


@pytest.mark.parametrize(("symmetric", "group_size", "n", "k"), CASES)
def test_codes_and_zero_points_equal_their_unpacking(
    generator: torch.Generator, symmetric: bool, group_size: int | None, n: int, k: int
) -> None:
    state, _ = _their_compress(
        generator, n, k, symmetric=symmetric, group_size=group_size
    )
    proj = _import(state)
    signed = unpack_from_int32(state["weight_packed"], 4, torch.Size((n, k)))
    from core.packing import unpack_int4

    assert torch.equal(
        unpack_int4(proj.qdata).to(torch.int16), signed.to(torch.int16) + 8
    )
    if not symmetric:
        groups = proj.scale.shape[-1]
        zp = unpack_from_int32(
            state["weight_zero_point"], 4, torch.Size((n, groups)), packed_dim=0
        )
        assert proj.zero_point is not None
        assert torch.equal(proj.zero_point.to(torch.int16), zp.to(torch.int16) + 8)


@pytest.mark.parametrize(("symmetric", "group_size", "n", "k"), CASES)
def test_export_is_byte_identical_to_their_packing(
    generator: torch.Generator, symmetric: bool, group_size: int | None, n: int, k: int
) -> None:
    state, scheme = _their_compress(
        generator, n, k, symmetric=symmetric, group_size=group_size
    )
    exported = to_compressed_tensors(_import(state))
    assert exported.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(exported[name], tensor), name
    torch.testing.assert_close(
        _their_weight(exported, scheme), _their_weight(state, scheme), **EXACT
    )


def test_round_trip_of_our_quantized_experts(generator: torch.Generator) -> None:
    w13, w2 = (
        torch.randn(3, 64, 96, generator=generator),
        torch.randn(3, 96, 32, generator=generator),
    )
    for scheme in (INT4_SYM_G32, INT4_ASYM_G32, INT4_SYM):
        weights = quantize_expert_weights(w13, w2, scheme, scale_dtype=torch.float16)
        tensors = export_expert_weights(
            weights, prefix="mlp.experts", names=("w1", "w3", "w2")
        )
        assert len(tensors) == 3 * 3 * (4 if scheme.has_zero_point else 3)
        theirs = _scheme(
            symmetric=not scheme.has_zero_point,
            group_size=None if scheme.group_size == -1 else scheme.group_size,
        )
        for e in range(3):
            ref13, ref2 = dequantize_expert(weights, e, dtype=torch.float16)
            for proj, rows, ref in (
                ("w1", slice(0, 32), ref13),
                ("w3", slice(32, 64), ref13),
                ("w2", slice(None), ref2),
            ):
                local = {
                    k.rsplit(".", 1)[1]: v
                    for k, v in tensors.items()
                    if k.startswith(f"mlp.experts.{e}.{proj}.")
                }
                torch.testing.assert_close(
                    _their_weight(local, theirs), ref[rows], **EXACT
                )


def test_stacked_three_d_import(generator: torch.Generator) -> None:
    signed = torch.randint(-8, 8, (4, 16, 64), generator=generator, dtype=torch.int8)
    zp = torch.randint(-8, 8, (4, 16, 2), generator=generator, dtype=torch.int8)
    scale = torch.rand(4, 16, 2, generator=generator).to(torch.bfloat16)
    proj = from_compressed_tensors(
        pack_to_int32(signed, 4),
        scale,
        pack_to_int32(zp, 4, packed_dim=0),
        torch.tensor([4, 16, 64]),
    )
    assert proj.qdata.shape == (4, 16, 32)
    expected = (
        signed.float() - zp.float().repeat_interleave(32, -1)
    ) * scale.float().repeat_interleave(32, -1)
    torch.testing.assert_close(
        dequantize_projection(proj, torch.float32), expected, **EXACT
    )


def test_group_g_idx_blocks_honoured_and_scattered_refused(
    generator: torch.Generator,
) -> None:
    state, _ = _their_compress(generator, 8, 64, symmetric=True, group_size=32)
    swapped = torch.tensor([1] * 32 + [0] * 32, dtype=torch.int32)
    proj = from_compressed_tensors(
        state["weight_packed"],
        state["weight_scale"],
        None,
        state["weight_shape"],
        swapped,
    )
    assert torch.equal(proj.scale, state["weight_scale"].flip(-1))
    scattered = torch.arange(64, dtype=torch.int32) % 2
    with pytest.raises(ConfigError, match="act-order"):
        from_compressed_tensors(
            state["weight_packed"],
            state["weight_scale"],
            None,
            state["weight_shape"],
            scattered,
        )


def test_malformed_inputs_are_refused(generator: torch.Generator) -> None:
    state, _ = _their_compress(generator, 8, 64, symmetric=True, group_size=32)
    with pytest.raises(ShapeError, match="weight_shape"):
        from_compressed_tensors(
            state["weight_packed"], state["weight_scale"], None, torch.tensor([8, 80])
        )
    with pytest.raises(ShapeError, match="group_size=48 does not divide"):
        from_compressed_tensors(
            state["weight_packed"],
            state["weight_scale"],
            None,
            state["weight_shape"],
            group_size=48,
        )
    with pytest.raises(ShapeError, match="do not divide the input dim 64"):
        from_compressed_tensors(
            state["weight_packed"], torch.ones(8, 3, dtype=torch.bfloat16)
        )


def test_quantization_config_is_accepted_by_compressed_tensors() -> None:
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationConfig

    for scheme in (
        INT4_SYM_G32,
        Int4Scheme(mapping="asymmetric", group_size=128),
        INT4_SYM,
    ):
        parsed = QuantizationConfig.model_validate(quantization_config(scheme))
        group = parsed.config_groups["group_0"]
        assert isinstance(group, QuantizationScheme)
        weights = group.weights
        assert weights is not None
        assert weights.symmetric is not scheme.has_zero_point
        assert parsed.format == CompressionFormat.pack_quantized.value


def test_partial_last_group_and_bad_g_idx_are_refused(
    generator: torch.Generator,
) -> None:
    # K=96 with group 64: compressed-tensors stores ceil(96/64) = 2 scale columns.
    signed = torch.randint(-8, 8, (8, 96), generator=generator, dtype=torch.int8)
    packed = pack_to_int32(signed, 4)
    scale = torch.rand(8, 2, generator=generator).to(torch.bfloat16)
    shape = torch.tensor([8, 96])
    with pytest.raises(ConfigError, match="implying group_size=48"):
        from_compressed_tensors(packed, scale, None, shape)
    by_group = torch.arange(96, dtype=torch.int32) // 64
    with pytest.raises(
        ShapeError, match="group size 64 does not divide the input dim 96"
    ):
        from_compressed_tensors(packed, scale, None, shape, by_group)
    with pytest.raises(
        ShapeError, match=r"weight_g_idx must have shape \(K,\) = \(96,\)"
    ):
        from_compressed_tensors(packed, scale, None, shape, by_group[:64])


def test_unpacked_int8_zero_points_are_refused_by_name(
    generator: torch.Generator,
) -> None:
    """Checkpoints older than packed zero points stored them as int8 ``(N, K/G)``."""
    state, _ = _their_compress(generator, 16, 64, symmetric=False, group_size=32)
    zp = unpack_from_int32(
        state["weight_zero_point"], 4, torch.Size((16, 2)), packed_dim=0
    )
    state["weight_zero_point"] = zp.to(torch.int8)
    with pytest.raises(DTypeError, match="got int8: zero points stored unpacked"):
        _import(state)


def test_zero_points_with_a_whole_extra_word_are_refused(
    generator: torch.Generator,
) -> None:
    """``ceil(N/8)`` words: a third word for 16 rows would be another N, not padding."""
    state, _ = _their_compress(generator, 16, 64, symmetric=False, group_size=32)
    zp = state["weight_zero_point"]
    assert zp.shape == (2, 2)
    from_compressed_tensors(state["weight_packed"], state["weight_scale"], zp)
    padded = torch.cat([zp, torch.zeros_like(zp[:1])])
    with pytest.raises(
        ShapeError,
        match=r"weight_zero_point must pack N=16 rows into ceil\(N/8\) words",
    ):
        from_compressed_tensors(state["weight_packed"], state["weight_scale"], padded)


def test_stacks_whose_experts_disagree_are_refused(generator: torch.Generator) -> None:
    """A stack of 2 experts' weight_packed with 1 expert's scales or zero points."""
    weights = quantize_expert_weights(
        torch.randn(2, 64, 64, generator=generator),
        torch.randn(2, 64, 32, generator=generator),
        INT4_ASYM_G32,
    )
    state = to_compressed_tensors(split_experts(weights)[0])
    packed, scale = state["weight_packed"], state["weight_scale"]
    zero = state["weight_zero_point"]
    with pytest.raises(
        ShapeError, match=r"weight_scale must have the leading dims of weight_packed"
    ):
        from_compressed_tensors(packed, scale[:1], zero)
    with pytest.raises(
        ShapeError,
        match=r"weight_zero_point must have the leading dims of weight_packed",
    ):
        from_compressed_tensors(packed, scale, zero[:1])


def test_export_refuses_expert_biases(generator: torch.Generator) -> None:
    """Biases have no tensors in this export and no loader reads them back: refused."""
    weights = attrs.evolve(
        quantize_expert_weights(
            torch.randn(2, 64, 64, generator=generator),
            torch.randn(2, 64, 32, generator=generator),
            INT4_SYM_G32,
        ),
        w13_bias=torch.randn(2, 64, generator=generator),
        w2_bias=torch.randn(2, 64, generator=generator),
    )
    with pytest.raises(ConfigError, match=r"does not export expert biases"):
        export_expert_weights(weights)
