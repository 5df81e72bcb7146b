"""The layer's gradients against torch autograd through the float64 dense MoE.

Shared by test_backward.py (CPU, the Triton backends in the interpreter) and
test_int4_moe_cuda.py (the same check on a GPU).
"""

import warnings

import torch

from backends.triton import EmulationMemoryWarning
from core.config import MoEConfig
from core.routing import route_topk
from core.scheme import INT4_SYM_G32
from modules import Int4MoE
from tests.dense import dense_moe_f64, dequant_f64
from tests.tolerances import REL_L2_VS_ORACLE, rel_l2

CONFIG = MoEConfig(num_experts=4, top_k=2, hidden_size=96, intermediate_size=64)


def check_gradients(
    backend: str, dtype: torch.dtype, device: str, generator: torch.Generator
) -> None:
    """Gradients of the input and the router logits through ``backend``.

    Both within ``REL_L2_VS_ORACLE[dtype]``: autograd hands the layer the loss's gradient
    rounded to the output's dtype, and the input's gradient is rounded to ``dtype``
    again (the router logits' stays float32 but is computed from the rounded one).
    """
    e, d, f = CONFIG.num_experts, CONFIG.hidden_size, CONFIG.intermediate_size
    moe = Int4MoE.from_float(
        w13_weight=torch.randn(e, 2 * f, d, generator=generator) / d**0.5,
        w2_weight=torch.randn(e, d, f, generator=generator) / f**0.5,
        config=CONFIG, scheme=INT4_SYM_G32, dtype=dtype,
    ).to(device)  # fmt: skip
    moe.backend = backend
    x = torch.randn(5, d, generator=generator).to(dtype).to(device).requires_grad_()
    logits = torch.randn(5, e, generator=generator).to(device).requires_grad_()
    grad = torch.randn(5, d, generator=generator).to(device)
    with warnings.catch_warnings():
        # triton-emulation's memory warning is tested elsewhere
        warnings.simplefilter("ignore", EmulationMemoryWarning)
        out = moe(x, router_logits=logits)
    assert moe.backend_name == backend
    assert out.requires_grad
    torch.autograd.backward((out.float() * grad).sum())
    assert x.grad is not None
    assert logits.grad is not None

    q = moe.to("cpu").weights  # the dense reference runs on the CPU
    x64 = x.detach().cpu().double().requires_grad_()
    logits32 = logits.detach().cpu().requires_grad_()
    routing = route_topk(logits32, CONFIG)
    expected_out = dense_moe_f64(
        x64,
        dequant_f64(q.w13_qdata, q.w13_scale, q.w13_zero_point),
        dequant_f64(q.w2_qdata, q.w2_scale, q.w2_zero_point),
        routing.topk_weights,
        routing.topk_ids,
        config=CONFIG,
    )
    torch.autograd.backward((expected_out * grad.double().cpu()).sum())
    assert x64.grad is not None
    assert logits32.grad is not None
    assert rel_l2(x64.grad, x.grad.cpu()) < REL_L2_VS_ORACLE[dtype]
    assert rel_l2(logits32.grad, logits.grad.cpu()) < REL_L2_VS_ORACLE[dtype]
