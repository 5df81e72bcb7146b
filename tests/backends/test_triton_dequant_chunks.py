"""The dequant path's chunks (``_dequant_chunks.py``): scratch bounds, job order,
serial jobs in the interpreter; on a CUDA GPU (marker ``cuda``) the overlapped jobs
(a side stream, two buffers) against serial ones bit for bit, eager and replayed in
a CUDA graph, against the oracle, and without a host sync.
"""

import pytest
import torch

import backends.triton._configs as configs
from backends.triton import TritonW4A16Backend, TritonW4A16Prepared
from backends.triton._dequant_chunks import (
    Launch,
    chunk_jobs,
    dequant_scratch,
    run_dequant_chunks,
)
from backends.triton._fused import fused_moe
from backends.triton._launch import ExpertMatrix
from core.config import MoEConfig
from core.quantize import dequantize_expert
from core.weights import QuantizedExpertWeights
from tests.backends.triton_cuda_cases import (
    SCHEMES,
    check_graph_replays,
    gpu_routing,
    int4_weights,
    run_without_host_sync,
)
from tests.backends.triton_interpreter_cases import (
    INTERPRETER_ONLY,
    tiny_config,
    weights_for,
)


def _prepared_tiny(
    generator: torch.Generator,
) -> tuple[QuantizedExpertWeights, ExpertMatrix, ExpertMatrix]:
    weights = weights_for(SCHEMES[0], torch.bfloat16, generator)
    prepared = TritonW4A16Backend().prepare(
        weights, tiny_config(), dtype=torch.bfloat16
    )
    return weights, prepared.w13, prepared.w2


def _per_expert_bytes(w13: ExpertMatrix, w2: ExpertMatrix) -> int:
    """Bytes of one expert's larger matrix in 16 bits (two codes a packed byte)."""
    return 2 * 2 * max(w13.data[0].numel(), w2.data[0].numel())


@pytest.mark.parametrize("buffers", [1, 2])
def test_scratch_stays_within_its_byte_bound(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch, buffers: int
) -> None:
    """``DEQUANT_SCRATCH_BYTES`` bounds the buffers together: room for four experts
    gives one buffer of four or two of two, and no more bytes."""
    _, w13, w2 = _prepared_tiny(generator)
    bound = 4 * _per_expert_bytes(w13, w2) + 100
    monkeypatch.setattr(configs, "DEQUANT_SCRATCH_BYTES", bound)
    scratch, step = dequant_scratch(
        w13, w2, torch.bfloat16, torch.device("cpu"), buffers=buffers
    )
    assert len(scratch) == buffers
    assert step == 4 // buffers
    assert sum(s.numel() * s.element_size() for s in scratch) <= bound
    assert all(
        s.numel() * s.element_size() >= step * _per_expert_bytes(w13, w2)
        for s in scratch
    )


