"""Fused routing: ``core.routing.route_topk`` in one Triton launch.

The torch form of routing is 3 to 15 small kernels (score, bias, group mask, top-k,
gather, renormalize, scale: 6 for Mixtral, 15 for DeepSeek-V3); on the GPU each is a
launch of a few us, and in eager mode each costs the host a few us more.
``route_topk_fused`` does the same math in one kernel (``_kernels_route.py``) and falls
back to ``route_topk`` where it cannot: when a gradient must flow through the weights
(the kernel has no backward), for fake tensors, or for more experts, choices or groups
than it unrolls (``fuses``). May import core; triton only inside functions. Shape
legend: ``T`` tokens, ``E`` experts, ``K`` top_k.
"""

import functools
import importlib.util
from typing import Final

import torch
from torch._subclasses.fake_tensor import is_fake

from backends.triton._configs import ceil_div, next_pow2
from backends.triton._launch import is_interpreting
from core.config import MoEConfig
from core.errors import DeviceError
from core.routing import Routing, TopkRouter, check_routing_inputs, route_topk

MAX_FUSED_EXPERTS: Final = 1024
"""Most experts one kernel program holds (a token's logits live in registers).

Twice the most of any public MoE (512, Qwen3-Next); ``bench/compile_launches.py``
compiles the kernel at this size.
"""

MAX_FUSED_TOP_K: Final = 64
"""Most choices a token makes in the kernel (its top-k loop is unrolled)."""

MAX_FUSED_GROUPS: Final = 64
"""Most expert groups of grouped top-k in the kernel (its group loop is unrolled)."""

_ELEMENTS_PER_PROGRAM: Final = 2048
"""Tokens per program: as many as keep ``BLOCK_T * BLOCK_E`` at this (4 warps).

Offline sm_90 (Triton 3.7): 4096 took 254-255 registers at 128 and 256 experts, 2048
about half; not timed on a GPU.
"""


def fuses(router_logits_TE: torch.Tensor, config: MoEConfig) -> bool:
    """Whether ``route_topk_fused`` runs its kernel here (else it is ``route_topk``).

    Not when autograd must see the weights (``router_logits`` requiring grad under
    grad mode): the kernel has no backward, and the router would get no gradient.
    Not for fake tensors (tracing), which torch's ops handle. Nor past
    ``MAX_FUSED_EXPERTS``, ``MAX_FUSED_TOP_K`` or ``MAX_FUSED_GROUPS``.
    """
    if torch.is_grad_enabled() and router_logits_TE.requires_grad:
        return False
    if is_fake(router_logits_TE):  # traced shapes only: torch's ops make the fakes
        return False
    return (
        config.num_experts <= MAX_FUSED_EXPERTS
        and config.top_k <= MAX_FUSED_TOP_K
        and (config.num_expert_group or 0) <= MAX_FUSED_GROUPS
    )


def route_topk_fused(
    router_logits_TE: torch.Tensor,
    config: MoEConfig,
    *,
    correction_bias: torch.Tensor | None = None,
) -> Routing:
    """``route_topk`` (every option of ``config``) in one Triton launch.

    The same checks, errors and results as ``route_topk``: float32 weights and int64
    ids, the experts in descending order of choice. An exact tie takes the lower
    expert id (torch's order is unspecified there) and a near-tie (two choices within
    float32 rounding) may go either way: at the K-th place or between groups, that
    changes the experts chosen. NaN ranks above every number, as in ``torch.topk``;
    whatever the logits, the ids are K distinct experts below E. Falls back to
    ``route_topk`` where ``fuses`` says no.

    Raises:
        ShapeError, DTypeError, ConfigTypeError: as ``route_topk``.
        DeviceError: when ``correction_bias`` is not on ``router_logits``' device
            (torch's ops raise their own error there).
    """
    check_routing_inputs(router_logits_TE, config, correction_bias)
    if not fuses(router_logits_TE, config):
        return route_topk(router_logits_TE, config, correction_bias=correction_bias)
    if correction_bias is not None:
        if correction_bias.device != router_logits_TE.device:
            raise DeviceError(
                "correction_bias must be on the device of router_logits "
                f"({router_logits_TE.device}), got {correction_bias.device}"
            )
        correction_bias = correction_bias.contiguous()
    from backends.triton._kernels_route import _route_topk_kernel

    t, e = router_logits_TE.shape
    k = config.top_k
    device = router_logits_TE.device
    weights_TK = torch.empty(t, k, dtype=torch.float32, device=device)
    ids_TK = torch.empty(t, k, dtype=torch.int64, device=device)
    if t == 0:
        return Routing(topk_weights=weights_TK, topk_ids=ids_TK)
    block_e = next_pow2(e)
    block_t = min(next_pow2(t), max(1, _ELEMENTS_PER_PROGRAM // block_e))
    groups = config.num_expert_group or 0
    group_size = e // groups if groups else e
    _route_topk_kernel[(ceil_div(t, block_t),)](
        router_logits_TE,
        router_logits_TE if correction_bias is None else correction_bias,
        weights_TK,
        ids_TK,
        t,
        e,
        group_size,
        router_logits_TE.stride(0),
        router_logits_TE.stride(1),
        float(config.routed_scaling_factor),
        TOP_K=k,
        BLOCK_T=block_t,
        BLOCK_E=block_e,
        BLOCK_K=next_pow2(k),
        SIGMOID=config.scoring_func == "sigmoid",
        HAS_BIAS=correction_bias is not None,
        RENORM=config.renormalize,
        GROUPS=groups,
        TOPK_GROUP=config.topk_group or 0,
        TOP2_SUM=groups > 0 and config.group_ranking == "top2_sum" and group_size > 1,
    )
    return Routing(topk_weights=weights_TK, topk_ids=ids_TK)


def fused_router_for(device: torch.device) -> TopkRouter:
    """The router for inputs on ``device``: ``route_topk_fused`` on CUDA, else ``route_topk``.

    CUDA here is where Triton compiles (triton installed). The interpreter
    (``TRITON_INTERPRET=1``) keeps ``route_topk``: interpreting a kernel is far
    slower than torch's CPU ops.
    """
    compiled = device.type == "cuda" and not is_interpreting()
    return route_topk_fused if compiled and _triton_installed() else route_topk


@functools.cache
def _triton_installed() -> bool:
    """Whether triton can be imported; asked once (``fused_router_for`` runs every call)."""
    return importlib.util.find_spec("triton") is not None
