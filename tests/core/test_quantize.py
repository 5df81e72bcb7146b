"""choose_qparams / quantize / dequantize: SQNR floors, exactness, idempotence, errors."""

import pytest
import torch

from core.errors import ConfigTypeError, DTypeError, ShapeError
from core.packing import unpack_int4
from core.quantize import (
    choose_qparams,
    dequantize,
    dequantize_expert,
    dequantize_expert_weights,
    dequantize_packed,
    quantize,
    quantize_expert_weights,
    quantize_tensor,
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
    # The tensors the floors in tests/tolerances.py were measured on. They are not one
    # layer's w13 and w2 (F differs), so each is quantized on its own.
    w13 = torch.randn(4, 256, 512, generator=generator)
    w2 = torch.randn(4, 512, 256, generator=generator)
    for w in (w13, w2):
        qdata, qparams = quantize_tensor(w, scheme, scale_dtype=torch.float32)
        assert (
            sqnr_db(w, dequantize_packed(qdata, qparams, scheme))
            > (SQNR_FLOOR_DB[scheme.name])
        )


@pytest.mark.parametrize("scheme", ALL_SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dequantize_is_exact_and_requantize_is_idempotent(
    scheme: Int4Scheme, scale_dtype: torch.dtype, generator: torch.Generator
) -> None:
    f = max(32, scheme.group_size)  # F must be a multiple of the group size
    w13 = torch.randn(2, 2 * f, 256, generator=generator) * 0.02
    w2 = torch.randn(2, 256, f, generator=generator) * 0.02
    q = quantize_expert_weights(w13, w2, scheme, scale_dtype=scale_dtype)
    assert q.w13_scale.dtype == scale_dtype
    # dequantize agrees bit for bit with an independent float64 formula (rounded to fp32)
    d13, _ = dequantize_expert_weights(q)
    expected = dequant_f64(q.w13_qdata, q.w13_scale, q.w13_zero_point).float()
    torch.testing.assert_close(d13, expected, **EXACT)
    # quantizing the dequantized weights with the same qparams returns the same codes
    codes = quantize(d13, q.w13, scheme)
    torch.testing.assert_close(codes, unpack_int4(q.w13_qdata), **EXACT)


# (values of one group of 32, cycled; scale dtype; expected scale, zero point and code of
# each value), worked out by hand from zero = round(-min(w, 0) / scale) and
# code = round(w / scale) + zero, rounding half to even, both clamped to 0..15.
RANGE_EDGE_CASES = {
    "zero-and-negative": (
        [-k / 8 for k in range(16)],
        torch.bfloat16,
        0.125,
        15,
        [15 - k for k in range(16)],
    ),
    "zero-and-positive": (
        [k / 8 for k in range(16)],
        torch.bfloat16,
        0.125,
        0,
        list(range(16)),
    ),
    # -lo / scale = 7.5 rounds to 8, +7.5 to 8 as well: 16 before the clamp
    "half-steps-at-both-ends": (
        [-7.5, *range(-7, 8), 7.5],
        torch.bfloat16,
        1.0,
        8,
        [0, *range(1, 16), 15],
    ),
    # (hi - lo) / 15 = 1 + 2^-10 rounds down to a bf16 scale of 1: hi is 7.51 steps up
    "bf16-scale-rounds-down": (
        [-7.5, *range(-7, 8), 7.5 + 15 * 2**-10],
        torch.bfloat16,
        1.0,
        8,
        [0, *range(1, 16), 15],
    ),
    # zero = round(5.5) = 6 (half to even), and 9.5 rounds to 10: 16 before the clamp
    "zero-point-rounds-half-to-even": (
        [-5.5, *range(-5, 10), 9.5],
        torch.bfloat16,
        1.0,
        6,
        [0, *range(1, 16), 15],
    ),
    # 9 * 2^-26 = 2.25 fp16 subnormal ulps rounds down to 2: stored one ulp up, 3 * 2^-24,
    # so -lo / scale = 11.25 (rounded down it would be 16.875, the zero point clamped)
    "fp16-subnormal-scale": (
        [-135 * 2**-26, -(2**-23), 0.0],
        torch.float16,
        3 * 2**-24,
        11,
        [0, 10, 11],
    ),
}


@pytest.mark.parametrize("case", RANGE_EDGE_CASES)
def test_codes_and_zero_points_at_the_range_edges(case: str) -> None:
    values, scale_dtype, scale, zero, codes = RANGE_EDGE_CASES[case]
    index = torch.arange(32) % len(values)
    w = torch.tensor(values, dtype=torch.float32)[index].reshape(1, 32)
    qp = choose_qparams(w, INT4_ASYM_G32, scale_dtype=scale_dtype)
    assert qp.zero_point is not None
    assert qp.scale.dtype == scale_dtype
    assert float(qp.scale) == scale
    assert int(qp.zero_point) == zero
    expected = torch.tensor(codes, dtype=torch.uint8)[index].reshape(1, 32)
    torch.testing.assert_close(quantize(w, qp, INT4_ASYM_G32), expected, **EXACT)


def test_one_signed_groups_put_the_zero_point_at_an_end(
    generator: torch.Generator,
) -> None:
    """All-negative groups: zero point 15, min at code 0; all-positive: 0 and 15."""
    magnitude = torch.rand(64, 128, generator=generator) + 0.01
    sign = torch.ones(64, 1)
    sign[:32] = -1.0
    w = magnitude * sign
    qp = choose_qparams(w, INT4_ASYM_G32, scale_dtype=torch.bfloat16)
    assert qp.zero_point is not None
    torch.testing.assert_close(
        qp.zero_point[:32], torch.full((32, 4), 15, dtype=torch.uint8), **EXACT
    )
    torch.testing.assert_close(
        qp.zero_point[32:], torch.zeros(32, 4, dtype=torch.uint8), **EXACT
    )
    codes = quantize(w, qp, INT4_ASYM_G32).reshape(64, 4, 32)
    assert int(codes.max()) <= 15
    end = torch.tensor([0] * 32 + [15] * 32, dtype=torch.uint8).reshape(64, 1)
    # the group's largest magnitude lands on the end code
    farthest = magnitude.reshape(64, 4, 32).argmax(dim=-1, keepdim=True)
    torch.testing.assert_close(
        codes.gather(-1, farthest).squeeze(-1), end.expand(64, 4), **EXACT
    )
    # and every value within the asymmetric bound of its float64 dequantization
    u = UNIT_ROUNDOFF[torch.bfloat16]
    step = qp.scale.double().unsqueeze(-1)
    zero = qp.zero_point.double().unsqueeze(-1)
    err_steps = (w.double().reshape(64, 4, 32) - (codes.double() - zero) * step) / step
    assert float(err_steps.abs().max()) <= 0.5 + 15 * u / (1 - u) + 1e-6


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
            torch.zeros(1, 64, 48), torch.zeros(1, 48, 32), INT4_SYM_G32
        )
    with pytest.raises(ShapeError, match="positive even number, got 33"):
        quantize_expert_weights(
            torch.zeros(1, 64, 33), torch.zeros(1, 33, 32), Int4Scheme(group_size=-1)
        )


@pytest.mark.parametrize(
    ("w13_shape", "w2_shape", "message"),
    [
        ((2, 64, 64), (3, 64, 32), r"w2_weight must have shape \(E, D, F\) with E=2"),
        ((2, 64, 64), (2, 96, 32), r"with E=2 and D=64 like w13_weight"),
        ((2, 64, 64), (2, 64, 64), r"w13_weight must have 2F=128 rows .* \(F=64\)"),
    ],
)
def test_quantize_expert_weights_rejects_disagreeing_sizes(
    w13_shape: tuple[int, ...], w2_shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ShapeError, match=message):
        quantize_expert_weights(
            torch.zeros(w13_shape), torch.zeros(w2_shape), INT4_SYM_G32
        )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_quantize_expert_weights_rejects_non_finite(bad: float) -> None:
    w13, w2 = torch.zeros(2, 64, 64), torch.zeros(2, 64, 32)
    w2[1, 5, 7] = bad
    with pytest.raises(
        ShapeError,
        match=r"w2_weight must be finite, got 1 NaN/inf values \(first at \(1, 5, 7\)\)",
    ):
        quantize_expert_weights(w13, w2, INT4_ASYM_G32)


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_choose_qparams_rejects_non_finite(scheme: Int4Scheme, bad: float) -> None:
    """NaN scales came back before, and quantize then cast NaN codes to uint8."""
    w = torch.randn(3, 4, 96)
    w[1, 2, 70] = bad  # row 2 of the second matrix, group 70 // 32 = 2
    with pytest.raises(
        ShapeError,
        match=r"w_NK must be finite in float32, got NaN or inf in \(\.\.\., row, group\) "
        r"\(1, 2, 2\) \(1 of 36 groups\)$",
    ):
        choose_qparams(w, scheme, scale_dtype=torch.bfloat16)
    w[1, 2, 70] = 0.0
    assert torch.isfinite(
        choose_qparams(w, scheme, scale_dtype=torch.bfloat16).scale
    ).all()


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_float64_weights_past_float32_range_are_refused_as_float32(
    scheme: Int4Scheme,
) -> None:
    """Finite in float64, inf once quantized in float32: named as such."""
    w = torch.zeros(2, 64, 32, dtype=torch.float64)
    w[0, 3, 5] = 1e39
    with pytest.raises(
        ShapeError, match=r"w_NK must be finite in float32, .* \(0, 3, 0\)"
    ):
        choose_qparams(w, scheme, scale_dtype=torch.float32)
    with pytest.raises(
        ShapeError,
        match=r"w2_weight \(as float32\) must be finite, got 1 NaN/inf values "
        r"\(first at \(0, 3, 5\)\)",
    ):
        quantize_expert_weights(torch.zeros(2, 64, 64), w, scheme)


def test_a_finite_asymmetric_range_past_float32_is_a_scale_overflow() -> None:
    """amax - amin of finite weights can overflow float32; that is the scale's
    overflow (named with the scales), not a NaN/inf weight."""
    w = torch.zeros(2, 64)
    w[1, 0], w[1, 1] = 3e38, -3e38
    with pytest.raises(ShapeError, match=r"weights need group scales .* to inf"):
        choose_qparams(w, INT4_ASYM_G32, scale_dtype=torch.float32)


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_choose_qparams_of_meta_and_empty_weights(scheme: Int4Scheme) -> None:
    meta = choose_qparams(
        torch.empty(3, 4, 64, device="meta"), scheme, scale_dtype=torch.bfloat16
    )
    assert meta.scale.is_meta
    assert tuple(meta.scale.shape) == (3, 4, 2)
    empty = choose_qparams(torch.empty(0, 64), scheme, scale_dtype=torch.bfloat16)
    assert tuple(empty.scale.shape) == (0, 2)


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
@pytest.mark.parametrize(
    ("magnitude", "scales"),
    [(1e6, r"from 1\.\d+e\+05 to 1\.\d+e\+05"), (1e-8, r"from 1\.\d+e-09 to")],
)
def test_scales_the_scale_dtype_cannot_hold_are_refused(
    scheme: Int4Scheme, magnitude: float, scales: str
) -> None:
    """fp16 scales overflow (weights would dequantize to inf/NaN) or flush a nonzero
    group to 0 (its weights would vanish); bf16 holds both."""
    w = torch.full((2, 64), magnitude)
    w[:, ::2] = -magnitude
    with pytest.raises(
        ShapeError,
        match=r"weights need group scales from 5\.96e-08 to 6\.55e\+04 to be stored in "
        rf"scale_dtype torch\.float16, got scales {scales}",
    ):
        choose_qparams(w, scheme, scale_dtype=torch.float16)
    qp = choose_qparams(w, scheme, scale_dtype=torch.bfloat16)
    out = dequantize(quantize(w, qp, scheme), qp, scheme)
    assert float((out - w).abs().max()) <= magnitude / 7


def test_quantize_expert_weights_rejects_integer_weights() -> None:
    with pytest.raises(DTypeError, match="w13_weight must be a floating tensor"):
        quantize_expert_weights(
            torch.zeros(2, 64, 64, dtype=torch.int32),
            torch.zeros(2, 64, 32),
            INT4_SYM_G32,
        )


# Unit roundoff u of each scale dtype. core/quantize.py (at _SYM_DIVISOR) states the
# symmetric worst case as 7.5 / (1 - u) - 7 steps of the stored scale.
UNIT_ROUNDOFF = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-24}