def test_scratch_holds_one_expert_at_least(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, w13, w2 = _prepared_tiny(generator)
    monkeypatch.setattr(configs, "DEQUANT_SCRATCH_BYTES", 0)
    scratch, step = dequant_scratch(
        w13, w2, torch.bfloat16, torch.device("cpu"), buffers=2
    )
    assert step == 1
    assert all(
        s.numel() * s.element_size() == _per_expert_bytes(w13, w2) for s in scratch
    )


def test_chunk_jobs_run_w13_then_w2_chunk_by_chunk() -> None:
    assert chunk_jobs(5, 2) == [
        (0, 0, 2), (1, 0, 2), (0, 2, 4), (1, 2, 4), (0, 4, 5), (1, 4, 5),
    ]  # fmt: skip
    assert chunk_jobs(3, 8) == [(0, 0, 3), (1, 0, 3)]


@INTERPRETER_ONLY
def test_jobs_off_cuda_run_serially_on_dequantized_chunks(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off CUDA the jobs run in order on one buffer, whatever ``DEQUANT_OVERLAP``
    says: each launch gets its chunk's experts dequantized (checked against
    ``dequantize_expert`` at launch time, before the buffer is reused, to a bf16
    ulp: the kernel rounds once, the oracle's float32 is not rounded)."""
    weights, w13, w2 = _prepared_tiny(generator)
    monkeypatch.setattr(configs, "DEQUANT_OVERLAP", True)
    monkeypatch.setattr(
        configs, "DEQUANT_SCRATCH_BYTES", 3 * _per_expert_bytes(w13, w2)
    )
    seen: list[tuple[int, int, int]] = []

    def launch(projection: int) -> Launch:
        def run(b: ExpertMatrix, lo: int, hi: int) -> None:
            seen.append((projection, lo, hi))
            for e in range(lo, hi):
                want = dequantize_expert(weights, e, dtype=torch.float32)[projection]
                torch.testing.assert_close(  # bf16: one rounding each, maybe apart
                    b.data[e - lo].float(), want, rtol=2**-7, atol=0.0
                )

        return run

    run_dequant_chunks(
        w13, w2, (launch(0), launch(1)), dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )  # fmt: skip
    assert seen == chunk_jobs(int(w13.data.shape[0]), 3)


def _dequant_layer(
    seed: int,
) -> tuple[MoEConfig, QuantizedExpertWeights, TritonW4A16Prepared]:
    """Eight experts, 128 pairs each at 512 tokens (asymmetric, groups of 128)."""
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=1024, intermediate_size=512)
    weights = int4_weights(
        config, SCHEMES[7], torch.bfloat16, torch.Generator().manual_seed(seed)
    )
    prepared = TritonW4A16Backend().prepare(weights, config, dtype=torch.bfloat16)
    return config, weights, prepared


def _chunking(
    monkeypatch: pytest.MonkeyPatch,
    prepared: TritonW4A16Prepared,
    *,
    overlap: bool,
    experts: int,
) -> None:
    """Chunks of ``experts`` experts, overlapped (two buffers) or not (one)."""
    per = _per_expert_bytes(prepared.w13, prepared.w2)
    monkeypatch.setattr(configs, "DEQUANT_OVERLAP", overlap)
    monkeypatch.setattr(
        configs, "DEQUANT_SCRATCH_BYTES", per * experts * (2 if overlap else 1)
    )


@pytest.mark.cuda
@pytest.mark.parametrize("experts", [1, 3])
def test_overlapped_jobs_equal_serial_ones(
    monkeypatch: pytest.MonkeyPatch, experts: int
) -> None:
    """A buffer rewritten while a GEMM still reads it, or a GEMM started before its
    weights are written, would change outputs now and then: over fresh inputs, the
    overlapped jobs must give, bit for bit, what serial jobs of the same chunks give
    (the same GEMM launches), eagerly and replayed from a CUDA graph captured once.
    Chunks of 1 expert (16 jobs, each buffer reused 7 times) and of 3 (a short last
    chunk)."""
    config, _, prepared = _dequant_layer(seed=5)
    hidden_TD = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, 512)

    def forward() -> torch.Tensor:
        return fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, path="dequant"
        )

    def serial() -> torch.Tensor:
        _chunking(monkeypatch, prepared, overlap=False, experts=experts)
        return forward()

    _chunking(monkeypatch, prepared, overlap=True, experts=experts)
    forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = forward()
    for _ in range(4):
        hidden_TD.copy_(torch.randn_like(hidden_TD))
        fresh = gpu_routing(config, 512)
        routing.topk_ids.copy_(fresh.topk_ids)
        routing.topk_weights.copy_(fresh.topk_weights)
        _chunking(monkeypatch, prepared, overlap=True, experts=experts)
        eager = forward()
        graph.replay()
        want = serial()
        assert torch.equal(eager, want)
        assert torch.equal(replayed, want)


@pytest.mark.cuda
def test_overlapped_jobs_replay_against_the_oracle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, weights, prepared = _dequant_layer(seed=6)
    _chunking(monkeypatch, prepared, overlap=True, experts=3)
    hidden_TD = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, 512)
    check_graph_replays(
        lambda: fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, path="dequant"
        ),
        hidden_TD, routing, weights, config,
    )  # fmt: skip


@pytest.mark.cuda
def test_overlapped_jobs_make_no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    config, _, prepared = _dequant_layer(seed=7)
    _chunking(monkeypatch, prepared, overlap=True, experts=3)
    hidden_TD = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
    routing = gpu_routing(config, 512)
    run_without_host_sync(
        lambda: fused_moe(
            hidden_TD, prepared.w13, prepared.w2, routing, config, path="dequant"
        )
    )
