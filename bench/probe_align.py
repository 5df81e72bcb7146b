"""One-launch alignment against the two launches it replaced (commit df0d997's).

Run on the GPU from the repository root: ``python bench/probe_align.py``. For each
model shape and M, CUDA-graph replay (L2 flushed before each, median of 50, as
``bench_gpu.py`` times) of the alignment alone, the two-launch form (a count kernel,
then the placing kernel reading its counts) against ``align_pairs_to_blocks`` (one
launch whose programs count every expert themselves), both checked to place the same
pairs in the same blocks; then, where the layer takes the ``gemm`` path, the whole
layer with each, alternated twice.
"""

# ruff: noqa: B023, D103, F821, T201, TID253
# A GPU script, not library code: print is its output, and each closure is replayed
# inside the loop iteration that defines it.

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gpu import GROUP, MODELS, MS, random_int4, replay_graph, route

import backends.triton._fused as fused
from backends.triton._align import BlockAlignment, align_pairs_to_blocks, max_row_blocks
from backends.triton._configs import next_pow2
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, num_pairs, BLOCK: tl.constexpr):
    e = tl.program_id(0)
    hits = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
        hits += (ids == e).to(tl.int32)
    tl.store(counts_ptr + e, tl.sum(hits, axis=0))


@triton.jit
def _place_kernel(
    ids_ptr, counts_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, num_pairs,
    num_experts, max_blocks,
    BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, E_PAD: tl.constexpr,
):  # fmt: skip
    e = tl.program_id(0)
    offs_e = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + offs_e, mask=offs_e < num_experts, other=0)
    nblocks = (counts + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(nblocks, axis=0)
    my_count = tl.sum(tl.where(offs_e == e, counts, 0), axis=0)
    my_blocks = (my_count + BLOCK_M - 1) // BLOCK_M
    first = tl.sum(tl.where(offs_e == e, ends, 0), axis=0) - my_blocks
    running = tl.zeros([], dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
        hit = (ids == e).to(tl.int32)
        rank = running + tl.cumsum(hit, axis=0) - 1
        tl.store(sorted_ptr + first * BLOCK_M + rank, offs, mask=hit == 1)
        running += tl.sum(hit, axis=0)
    for j in range(0, my_blocks, BLOCK):
        jb = j + tl.arange(0, BLOCK)
        keep = jb < my_blocks
        rows = tl.minimum(my_count - jb * BLOCK_M, BLOCK_M)
        tl.store(block_expert_ptr + first + jb, tl.zeros_like(jb) + e, mask=keep)
        tl.store(block_rows_ptr + first + jb, rows, mask=keep)
    if e == 0:
        for start in range(tl.sum(nblocks, axis=0), max_blocks, BLOCK):
            jb = start + tl.arange(0, BLOCK)
            keep = jb < max_blocks
            tl.store(block_expert_ptr + jb, tl.zeros_like(jb) - 1, mask=keep)
            tl.store(block_rows_ptr + jb, tl.zeros_like(jb), mask=keep)


def align_two_launches(
    topk_ids_TK: torch.Tensor, num_experts: int, *, block_m: int
) -> BlockAlignment:
    ids_N = topk_ids_TK.reshape(-1).contiguous()
    n = int(ids_N.shape[0])
    blocks = max_row_blocks(n, num_experts, block_m)
    dev = ids_N.device
    counts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    sorted_R = torch.empty(blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=dev)
    block_rows = torch.empty(blocks, dtype=torch.int32, device=dev)
    chunk = min(1024, max(16, next_pow2(n)))
    _count_kernel[(num_experts,)](ids_N, counts, n, BLOCK=chunk)
    _place_kernel[(num_experts,)](
        ids_N, counts, sorted_R, block_expert, block_rows, n, num_experts, blocks,
        BLOCK_M=block_m, BLOCK=chunk, E_PAD=max(16, next_pow2(num_experts)),
    )  # fmt: skip
    return BlockAlignment(
        sorted_pairs=sorted_R, block_expert=block_expert, block_rows=block_rows,
        block_m=block_m,
    )  # fmt: skip


def same(a: BlockAlignment, b: BlockAlignment) -> bool:
    if not (
        torch.equal(a.block_expert, b.block_expert)
        and torch.equal(a.block_rows, b.block_rows)
    ):
        return False
    rows = torch.arange(a.block_m, device=a.block_rows.device)
    valid = (rows[None, :] < a.block_rows[:, None]).reshape(-1)
    return torch.equal(a.sorted_pairs[valid], b.sorted_pairs[valid])


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
                new = align_pairs_to_blocks(r.topk_ids, e, block_m=bm)
                assert same(old, new), (name, m, bm)
            t_old = replay_graph(lambda: align_two_launches(r.topk_ids, e, block_m=16))[
                0
            ]
            t_new = replay_graph(
                lambda: align_pairs_to_blocks(r.topk_ids, e, block_m=16)
            )[0]
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
                    ("one", align_pairs_to_blocks),
                ):
                    fused.align_pairs_to_blocks = fn  # type: ignore[assignment]
                    ms, out = replay_graph(
                        lambda: fused.fused_moe(x, w13, w2, r, config)
                    )
                    times[label].append(ms)
                    outs[label] = out
            fused.align_pairs_to_blocks = align_pairs_to_blocks
            assert torch.equal(outs["two"], outs["one"]), (name, m)
            print(f"{name:16s} M={m:4d} layer: two launches "
                  f"{' / '.join(f'{t:.4f}' for t in times['two'])} ms, one "
                  f"{' / '.join(f'{t:.4f}' for t in times['one'])} ms", flush=True)  # fmt: skip
        del q, w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