@pytest.mark.parametrize("scale_dtype", list(UNIT_ROUNDOFF), ids=str)
def test_symmetric_error_bound_with_rounded_scales(
    scale_dtype: torch.dtype, generator: torch.Generator
) -> None:
    u = UNIT_ROUNDOFF[scale_dtype]
    # Group 0: amax / 7.5 just below 1 + u, so the stored scale rounds down to 1 and
    # +amax sits almost 7.5 / (1 - u) steps out; the other groups are random.
    w = torch.randn(4, 128, generator=generator)
    w[0, :32] = 0.0
    w[0, 0] = 7.5 * (1 + u) * (1 - 2**-20)
    qp = choose_qparams(w, INT4_SYM_G32, scale_dtype=scale_dtype)
    codes = quantize(w, qp, INT4_SYM_G32)
    # float64 dequantization written out here, independent of dequantize()
    step = qp.scale.double().repeat_interleave(32, dim=-1)
    err_steps = (w.double() - (codes.double() - 8) * step).abs() / step
    # + 1e-6: quantize divides w / scale in float32 before rounding
    bound = 7.5 / (1 - u) - 7 + 1e-6
    assert float(err_steps.max()) <= bound
    if scale_dtype != torch.float32:
        # more than half a step, and close to the bound: the bound is tight
        assert float(err_steps[0, 0]) > 0.5 + 0.99 * (bound - 0.5)
    # values below 7.5 steps do not reach the clamp: within half a step
    unclamped = w.double() / step < 7.5
    assert float(err_steps[unclamped].max()) <= 0.5 + 1e-6


