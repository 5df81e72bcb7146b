"""Read-bandwidth ceilings on the GPU: how fast can a Triton kernel stream int32 words?

``python bench/probe_read.py`` times (CUDA-graph replay, L2 flushed) a 2 GiB read by
torch's ``sum`` and by ``_stream`` (each program xor-reduces chunks of ``UNROLL``
loads of ``BLOCK`` words, grid-strided over ``P`` programs; ``P = 0``: one chunk per
program), then the word GEMV's program shape with its math left out
(``probe_kernels_layout``, ``MODE`` 9 one step in flight, 8 two) over Mixtral-8x7B's
w13 at one token. Prints TB/s of bytes read; the copy (read + write) for scale.

``python bench/probe_read.py sizes``: torch's ``sum`` and ``_stream`` over the decode
layers' read sizes (``SIZES_MB``), microseconds and TB/s under the same replay.

``python bench/probe_read.py tiles``: the decode GEMM's read pattern with no math
(``_tile_read``): programs of ``BN`` weight rows walk K in steps of ``SW`` words
(64 bytes a row at the Gluon kernel's 128 columns), each step's words loaded one
step ahead and xor-reduced, over a DeepSeek-V3 M = 64 sized w13 (222 experts); rows
in the canonical row-major order or each (row tile, step) tile contiguous; one
program per row tile or a persistent grid of ``P`` programs.
"""

# ruff: noqa: B023, D103, T201, TID253
# A GPU script: print is its output.

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_gpu
from bench_gpu import GROUP, MODELS, copy_bandwidth, random_int4, route, time_graph
from probe_kernels_layout import layout_launch

from backends.triton._launch import ExpertMatrix


