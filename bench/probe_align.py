"""One-launch alignment against the two launches (the only form before commit 7538c65).

Run on the GPU from the repository root: ``python bench/probe_align.py``. For each
model shape and M, CUDA-graph replay (L2 flushed before each, median of 50, as
``bench_gpu.py`` times) of the alignment alone, the two-launch form (the count kernel,
then the placing kernel reading its counts, ``COUNT=False``) against the one-launch
form (``COUNT=True``: its programs count every expert themselves), both checked to
place the same pairs in the same blocks; then, where the layer takes the ``gemm``
path, the whole layer with each, alternated twice. (The log of
``sweeps/probe_align_h200.log`` was written while ``align_pairs_to_blocks`` took one
launch at every size, by a version of this script that called it for that form.)
"""

# ruff: noqa: B023, D103, F821, T201
# A GPU script, not library code: print is its output, and each closure is replayed
# inside the loop iteration that defines it.

import sys
from pathlib import Path
from typing import Protocol

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gpu import GROUP, MODELS, MS, random_int4, replay_graph, route

import backends.triton._fused as fused
from backends.triton._align import BlockAlignment, align_pairs_to_blocks, max_row_blocks
from backends.triton._configs import next_pow2
from backends.triton._kernels import _align_blocks_kernel, _count_experts_kernel
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig


def align_launches(
    topk_ids_TK: torch.Tensor, num_experts: int, *, block_m: int, count: bool
) -> BlockAlignment:
    """``align_pairs_to_blocks`` in one launch (``count``) or two, whatever the size."""
    ids_N = topk_ids_TK.reshape(-1).contiguous()
    n = int(ids_N.shape[0])
    blocks = max_row_blocks(n, num_experts, block_m)
    dev = ids_N.device
    counts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    sorted_R = torch.empty(blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=dev)
    block_rows = torch.empty(blocks, dtype=torch.int32, device=dev)
    chunk = min(1024, max(16, next_pow2(n)))
    if not count:
        _count_experts_kernel[(num_experts,)](ids_N, counts, n, BLOCK=chunk)
    _align_blocks_kernel[(num_experts,)](
        ids_N, counts, sorted_R, block_expert, block_rows, n, num_experts, blocks,
        BLOCK_M=block_m, BLOCK=chunk, E_PAD=max(16, next_pow2(num_experts)),
        COUNT=count,
    )  # fmt: skip
    return BlockAlignment(
        sorted_pairs=sorted_R, block_expert=block_expert, block_rows=block_rows,
        block_m=block_m,
    )  # fmt: skip


def align_two_launches(
    topk_ids_TK: torch.Tensor, num_experts: int, *, block_m: int
) -> BlockAlignment:
    return align_launches(topk_ids_TK, num_experts, block_m=block_m, count=False)


def align_one_launch(
    topk_ids_TK: torch.Tensor, num_experts: int, *, block_m: int
) -> BlockAlignment:
    return align_launches(topk_ids_TK, num_experts, block_m=block_m, count=True)


def same(a: BlockAlignment, b: BlockAlignment) -> bool:
    if not (
        torch.equal(a.block_expert, b.block_expert)
        and torch.equal(a.block_rows, b.block_rows)
    ):
        return False
    rows = torch.arange(a.block_m, device=a.block_rows.device)
    valid = (rows[None, :] < a.block_rows[:, None]).reshape(-1)
    return torch.equal(a.sorted_pairs[valid], b.sorted_pairs[valid])


class Aligner(Protocol):
    """``align_pairs_to_blocks``'s signature."""

    def __call__(
        self, topk_ids_TK: torch.Tensor, num_experts: int, *, block_m: int
    ) -> BlockAlignment:
        """Group the routed pairs by expert into blocks of ``block_m`` rows."""


def use_aligner(fn: Aligner) -> None:
    """Make ``fused_moe`` align through ``fn`` (it calls the name ``_fused`` imported)."""
    vars(fused)["align_pairs_to_blocks"] = fn


def main() -> None:
    tiny = torch.zeros(1, device="cuda")
    print(
        f"graph of one tiny kernel: {replay_graph(lambda: tiny.add_(1.0))[0] * 1e3:.1f} us"
    )
    for name, (e, k, _d, _f) in MODELS.items():
        for m in MS:
            r = route(m, e, k)
            for bm in (8, 16, 64):
                old = align_two_launches(r.topk_ids, e, block_m=bm)
                new = align_one_launch(r.topk_ids, e, block_m=bm)
                assert same(old, new), (name, m, bm)
            t_old = replay_graph(lambda: align_two_launches(r.topk_ids, e, block_m=16))[
                0
            ]
            t_new = replay_graph(lambda: align_one_launch(r.topk_ids, e, block_m=16))[0]
            print(f"{name:16s} M={m:5d} align: two launches {t_old * 1e3:6.1f} us, "
                  f"one {t_new * 1e3:6.1f} us", flush=True)  # fmt: skip
    for name, (e, k, d, f) in MODELS.items():
        config = MoEConfig(num_experts=e, top_k=k, hidden_size=d, intermediate_size=f)
        q = random_int4(e, d, f)
        w13 = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
        w2 = ExpertMatrix(data=q.w2_qdata, scale=q.w2_scale, group_size=GROUP)
        for m in (4, 16, 64, 256):
            if fused.use_gemv(m * k, w13, w2):
                continue
            x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
            r = route(m, e, k)
            times: dict[str, list[float]] = {"two": [], "one": []}
            outs = {}
            for _ in range(2):
                for label, fn in (
                    ("two", align_two_launches),
                    ("one", align_one_launch),
                ):
                    use_aligner(fn)
                    ms, out = replay_graph(
                        lambda: fused.fused_moe(x, w13, w2, r, config)
                    )
                    times[label].append(ms)
                    outs[label] = out
            use_aligner(align_pairs_to_blocks)
            assert torch.equal(outs["two"], outs["one"]), (name, m)
            print(f"{name:16s} M={m:4d} layer: two launches "
                  f"{' / '.join(f'{t:.4f}' for t in times['two'])} ms, one "
                  f"{' / '.join(f'{t:.4f}' for t in times['one'])} ms", flush=True)  # fmt: skip
        del q, w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