@pytest.mark.parametrize("amax", [1.49 * 7.5 * 2**-24, 2e-5, 3e-4])
def test_symmetric_error_bound_with_subnormal_fp16_scales(
    amax: float, generator: torch.Generator
) -> None:
    # fp16 scales below 2^-14 are subnormal; rounded down by up to a third, values near
    # +-amax would clamp several steps away. The stored scale is rounded up instead.
    w = torch.randn(64, 32, generator=generator)
    w = w / w.abs().amax(dim=-1, keepdim=True) * amax
    qp = choose_qparams(w, INT4_SYM_G32, scale_dtype=torch.float16)
    assert float(qp.scale.max()) < torch.finfo(torch.float16).tiny  # subnormal
    codes = quantize(w, qp, INT4_SYM_G32)
    step = qp.scale.double().repeat_interleave(32, dim=-1)
    err_steps = (w.double() - (codes.double() - 8) * step).abs() / step
    assert float(err_steps.max()) <= 0.5 + 1e-6
    assert bool(
        (qp.scale.double() >= w.double().abs().amax(-1, keepdim=True) / 7.5).all()
    )


@pytest.mark.parametrize("scale_dtype", list(UNIT_ROUNDOFF), ids=str)
def test_asymmetric_error_bound_with_rounded_scales(
    scale_dtype: torch.dtype, generator: torch.Generator
) -> None:
    u = UNIT_ROUNDOFF[scale_dtype]
    w = torch.randn(256, 256, generator=generator) + 0.5
    qp = choose_qparams(w, INT4_ASYM_G32, scale_dtype=scale_dtype)
    assert qp.zero_point is not None
    codes = quantize(w, qp, INT4_ASYM_G32)
    step = qp.scale.double().repeat_interleave(32, dim=-1)
    zero = qp.zero_point.double().repeat_interleave(32, dim=-1)
    err_steps = (w.double() - (codes.double() - zero) * step).abs() / step
    assert float(err_steps.max()) <= 0.5 + 15 * u / (1 - u) + 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dequantize_returns_the_asked_dtype(
    dtype: torch.dtype, generator: torch.Generator
) -> None:
    q = quantize_expert_weights(
        torch.randn(2, 64, 64, generator=generator),
        torch.randn(2, 64, 32, generator=generator),
        INT4_ASYM_G32,
        scale_dtype=torch.float32,
    )
    w13, w2 = dequantize_expert_weights(q, dtype=dtype)
    one13, one2 = dequantize_expert(q, 1, dtype=dtype)
    # computed in float32 (exact here to float64's float32 rounding), then cast
    exp13 = dequant_f64(q.w13_qdata, q.w13_scale, q.w13_zero_point).float().to(dtype)
    exp2 = dequant_f64(q.w2_qdata, q.w2_scale, q.w2_zero_point).float().to(dtype)
    torch.testing.assert_close(w13, exp13, **EXACT)  # checks the dtype too
    torch.testing.assert_close(w2, exp2, **EXACT)
    torch.testing.assert_close(one13, exp13[1], **EXACT)
    torch.testing.assert_close(one2, exp2[1], **EXACT)


