"""Int4MoE on a CUDA device (marker `cuda`: skipped where there is none)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.config import MoEConfig
from core.quantize import quantize_expert_weights
from core.reference import moe_forward_reference
from core.routing import route_topk
from core.scheme import INT4_ASYM_G32, INT4_SYM_G128, Int4Scheme
from modules import Int4MoE
from modules.__main__ import main
from tests.backends.triton_cuda_cases import run_without_host_sync
from tests.modules.backward_cases import check_gradients
from tests.tolerances import REL_L2_VS_ORACLE, rel_l2

pytestmark = pytest.mark.cuda

CFG = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=512)


@pytest.mark.parametrize("scheme", [INT4_SYM_G128, INT4_ASYM_G32], ids=lambda s: s.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_move_to_cuda_and_back(
    scheme: Int4Scheme, dtype: torch.dtype, generator: torch.Generator
) -> None:
    w13 = torch.randn(16, 1024, 256, generator=generator) * 0.05
    w2 = torch.randn(16, 256, 512, generator=generator) * 0.05
    moe = Int4MoE.from_float(
        w13_weight=w13, w2_weight=w2, config=CFG, scheme=scheme, dtype=dtype
    )
    x = torch.randn(37, 256, generator=generator).to(dtype)
    logits = torch.randn(37, 16, generator=generator)
    cpu_out = moe(x, router_logits=logits)
    cpu_weights = moe.weights  # keeps the CPU tensors after the move
    moe.cuda()
    gpu_out = moe(x.cuda(), router_logits=logits.cuda())
    assert moe.backend_name == "triton-w4a16"
    assert moe.w13_qdata.is_cuda
    expected = moe_forward_reference(
        x.float(), cpu_weights, route_topk(logits, CFG), CFG
    )
    assert rel_l2(expected, gpu_out.cpu()) < REL_L2_VS_ORACLE[dtype]
    moe.cpu()
    torch.testing.assert_close(moe(x, router_logits=logits), cpu_out, rtol=0, atol=0)


def test_demo_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "demo",
                "--model",
                "qwen3-30b-a3b",
                "--tokens",
                "16",
                "--iters",
                "3",
                "--device",
                "cuda",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "backend triton-w4a16" in out


@pytest.mark.parametrize(
    ("backend", "dtype"),
    [
        ("triton-w4a16", torch.bfloat16),
        ("triton-w4a16", torch.float16),
        ("triton-emulation", torch.bfloat16),
    ],
    ids=str,
)
def test_gradients_on_cuda_match_dense_float64(
    backend: str, dtype: torch.dtype, generator: torch.Generator
) -> None:
    """The fused kernels' forward with the reference backward (modules/backward.py)."""
    check_gradients(backend, dtype, "cuda", generator)


# Inductor's own imports use torch.jit.script_method, which torch deprecates (as in
# tests/modules/test_custom_op.py).
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
# Inductor's CUDA-graph tree manager captures an empty graph on purpose when it starts.
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
def test_compiled_with_cuda_graphs_matches_eager(generator: torch.Generator) -> None:
    """torch.compile's CUDA-graph mode captures the layer's op (modules/custom_op.py)."""
    moe = Int4MoE.from_float(
        w13_weight=torch.randn(16, 1024, 256, generator=generator) * 0.05,
        w2_weight=torch.randn(16, 256, 512, generator=generator) * 0.05,
        config=CFG,
        gate_weight=torch.randn(16, 256, generator=generator),
        dtype=torch.bfloat16,
    ).cuda()
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(moe, mode="reduce-overhead", fullgraph=True)
        for tokens in (4, 4, 4, 7):  # warm-up, record, replay; then another shape
            x = torch.randn(tokens, 256, generator=generator).to(torch.bfloat16).cuda()
            torch.testing.assert_close(compiled(x).clone(), moe(x), rtol=0, atol=0)


