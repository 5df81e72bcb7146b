"""choose_qparams / quantize / dequantize: SQNR floors, exactness, idempotence, errors."""

import pytest
import torch

from core.errors import ShapeError
from core.packing import unpack_int4
from core.quantize import (
    choose_qparams,
    dequantize,
    dequantize_expert,
    dequantize_expert_weights,
    quantize,
    quantize_expert_weights,
)
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, Int4Mapping, Int4Scheme
from tests.dense import dequant_f64
from tests.tolerances import EXACT, SQNR_FLOOR_DB, sqnr_db

ALL_SCHEMES = [
    Int4Scheme(mapping=m, group_size=g)
    for m in Int4Mapping
    for g in (32, 64, 128, 256, -1)
]


@pytest.mark.parametrize("scheme", ALL_SCHEMES, ids=lambda s: s.name)
def test_sqnr_floor(scheme: Int4Scheme, generator: torch.Generator) -> None:
    w13 = torch.randn(4, 256, 512, generator=generator)
    w2 = torch.randn(4, 512, 256, generator=generator)
    q = quantize_expert_weights(w13, w2, scheme, scale_dtype=torch.float32)
    d13, d2 = dequantize_expert_weights(q)
    assert sqnr_db(w13, d13) > SQNR_FLOOR_DB[scheme.name]
    assert sqnr_db(w2, d2) > SQNR_FLOOR_DB[scheme.name]


@pytest.mark.parametrize("scheme", ALL_SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dequantize_is_exact_and_requantize_is_idempotent(
    scheme: Int4Scheme, scale_dtype: torch.dtype, generator: torch.Generator
) -> None:
    w13 = torch.randn(2, 64, 256, generator=generator) * 0.02
    w2 = torch.randn(2, 256, 32, generator=generator) * 0.02
    if scheme.group_size > 32:
        w2 = torch.randn(2, 256, scheme.group_size, generator=generator) * 0.02
    q = quantize_expert_weights(w13, w2, scheme, scale_dtype=scale_dtype)
    assert q.w13_scale.dtype == scale_dtype
    # dequantize agrees bit for bit with an independent float64 formula (rounded to fp32)
    d13, _ = dequantize_expert_weights(q)
    expected = dequant_f64(q.w13_qdata, q.w13_scale, q.w13_zero_point).float()
    torch.testing.assert_close(d13, expected, **EXACT)
    # quantizing the dequantized weights with the same qparams returns the same codes
    codes = quantize(d13, q.w13, scheme)
    torch.testing.assert_close(codes, unpack_int4(q.w13_qdata), **EXACT)


def test_codes_and_zero_points_in_range(generator: torch.Generator) -> None:
    w = torch.randn(8, 64, generator=generator) + 3.0  # all-positive groups
    qp = choose_qparams(w, INT4_ASYM_G32, scale_dtype=torch.float32)
    assert qp.zero_point is not None
    assert int(qp.zero_point.max()) <= 15
    codes = quantize(w, qp, INT4_ASYM_G32)
    assert int(codes.max()) <= 15
    assert sqnr_db(w, dequantize(codes, qp, INT4_ASYM_G32)) > 20


def test_zero_group_quantizes_to_exact_zero() -> None:
    w = torch.zeros(2, 64)
    for scheme in (INT4_SYM_G32, INT4_ASYM_G32):
        qp = choose_qparams(w, scheme, scale_dtype=torch.bfloat16)
        out = dequantize(quantize(w, qp, scheme), qp, scheme)
        torch.testing.assert_close(out, w, **EXACT)


def test_quantize_is_deterministic(generator: torch.Generator) -> None:
    w13 = torch.randn(2, 64, 64, generator=generator)
    w2 = torch.randn(2, 64, 32, generator=generator)
    a = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    b = quantize_expert_weights(w13, w2, INT4_ASYM_G32)
    for name, tensor in a.tensors().items():
        torch.testing.assert_close(tensor, b.tensors()[name], **EXACT)


def test_dequantize_expert_matches_all(generator: torch.Generator) -> None:
    q = quantize_expert_weights(
        torch.randn(3, 64, 64, generator=generator),
        torch.randn(3, 64, 32, generator=generator),
        INT4_ASYM_G32,
    )
    all13, all2 = dequantize_expert_weights(q, dtype=torch.bfloat16)
    one13, one2 = dequantize_expert(q, 2, dtype=torch.bfloat16)
    torch.testing.assert_close(one13, all13[2], **EXACT)
    torch.testing.assert_close(one2, all2[2], **EXACT)


def test_quantize_expert_weights_rejects_bad_shapes() -> None:
    with pytest.raises(ShapeError, match="must be 3-D"):
        quantize_expert_weights(
            torch.zeros(64, 64), torch.zeros(1, 64, 32), INT4_SYM_G32
        )
    with pytest.raises(
        ShapeError, match="weight last dim=48 must be divisible by group_size=32"
    ):
        quantize_expert_weights(
            torch.zeros(1, 8, 48), torch.zeros(1, 48, 32), INT4_SYM_G32
        )
    with pytest.raises(ShapeError, match="positive even number, got 33"):
        quantize_expert_weights(
            torch.zeros(1, 8, 33), torch.zeros(1, 33, 32), Int4Scheme(group_size=-1)
        )
