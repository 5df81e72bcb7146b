"""The check of a ``BlockAlignment`` against ``sort_tokens_by_expert``, shared by the
interpreter and CUDA tests of the alignment."""

import torch

from backends.triton._align import align_pairs_to_blocks
from core.routing import sort_tokens_by_expert


def check_alignment(ids_TK: torch.Tensor, num_experts: int, block_m: int) -> None:
    """``align_pairs_to_blocks`` places the pairs as a stable sort by expert would.

    Its blocks, read in order up to each block's valid rows, list the pairs of the
    sort (ids of ``-1`` left out); each expert has ``ceil(count / block_m)`` blocks,
    in expert order; unused blocks have expert ``-1`` and no rows.
    """
    align = align_pairs_to_blocks(ids_TK, num_experts, block_m=block_m)
    order_N, counts_E = sort_tokens_by_expert(ids_TK.cpu(), num_experts)
    experts, rows = align.block_expert.tolist(), align.block_rows.tolist()
    pairs = align.sorted_pairs.cpu()
    got: list[int] = []
    for b, (expert, n_rows) in enumerate(zip(experts, rows, strict=True)):
        got += pairs[b * block_m : b * block_m + n_rows].tolist()
        assert (expert == -1) == (n_rows == 0)
    assert got == order_N[: int(counts_E.sum())].tolist()
    expected_blocks = [
        e for e, c in enumerate(counts_E.tolist()) for _ in range(-(-c // block_m))
    ]
    assert [e for e in experts if e >= 0] == expected_blocks
