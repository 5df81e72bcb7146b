# intel-extension-for-pytorch 2.8.0 (archived; XPU path from _IPEXGatedMLPMOEXPU);
# used by backends/xpu/ipex.py. Closed stub: GatedMLPMOE construction and call only.
from collections.abc import Callable

from torch import Tensor, nn

class GatedMLPMOE(nn.Module):
    def __init__(
        self,
        W13: Tensor,
        W2: Tensor,
        W3: Tensor | None = None,
        use_prepack: bool = True,
        *,
        w1_scale_inv: Tensor | None = None,
        w2_scale_inv: Tensor | None = None,
        is_int4: bool = False,
        experts_start_id: int = 0,
    ) -> None: ...
    def __call__(
        self,
        hidden_states: Tensor,
        use_grouped_topk: bool,
        top_k: int,
        router_logits: Tensor,
        renormalize: bool,
        topk_group: int | None = None,
        num_expert_group: int | None = None,
        custom_routing_function: Callable[..., tuple[Tensor, Tensor]] | None = None,
        scoring_func: str | None = "sigmoid",
        activation: str | None = "silu",
    ) -> Tensor: ...