@triton.jit
def _stream(
    src, out, n_chunks, P, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    bits = tl.zeros([BLOCK], dtype=tl.int32)
    for c in range(pid, n_chunks, P):
        base = src + tl.cast(c, tl.int64) * (BLOCK * UNROLL)
        v = tl.load(base + offs)
        if UNROLL >= 2:
            v ^= tl.load(base + BLOCK + offs)
        if UNROLL >= 4:
            v ^= tl.load(base + 2 * BLOCK + offs) ^ tl.load(base + 3 * BLOCK + offs)
        bits ^= v
    tl.store(out + pid * BLOCK + offs, bits)


def stream(buf: torch.Tensor, block: int, unroll: int, warps: int, p: int) -> float:
    n_chunks = buf.numel() // (block * unroll)
    grid = p or n_chunks
    out = torch.empty(grid * block, dtype=torch.int32, device="cuda")

    def run() -> None:
        _stream[(grid,)](buf, out, n_chunks, grid, BLOCK=block, UNROLL=unroll,
                         num_warps=warps)  # fmt: skip

    ms = time_graph(run)
    assert ms is not None
    return buf.numel() * 4 / ms / 1e9


@triton.jit
def _tile_read(
    src, out, n_tiles, steps, kw_total, P, BN: tl.constexpr, SW: tl.constexpr,
    TILED: tl.constexpr, HALVES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rows = tl.arange(0, BN)[:, None]
    cols = tl.arange(0, SW)[None, :]
    bits = tl.zeros([BN, SW], dtype=tl.int32)
    if HALVES:  # a step of 2 * SW words as two loads of SW, one after the other
        for t in range(pid, n_tiles, P):
            base = src + (tl.cast(t, tl.int64) * BN + rows) * kw_total + cols
            nxt = tl.load(base)
            nxt2 = tl.load(base + SW)
            for s in range(1, steps + 1):
                cur = nxt
                cur2 = nxt2
                m = (s < steps) & (cols >= 0)
                nxt = tl.load(base + s * 2 * SW, mask=m, other=0)
                nxt2 = tl.load(base + s * 2 * SW + SW, mask=m, other=0)
                bits ^= cur ^ cur2
        tl.store(out + pid * BN * SW + rows * SW + cols, bits)
        return
    for t in range(pid, n_tiles, P):
        if TILED:  # tile (t, step) at ((t * steps + step) * BN + row) * SW + word
            base = src + tl.cast(t, tl.int64) * steps * BN * SW + rows * SW + cols
            stride = BN * SW
        else:
            base = src + (tl.cast(t, tl.int64) * BN + rows) * kw_total + cols
            stride = SW
        nxt = tl.load(base)
        for s in range(1, steps + 1):
            cur = nxt
            nxt = tl.load(base + s * stride, mask=(s < steps) & (cols >= 0), other=0)
            bits ^= cur
    tl.store(out + pid * BN * SW + rows * SW + cols, bits)


def tile_reads(sms: int) -> None:
    """TB/s of the decode GEMM's read pattern, DeepSeek-V3 w13 at M = 64 (222 experts)."""
    n, kw_total = 222 * 4096, 7168 // 8
    buf = torch.randint(-(2**31), 2**31 - 1, (n * kw_total,), dtype=torch.int32,
                        device="cuda")  # fmt: skip
    for bn in (128, 64):
        for per_sm in (0, 3, 6):
            n_tiles, steps = n // bn, kw_total // 32
            grid = per_sm * sms or n_tiles
            out = torch.empty(grid * bn * 16, dtype=torch.int32, device="cuda")

            def run2(g: int = grid, o: torch.Tensor = out) -> None:
                _tile_read[(g,)](buf, o, n_tiles, steps, kw_total, g, BN=bn,
                                 SW=16, TILED=0, HALVES=1, num_warps=4)  # fmt: skip

            ms = time_graph(run2)
            assert ms is not None
            print(f"tiles {bn:3d} rows x 2 loads of 64 B P={grid:6d}: "
                  f"{buf.numel() * 4 / ms / 1e9:5.2f} TB/s", flush=True)  # fmt: skip
    for bn in (128, 64):
        for sw in (16, 32, 64, 128):
            for tiled in (0, 1):
                for per_sm in (0, 3, 6):
                    n_tiles, steps = n // bn, kw_total // sw
                    grid = per_sm * sms or n_tiles
                    out = torch.empty(grid * bn * sw, dtype=torch.int32, device="cuda")

                    def run(g: int = grid, o: torch.Tensor = out) -> None:
                        _tile_read[(g,)](buf, o, n_tiles, steps, kw_total, g, BN=bn,
                                         SW=sw, TILED=tiled, HALVES=0,
                                         num_warps=4)  # fmt: skip

                    ms = time_graph(run)
                    assert ms is not None
                    print(f"tiles {bn:3d} rows x {4 * sw:3d} B tiled={tiled} "
                          f"P={grid:6d}: {buf.numel() * 4 / ms / 1e9:5.2f} TB/s",
                          flush=True)  # fmt: skip


def read_ceilings(sms: int) -> None:
    buf = torch.randint(-(2**31), 2**31 - 1, (512 * 1024**2,), dtype=torch.int32,
                        device="cuda")  # fmt: skip
    ms = time_graph(lambda: buf.view(torch.float32).sum())
    assert ms is not None
    print(
        f"torch float32 sum        : {buf.numel() * 4 / ms / 1e9:5.2f} TB/s", flush=True
    )
    for warps in (1, 4, 8):
        for block in (256, 512, 1024, 2048):
            if block < 32 * warps * 2:
                continue
            for unroll in (1, 2, 4):
                for p in (0, 4 * sms, 16 * sms, 32 * sms):
                    tbs = stream(buf, block, unroll, warps, p)
                    print(f"stream w{warps} {4 * block:5d} B x{unroll} P={p:5d}: "
                          f"{tbs:5.2f} TB/s", flush=True)  # fmt: skip


SIZES_MB = (19, 25, 50, 59, 75, 117, 176, 352, 704, 2048)
"""``sizes``: the decode layers' read sizes (Qwen3-30B-A3B M = 1's 19 MB to Mixtral
M = 1's w13, 117 MB, and up)."""


def read_sizes(sms: int) -> None:
    """Microseconds and TB/s to read ``SIZES_MB`` once, after each way of flushing L2.

    ``bench_gpu.FLUSH_MODE`` ``write`` and ``read``.
    """
    for mode in ("write", "read"):
        bench_gpu.FLUSH_MODE = mode
        print(f"L2 flushed by a {mode}", flush=True)
        _read_sizes(sms)


def _read_sizes(sms: int) -> None:
    tiny = torch.zeros(1, device="cuda")
    base = time_graph(lambda: tiny.add_(1.0))
    assert base is not None
    print(f"empty graph {base * 1e3:.1f} us", flush=True)
    for mb in SIZES_MB:
        buf = torch.randint(-(2**31), 2**31 - 1, (mb * 2**18,), dtype=torch.int32,
                            device="cuda")  # fmt: skip
        ms = time_graph(lambda: buf.view(torch.float32).sum())
        assert ms is not None
        tbs = [stream(buf, 512, 2, 4, p) for p in (0, 16 * sms)]
        print(
            f"{mb:5d} MB: torch sum {ms * 1e3:7.1f} us {mb * 2**20 / ms / 1e9:5.2f} TB/s"
            f" ({mb * 2**20 / (ms - base) / 1e9:5.2f} less the empty graph); stream"
            f" 2048 B x2 w4, one chunk a program {tbs[0]:5.2f}, P = 16/SM {tbs[1]:5.2f}"
            " TB/s",
            flush=True,
        )


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"copy {copy_bandwidth() / 1e12:.2f} TB/s (read + write), {sms} SMs", flush=True
    )
    if sys.argv[1:2] == ["sizes"]:
        read_sizes(sms)
        return
    if sys.argv[1:2] == ["tiles"]:
        tile_reads(sms)
        return
    read_ceilings(sms)
    torch.cuda.empty_cache()
    e, k, d, f = MODELS["mixtral-8x7b"]
    q = random_int4(e, d, f)
    b = ExpertMatrix(data=q.w13_qdata, scale=q.w13_scale, group_size=GROUP)
    ids = route(1, e, k).topk_ids.flatten().contiguous()
    x = torch.randn(1, d, device="cuda").to(torch.bfloat16)
    nbytes = int(torch.unique(ids).numel()) * b.data[0].numel()
    for bn, warps in ((8, 1), (16, 1), (32, 4), (64, 4), (16, 2)):
        for blocked in (0, 1):
            for mode in (9, 8):
                out = torch.empty(1, ids.numel(), 2 * f, device="cuda")
                kw = {"bn": bn, "bk": 512, "warps": warps, "split": 1,
                      "blocked": blocked, "mode": mode}  # fmt: skip

                def run(kw: dict[str, int] = kw, out: torch.Tensor = out) -> object:
                    return layout_launch(x, b, out, ids, a_div=k, **kw)

                ms = time_graph(run)
                assert ms is not None
                print(f"gemv shape {bn}x512 w{warps} blocked={blocked} mode={mode}: "
                      f"{nbytes / ms / 1e9:5.2f} TB/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