def test_quantize_expert_weights_rejects_w13_with_extra_rows() -> None:
    # (belongs as a 4th case of test_quantize_expert_weights_rejects_disagreeing_sizes)
    with pytest.raises(
        ShapeError, match=r"w13_weight must have 2F=64 rows .* \(F=32\), got shape"
    ):
        quantize_expert_weights(
            torch.zeros(2, 128, 64), torch.zeros(2, 64, 32), INT4_SYM_G32
        )


@pytest.mark.parametrize(
    "scale_dtype", [torch.int8, torch.float64, torch.uint8, torch.int32], ids=str
)
def test_quantize_expert_weights_refuses_scale_dtypes_the_layer_refuses(
    scale_dtype: torch.dtype, generator: torch.Generator
) -> None:
    """Up front (int8 raised torch.finfo's TypeError after quantizing; float64 passed)."""
    w13 = torch.randn(2, 64, 64, generator=generator)
    w2 = torch.randn(2, 64, 32, generator=generator)
    message = (
        rf"scale_dtype must be float32, float16 or bfloat16, got dtype {scale_dtype}$"
    )
    with pytest.raises(DTypeError, match=message):
        quantize_expert_weights(w13, w2, INT4_SYM_G32, scale_dtype=scale_dtype)
    with pytest.raises(DTypeError, match=message):
        choose_qparams(w2, INT4_ASYM_G32, scale_dtype=scale_dtype)


