"""Token-to-expert block alignment on the device, with no host synchronization.

May import core; triton only inside functions. Shape legend: ``T`` tokens, ``K`` top_k,
``E`` experts, ``N`` = T*K routed pairs, ``B`` row blocks (upper bound), ``R`` = B*BLOCK_M.
Every buffer is sized from host-known upper bounds, so a forward can be captured in a
CUDA graph and replayed.
"""

import attrs
import torch

from backends.triton._configs import ALIGN_ONE_LAUNCH_MAX_PAIRS, next_pow2


@attrs.frozen(kw_only=True, eq=False)
class BlockAlignment:
    """Routed pairs grouped by expert into row blocks of ``block_m``.

    Attributes:
        sorted_pairs: int32; ``sorted_pairs[b*block_m + i]`` is the ``i``-th pair of
            block ``b`` (valid for ``i < block_rows[b]``; the rest is never written).
        block_expert: int32 expert of each block, ``-1`` for unused blocks.
        block_rows: int32 valid rows of each block.
        block_m: rows per block.
    """

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    block_rows: torch.Tensor
    block_m: int

    @property
    def max_blocks(self) -> int:
        """``B``: the number of row blocks the GEMM grids launch."""
        return int(self.block_expert.shape[0])


def max_row_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on ``sum_e ceil(count_e / block_m)`` over any routing.

    At most ``min(E, N)`` experts are busy and each wastes at most ``block_m - 1`` rows.
    """
    busy = min(num_experts, num_pairs)
    return max(1, -(-(num_pairs + busy * (block_m - 1)) // block_m))


def align_pairs_to_blocks(
    topk_ids_TK: torch.Tensor, num_experts: int, *, block_m: int
) -> BlockAlignment:
    """Group the routed pairs by expert (stable) into blocks of ``block_m`` rows.

    Up to ``ALIGN_ONE_LAUNCH_MAX_PAIRS`` routed pairs one launch of ``E`` programs,
    each of which counts the pairs of every expert and places its own; above, two
    (count the pairs per expert, then place them). Ids of ``-1`` (experts not held
    here) land in no block.

    Args:
        topk_ids_TK: ``(T, K)`` integer expert ids in ``[-1, E)``.
        num_experts: ``E``.
        block_m: rows per block (a power of two).
    """
    from backends.triton._kernels import _align_blocks_kernel, _count_experts_kernel

    ids_N = topk_ids_TK.reshape(-1).contiguous()
    num_pairs = int(ids_N.shape[0])
    blocks = max_row_blocks(num_pairs, num_experts, block_m)
    device = ids_N.device
    sorted_R = torch.empty(blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=device)
    block_rows = torch.empty(blocks, dtype=torch.int32, device=device)
    chunk = min(1024, max(16, next_pow2(num_pairs)))
    one_launch = num_pairs <= ALIGN_ONE_LAUNCH_MAX_PAIRS
    counts_E = block_rows  # unused by the one launch
    if not one_launch:
        counts_E = torch.empty(num_experts, dtype=torch.int32, device=device)
        _count_experts_kernel[(num_experts,)](ids_N, counts_E, num_pairs, BLOCK=chunk)
    _align_blocks_kernel[(num_experts,)](
        ids_N,
        counts_E,
        sorted_R,
        block_expert,
        block_rows,
        num_pairs,
        num_experts,
        blocks,
        BLOCK_M=block_m,
        BLOCK=chunk,
        E_PAD=max(16, next_pow2(num_experts)),
        COUNT=one_launch,
    )
    return BlockAlignment(
        sorted_pairs=sorted_R,
        block_expert=block_expert,
        block_rows=block_rows,
        block_m=block_m,
    )
