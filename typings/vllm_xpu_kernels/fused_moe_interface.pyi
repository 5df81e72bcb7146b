# vllm-xpu-kernels 0.1.16.2 (torch 2.14.0+xpu); used by backends/xpu/vllm_kernels.py.
# Closed stub: only XpuFusedMoe.__init__ and XpuFusedMoe.apply.
from torch import Tensor

class XpuFusedMoe:
    def __init__(
        self,
        w13: Tensor,
        w13_scales: Tensor | None,
        w13_bias: Tensor | None,
        w2: Tensor,
        w2_scales: Tensor | None,
        w2_bias: Tensor | None,
        n_experts_per_token: int,
        activation: str,
        num_experts: int,
        ep_rank: int = 0,
        ep_size: int = 1,
        expert_map: Tensor | None = None,
        gemm1_clamp_limit: float | None = None,
        activation_situ_beta: float | None = None,
        activation_situ_linear_beta: float | None = None,
    ) -> None: ...
    def apply(
        self,
        output: Tensor,
        hidden_states: Tensor,
        topk_weights: Tensor,
        topk_ids: Tensor,
        expert_map: Tensor | None = None,
        a1q_scale: Tensor | None = None,
    ) -> None: ...
