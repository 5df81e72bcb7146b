"""Int4MoE on a CUDA device (marker `cuda`: skipped where there is none)."""

import pytest
import torch

from core.config import MoEConfig
from core.reference import moe_forward_reference
from core.routing import route_topk
from core.scheme import INT4_ASYM_G32, INT4_SYM_G128, Int4Scheme
from modules import Int4MoE
from modules.__main__ import main
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
