"""pack_int4 / unpack_int4: exact, low nibble first, errors."""

import pytest
import torch

from core.errors import DTypeError, ShapeError
from core.packing import pack_int4, unpack_int4
from tests.tolerances import EXACT


def test_every_byte_round_trips() -> None:
    every_byte = torch.arange(256, dtype=torch.uint8)
    torch.testing.assert_close(pack_int4(unpack_int4(every_byte)), every_byte, **EXACT)


def test_codes_round_trip(generator: torch.Generator) -> None:
    codes = torch.randint(0, 16, (3, 5, 64), generator=generator, dtype=torch.int32)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8
    assert packed.shape == (3, 5, 32)
    torch.testing.assert_close(unpack_int4(packed), codes.to(torch.uint8), **EXACT)


def test_low_nibble_holds_the_even_element() -> None:
    packed = pack_int4(torch.tensor([1, 2, 15, 0]))
    assert packed.tolist() == [0x21, 0x0F]
    # GPTQ-style int32 packing (element i at bits 4i..4i+3) viewed as bytes is our layout.
    word = sum(v << (4 * i) for i, v in enumerate([3, 4, 5, 6, 7, 8, 9, 10]))
    signed = word - (1 << 32) if word >= 1 << 31 else word
    as_bytes = torch.tensor([signed], dtype=torch.int32).view(torch.uint8)
    assert unpack_int4(as_bytes).tolist() == [3, 4, 5, 6, 7, 8, 9, 10]


def test_pack_rejects_odd_last_dim() -> None:
    with pytest.raises(ShapeError, match="even last dim"):
        pack_int4(torch.zeros(4, 3, dtype=torch.uint8))


def test_pack_rejects_float_codes() -> None:
    with pytest.raises(DTypeError, match="integer tensor"):
        pack_int4(torch.zeros(4, 2))


def test_unpack_rejects_non_uint8() -> None:
    with pytest.raises(DTypeError, match="qdata must be uint8"):
        unpack_int4(torch.zeros(4, 2, dtype=torch.int32))


@pytest.mark.parametrize(
    ("values", "dtype", "found"),
    [
        ([3, 16], torch.uint8, r"\[3, 16\]"),
        ([-1, 2], torch.int8, r"\[-1, 2\]"),
        ([0, 255, 7, 1], torch.int64, r"\[0, 255\]"),
        ([0, 300], torch.uint16, r"\[0, 300\]"),
    ],
    ids=["16", "negative", "255", "uint16"],
)
def test_pack_rejects_codes_outside_0_15(
    values: list[int], dtype: torch.dtype, found: str
) -> None:
    # Without the check, 16 packed as 0 and -1 as 15: silently different weights.
    with pytest.raises(
        ShapeError, match=rf"codes must be in 0\.\.15, got values in {found}"
    ):
        pack_int4(torch.tensor(values).to(dtype))


def test_pack_accepts_wide_unsigned_and_empty_codes() -> None:
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint16)
    assert pack_int4(codes).tolist() == [[0x21, 0x0F]]
    assert pack_int4(torch.zeros(3, 0, dtype=torch.uint8)).shape == (3, 0)


def test_pack_rejects_zero_dim_and_bool_codes() -> None:
    with pytest.raises(ShapeError, match=r"even last dim, got shape \(\)"):
        pack_int4(torch.tensor(3, dtype=torch.uint8))
    with pytest.raises(DTypeError, match=r"integer tensor, got dtype torch\.bool"):
        pack_int4(torch.ones(4, 2, dtype=torch.bool))
