"""The ``dequant`` path's chunks: experts dequantized to 16 bits, then their GEMMs.

May import core; triton only inside functions. Each projection of each chunk of
experts is one job: dequantize the chunk's int4 weights into a scratch buffer
(``dequantize_experts``), then run its GEMM on them. Serially (one buffer, one stream),
or with ``DEQUANT_OVERLAP`` on a CUDA device, two buffers and a second stream: job
``j + 1``'s dequantization (memory-bound) runs on the side stream while job ``j``'s
GEMM (compute-bound) runs on the caller's stream. Events order each GEMM after its
dequantization and each dequantization after the GEMM that last read its buffer. The
side stream forks from the caller's stream and joins it before the return, so the
whole can be captured in a CUDA graph, and nothing waits on the host.
"""

from collections.abc import Callable

import torch

import backends.triton._configs as configs
from backends.triton._launch import ExpertMatrix
from backends.triton._launch_dequant import dequantize_experts

Launch = Callable[[ExpertMatrix, int, int], None]
"""A GEMM launch on 16-bit weights of experts ``lo .. hi-1`` (the matrix, lo, hi)."""

_SIDE_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}
"""The side stream per (device index, priority), made on first use."""


def dequant_scratch(
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    dtype: torch.dtype,
    device: torch.device,
    *,
    buffers: int = 1,
) -> tuple[list[torch.Tensor], int]:
    """``buffers`` scratch buffers and the experts a chunk holds.

    Together at most ``DEQUANT_SCRATCH_BYTES``, but each holds one expert at least: one
    expert's larger matrix has ``2 * numel`` 16-bit values (two codes a byte).
    """
    per_expert = 2 * max(int(w13.data[0].numel()), int(w2.data[0].numel()))
    fits = configs.DEQUANT_SCRATCH_BYTES // (buffers * 2 * per_expert)
    step = max(1, min(int(w13.data.shape[0]), fits))
    made = [
        torch.empty(step * per_expert, dtype=dtype, device=device)
        for _ in range(buffers)
    ]
    return made, step


def dequantized(
    b: ExpertMatrix, lo: int, hi: int, scratch: torch.Tensor
) -> ExpertMatrix:
    """Experts ``lo .. hi-1`` of ``b`` dequantized into the front of ``scratch``."""
    rows, cols = int(b.data.shape[1]), 2 * int(b.data.shape[2])
    out = scratch[: (hi - lo) * rows * cols].view(hi - lo, rows, cols)
    dequantize_experts(b, lo, hi, out)
    return ExpertMatrix(data=out, bias=b.bias)  # bias rows are indexed by global expert


def chunk_jobs(num_experts: int, step: int) -> list[tuple[int, int, int]]:
    """The jobs in launch order: ``(projection, lo, hi)``, 0 w13 and 1 w2.

    Chunk by chunk, w13 then w2 of each chunk of ``step`` experts.
    """
    return [
        (projection, lo, min(lo + step, num_experts))
        for lo in range(0, num_experts, step)
        for projection in (0, 1)
    ]


def _side_stream(device: torch.device, priority: int) -> torch.cuda.Stream:
    """The side stream of ``device`` (a tensor's, so it has an index) at ``priority``."""
    key = (device.index, priority)
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            device=device, priority=priority
        )
    return _SIDE_STREAMS[key]


def run_dequant_chunks(
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    launches: tuple[Launch, Launch],
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Every job of ``chunk_jobs``: dequantize, then ``launches[projection]`` on it.

    Overlapped on a side stream (priority ``DEQUANT_STREAM_PRIORITY``) where
    ``DEQUANT_OVERLAP`` and ``device`` is CUDA, else serially (module doc).
    """
    overlap = configs.DEQUANT_OVERLAP and device.type == "cuda"
    scratch, step = dequant_scratch(w13, w2, dtype, device, buffers=2 if overlap else 1)
    matrices = (w13, w2)
    jobs = chunk_jobs(int(w13.data.shape[0]), step)
    if not overlap:
        for projection, lo, hi in jobs:
            b = dequantized(matrices[projection], lo, hi, scratch[0])
            launches[projection](b, lo, hi)
        return
    main = torch.cuda.current_stream(device)
    side = _side_stream(device, configs.DEQUANT_STREAM_PRIORITY)
    side.wait_stream(main)  # the caller's inputs, and the buffers' allocation
    freed: list[torch.cuda.Event | None] = [None, None]
    for j, (projection, lo, hi) in enumerate(jobs):
        with torch.cuda.stream(side):
            last_read = freed[j % 2]
            if last_read is not None:
                side.wait_event(last_read)
            b = dequantized(matrices[projection], lo, hi, scratch[j % 2])
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
            ready.record(side)
        main.wait_event(ready)
        launches[projection](b, lo, hi)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
        done.record(main)
        freed[j % 2] = done
    main.wait_stream(side)  # join: the capture and later work see every write