def _layer_with_map(generator: torch.Generator) -> Int4MoE:
    """12 of the 16 experts held here, with a router: every routing source applies."""
    w13 = torch.randn(12, 1024, 256, generator=generator) * 0.05
    w2 = torch.randn(12, 256, 512, generator=generator) * 0.05
    q = quantize_expert_weights(w13, w2, INT4_SYM_G128, scale_dtype=torch.bfloat16)
    emap = torch.full((16,), -1, dtype=torch.int32)
    emap[torch.randperm(16, generator=generator)[:12]] = torch.arange(
        12, dtype=torch.int32
    )
    return Int4MoE.from_quantized(
        q,
        config=CFG,
        gate_weight=torch.randn(16, 256, generator=generator),
        expert_map=emap,
    ).cuda()


def _routing_inputs(
    tokens: int, generator: torch.Generator
) -> dict[str, dict[str, torch.Tensor]]:
    logits = torch.randn(tokens, 16, generator=generator)
    weights, ids = (
        torch.randn(tokens, 4, generator=generator).softmax(-1),
        torch.stack(
            [torch.randperm(16, generator=generator)[:4] for _ in range(tokens)]
        ),
    )
    return {
        "gate": {},
        "router_logits": {"router_logits": logits.cuda()},
        "topk": {"topk_weights": weights.cuda(), "topk_ids": ids.cuda()},
    }


@pytest.mark.parametrize("source", ["gate", "router_logits", "topk"])
def test_forward_makes_no_host_sync_for_any_routing_source(
    source: str, generator: torch.Generator
) -> None:
    """After the first call (which prepares), no source of routing reads a value back
    to the host: topk ids are range-checked on the device (core/validate.py)."""
    moe = _layer_with_map(generator)
    x = torch.randn(9, 256, generator=generator).to(torch.bfloat16).cuda()
    kwargs = _routing_inputs(9, generator)[source]
    with torch.no_grad():
        eager = moe(x, **kwargs)
        again = run_without_host_sync(lambda: moe(x, **kwargs))
    torch.testing.assert_close(again, eager, rtol=0, atol=0)


@pytest.mark.parametrize("source", ["gate", "router_logits", "topk"])
def test_module_forward_is_captured_in_a_cuda_graph(
    source: str, generator: torch.Generator
) -> None:
    """``torch.cuda.graph`` over the module itself, each routing source; replays on
    new inputs copied into the captured ones match eager calls on them."""
    moe = _layer_with_map(generator)
    x = torch.randn(5, 256, generator=generator).to(torch.bfloat16).cuda()
    kwargs = _routing_inputs(5, generator)[source]
    with torch.no_grad():
        moe(x, **kwargs)  # warm-up: prepares, compiles the kernels
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(x, **kwargs)
        for _ in range(2):
            fresh = _routing_inputs(5, generator)[source]
            x.copy_(torch.randn(5, 256, generator=generator).to(torch.bfloat16))
            for name, tensor in kwargs.items():
                tensor.copy_(fresh[name])
            graph.replay()
            torch.testing.assert_close(out, moe(x, **kwargs), rtol=0, atol=0)


def test_topk_ids_out_of_range_raise_a_device_side_assert() -> None:
    """An id past the experts is not read back (no sync) but asserted on the device:
    the next synchronization raises, in a fresh process (the assert ends its CUDA
    context)."""
    script = """
import torch
from core.config import MoEConfig
from modules import Int4MoE
cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)
moe = Int4MoE.from_float(
    w13_weight=torch.randn(8, 128, 128) * 0.05, w2_weight=torch.randn(8, 128, 64) * 0.05,
    config=cfg,
).cuda()
x = torch.randn(3, 128, dtype=torch.bfloat16, device="cuda")
weights = torch.ones(3, 2, device="cuda")
moe(x, topk_weights=weights, topk_ids=torch.tensor([[0, 1]] * 3, device="cuda"))
torch.cuda.synchronize()
print("VALID RAN", flush=True)
bad = torch.tensor([[0, 1], [2, 8], [3, 4]], device="cuda")
try:
    moe(x, topk_weights=weights, topk_ids=bad)
    torch.cuda.synchronize()
except RuntimeError as error:
    print("RAISED", "device-side assert" in str(error), flush=True)
else:
    print("NOT RAISED", flush=True)
import os
os._exit(0)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "VALID RAN" in done.stdout, done.stderr[-2000:]
    assert "RAISED True" in done.stdout, done.stdout + done.stderr[-2000:]
