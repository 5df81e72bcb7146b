# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
# ruff: noqa: TID253
# A test kernel (@triton.jit) needs triton at module level, as the kernel modules do.
"""The w2 GEMV's L2 prefetch (``GemvTiles.l2_prefetch``): the lines it asks for.

The prefetch itself is PTX (``prefetch.global.L2``) that only a GPU runs, and a hint:
the outputs with and without it are compared bit for bit on a GPU
(``test_l2_prefetch_keeps_outputs`` in ``test_triton_gemv_cuda.py``). What can be
wrong without changing any output is where it points: here, in the interpreter, the
pointers ``_l2_lines`` gives for each batch ``_prefetch_l2`` issues must cover every
128-byte line of the tile's columns ``lo .. hi-1`` and no line outside them, for
words, 16-bit scales and byte zero points, rows and columns aligned to lines or not.
"""

import pytest
import torch
import triton
import triton.language as tl

from backends.triton._kernels_gemv import _l2_lines
from tests.backends.triton_interpreter_cases import INTERPRETER_ONLY

pytestmark = INTERPRETER_ONLY

BLOCK_N = 4
LINES = 2


@triton.jit
def _record_lines_kernel(
    base, out_ptr, n_rows, lo, hi, stride_row,
    BLOCK_N: tl.constexpr, LINES: tl.constexpr, BATCHES: tl.constexpr,
):  # fmt: skip
    """Each batch's addresses (``-1`` masked), as ``_prefetch_l2`` steps them: from
    ``lo``, ``LINES`` lines a batch, to the line that holds ``hi-1``."""
    PER_LINE: tl.constexpr = 1024 // base.dtype.element_ty.primitive_bitwidth
    rows = tl.arange(0, BLOCK_N)
    cells = rows[:, None] * LINES + tl.arange(0, LINES)[None, :]
    for c0 in range(lo, hi + PER_LINE - 1, LINES * PER_LINE):  # _prefetch_l2's loop
        i = (c0 - lo) // (LINES * PER_LINE)
        ptrs, mask = _l2_lines(base, rows, rows < n_rows, c0, hi, stride_row, LINES)
        addresses = tl.where(mask, ptrs.to(tl.int64), -1)
        tl.store(out_ptr + i * BLOCK_N * LINES + cells, addresses, mask=i < BATCHES)


def _asked_lines(
    data: torch.Tensor, n_rows: int, lo: int, hi: int, stride: int
) -> tuple[set[int], int]:
    """The 128-byte lines (absolute addresses // 128) the batches point into, and how
    many batches ran."""
    per_line = 128 // data.element_size()
    batches = 64
    out = torch.full((batches, BLOCK_N, LINES), -2, dtype=torch.int64)
    _record_lines_kernel[(1,)](
        data, out, n_rows, lo, hi, stride, BLOCK_N=BLOCK_N, LINES=LINES,
        BATCHES=batches,
    )  # fmt: skip
    ran = int((out[:, 0, 0] != -2).sum())
    assert ran == -(-(hi + per_line - 1 - lo) // (LINES * per_line))
    return {int(a) // 128 for a in out[:ran][out[:ran] >= 0]}, ran


@pytest.mark.parametrize(
    ("dtype", "stride", "lo", "hi"),
    [
        (torch.int32, 192, 0, 192),  # Qwen3-235B's w2 words: 6 whole lines a row
        (torch.int32, 192, 0, 5),  # less than a line
        (torch.int32, 200, 7, 171),  # rows and ends off the lines
        (torch.int32, 1792, 896, 1792),  # a K split's second half
        (torch.bfloat16, 12, 0, 12),  # a row's scales in one line
        (torch.bfloat16, 112, 3, 112),  # scales over two lines, off the start
        (torch.uint8, 300, 1, 299),  # byte zero points
        (torch.int32, 64, 0, 64),  # exactly two lines, one batch
        (torch.int32, 64, 0, 65),  # one word into the next batch
    ],
)
@pytest.mark.parametrize("n_rows", [BLOCK_N, 3])
def test_prefetch_asks_for_exactly_the_tile_lines(
    dtype: torch.dtype, stride: int, lo: int, hi: int, n_rows: int
) -> None:
    data = torch.zeros(BLOCK_N * stride + 64, dtype=dtype)[3:]  # off any line start
    asked, ran = _asked_lines(data, n_rows, lo, hi, stride)
    size = data.element_size()
    wanted = {
        (data.data_ptr() + (row * stride + col) * size) // 128
        for row in range(n_rows)
        for col in range(lo, hi)
    }
    assert asked == wanted
    assert ran >= 1