@pytest.mark.parametrize(
    ("scheme", "got"),
    [("sym", "str"), ("int4_sym_g32", "str"), (None, "NoneType"), (32, "int")],
)
def test_quantize_expert_weights_refuses_a_scheme_of_another_type(
    scheme: object, got: str
) -> None:
    message = rf"scheme must be of type Int4Scheme, got {got}$"
    w13, w2 = torch.zeros(2, 64, 64), torch.zeros(2, 64, 32)
    with pytest.raises(ConfigTypeError, match=message) as info:
        quantize_expert_weights(w13, w2, scheme)  # type: ignore[arg-type]  # on purpose
    assert isinstance(info.value, TypeError)
    with pytest.raises(ConfigTypeError, match=message):
        choose_qparams(w2, scheme, scale_dtype=torch.bfloat16)  # type: ignore[arg-type]  # on purpose


def test_qparams_of_another_mapping_are_refused() -> None:
    """A zero point with a symmetric scheme (or none with an asymmetric one) was mixed
    in silently before."""
    from core.errors import ConfigError

    w = torch.randn(4, 64)
    sym = choose_qparams(w, INT4_SYM_G32, scale_dtype=torch.float32)
    asym = choose_qparams(w, INT4_ASYM_G32, scale_dtype=torch.float32)
    codes = quantize(w, sym, INT4_SYM_G32)
    with pytest.raises(ConfigError, match="zero_point must be None for int4_sym_g32"):
        quantize(w, asym, INT4_SYM_G32)
    with pytest.raises(ConfigError, match="zero_point must be a tensor for int4_asym"):
        quantize(w, sym, INT4_ASYM_G32)
    with pytest.raises(ConfigError, match="zero_point must be a tensor for int4_asym"):
        dequantize(codes, sym, INT4_ASYM_G32)


@pytest.mark.parametrize("expert", [-1, 4, 1.0, True])
def test_dequantize_expert_refuses_an_expert_not_held(expert: int) -> None:
    from core.errors import ConfigError

    q = quantize_expert_weights(
        torch.randn(4, 64, 64), torch.randn(4, 64, 32), INT4_SYM_G32
    )
    with pytest.raises(ConfigError, match=r"expert must be an int in \[0, 4\), got"):
        dequantize_expert(q, expert)


def test_dequantize_expert_takes_any_integer_index() -> None:
    """numpy and 0-d tensor integers pick the same expert as an int."""
    import numpy as np

    q = quantize_expert_weights(
        torch.randn(4, 64, 64), torch.randn(4, 64, 32), INT4_SYM_G32
    )
    want = dequantize_expert(q, 2)
    for index in (np.int64(2), torch.tensor(2)):
        got = dequantize_expert(q, index)  # type: ignore[arg-type]  # runtime callers
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, **EXACT)
