"""CPUInt4Backend: PyTorch's own CPU int4 matmul (``_weight_int4pack_mm_for_cpu``).

May import core only; the aten ops are looked up lazily. Shape legend: ``T`` tokens,
``D`` hidden size, ``F`` intermediate size, ``H`` = 2F, ``E`` experts, ``K`` top_k,
``N`` = T*K routed pairs, ``G`` groups along a reduction dimension.

The kernel computes ``w = (q - 8) * scale + zero`` per (group, output row), with
``scale_and_zero`` of shape ``(G, rows, 2)`` in its compute dtype (bf16 here).
Symmetric codes have ``zero = 0``; an integer zero point ``z`` gives
``(q - z) * scale`` with ``zero = (8 - z) * scale``. The packed weight is opaque and
ISA-dependent, so it lives only in ``CPUInt4Prepared`` and is rebuilt by every
``prepare``; it is never saved.
"""

from typing import Final, final

import attrs
import torch

from backends.base import DeviceInfo, PreparedExperts, Support, check_prepared
from core.activation import apply_activation
from core.config import MoEConfig
from core.errors import BackendUnavailableError
from core.layout import CANONICAL_LAYOUT, WeightLayout
from core.packing import unpack_int4
from core.routing import Routing, sort_tokens_by_expert
from core.scheme import Int4Scheme
from core.validate import check_local_ids
from core.weights import QuantizedExpertWeights

_PACK_OP: Final = "_convert_weight_to_int4pack_for_cpu"
_MM_OP: Final = "_weight_int4pack_mm_for_cpu"
KERNEL_GROUP_SIZES: Final = (32, 64, 128, 256)
"""Group sizes ``_weight_int4pack_mm_for_cpu`` accepts (checked in its source). A larger
group (``group_size=-1``: one group per row) runs as the largest of these that divides it,
its scale repeated for each piece (``kernel_group_size``): exact, the same weights."""
ROW_MULTIPLE: Final = 16
"""Output rows of each packed weight must be a multiple of this (the packer's check)."""
ACTIVATION_DTYPES: Final = (torch.bfloat16, torch.float16, torch.float32)
"""Accepted input dtypes; every one computes in ``KERNEL_DTYPE``."""
KERNEL_DTYPE: Final = torch.bfloat16
"""The dtype the GEMMs run in, whatever the input's (W4A16: 16-bit activations).

On torch 2.13 the kernel's own fp16 and fp32 paths are slow: with fp32 a layer took
35-57x as long as with bf16 at M = 1 and 16, longer than dequantizing the experts for
float32 GEMMs from M = 16 on (bench/RESULTS_CPU.md).
So fp16 and fp32 inputs are rounded to bf16 on the way in, and the output (accumulated
in float32) is converted back: the error against float32 math on the same int4 weights
is that of bf16 inputs (about 4e-3 relative L2 on a Qwen3-30B-A3B layer, some 40x
below int4's own rounding error; 2.5e-3 to 6e-3 on random layers, more where the
activation cancels large inputs), 12-22x faster than that float32 math at M <= 64
(bench/RESULTS_CPU.md). The ``reference`` backend is the float32 math throughout."""
_SYM_OFFSET: Final = 8
# innerKTiles matters only to the CUDA packer; the CPU packer ignores it (the bytes are
# identical for 1, 2, 4 and 8 on torch 2.13), so any valid value will do.
_INNER_K_TILES: Final = 2


@final
@attrs.frozen(kw_only=True, eq=False)
class CPUInt4Prepared(PreparedExperts):
    """The experts packed for torch's CPU int4 kernel (opaque, never serialized).

    Attributes:
        w13_packed: ``(E, ...)`` uint8, each ``[e]`` the packed ``(2F, D)`` codes.
        w13_scale_and_zero: ``(E, D / w13_group_size, 2F, 2)`` in ``KERNEL_DTYPE``.
        w13_group_size: the kernel group size along ``D`` (``kernel_group_size``).
        w2_packed: ``(E, ...)`` uint8, each ``[e]`` the packed ``(D, F)`` codes.
        w2_scale_and_zero: ``(E, F / w2_group_size, D, 2)`` in ``KERNEL_DTYPE``.
        w2_group_size: the kernel group size along ``F``.
    """

    w13_packed: torch.Tensor
    w13_scale_and_zero: torch.Tensor
    w13_group_size: int
    w2_packed: torch.Tensor
    w2_scale_and_zero: torch.Tensor
    w2_group_size: int

    def serves(self, dtype: torch.dtype) -> bool:
        """Every accepted input dtype: all compute in ``KERNEL_DTYPE``."""
        return dtype in ACTIVATION_DTYPES


def has_cpu_int4_ops() -> bool:
    """Whether this torch build has both CPU int4 ops (looked up on each call)."""
    return hasattr(torch.ops.aten, _PACK_OP) and hasattr(torch.ops.aten, _MM_OP)


def _check_rows(name: str, rows: int) -> str:
    """Why the packer refuses a weight with ``rows`` output rows, or ``""``."""
    if rows % ROW_MULTIPLE:
        return f"{name}: output rows must be a multiple of {ROW_MULTIPLE}, got {rows}"
    return ""


def kernel_group_size(group: int) -> int | None:
    """The largest of ``KERNEL_GROUP_SIZES`` that divides ``group`` (None if none does).

    A scheme's group of ``group`` codes sharing one scale (and zero point) is then
    ``group / kernel_group_size(group)`` kernel groups with that same scale.
    """
    return next((g for g in reversed(KERNEL_GROUP_SIZES) if group % g == 0), None)


def _check_group(name: str, reduction: int, scheme: Int4Scheme) -> str:
    """Why the kernel refuses the grouping along ``reduction``, or ``""``."""
    group = scheme.group_size_for(reduction)
    if kernel_group_size(group) is None:
        how = (
            f" (group_size=-1 is one group of {reduction})"
            if scheme.group_size == -1
            else ""
        )
        return (
            f"{name}: group size must be a multiple of one of {KERNEL_GROUP_SIZES}, "
            f"got {group}{how}"
        )
    if reduction % group:
        return f"{name}: reduction size {reduction} must be a multiple of group size {group}"
    return ""


def _refusal(
    config: MoEConfig,
    scheme: Int4Scheme,
    layout: WeightLayout,
    device: DeviceInfo,
    dtype: torch.dtype,
) -> str:
    """The first reason ``cpu-int4`` cannot run this request, or ``""``."""
    d, f = config.hidden_size, config.intermediate_size
    reasons = (
        f"needs a CPU device, got {device.type}" if device.type != "cpu" else "",
        f"needs the canonical layout {CANONICAL_LAYOUT}, got {layout}"
        if layout != CANONICAL_LAYOUT
        else "",
        f"activation dtype must be one of {ACTIVATION_DTYPES}, got {dtype}"
        if dtype not in ACTIVATION_DTYPES
        else "",
        _check_rows("w13 (2F x D)", 2 * f),
        _check_rows("w2 (D x F)", d),
        _check_group("w13 (2F x D)", d, scheme),
        _check_group("w2 (D x F)", f, scheme),
    )
    first = next((r for r in reasons if r), "")
    if first or has_cpu_int4_ops():
        return first
    return f"torch {torch.__version__} lacks torch.ops.aten.{_PACK_OP} or .{_MM_OP}"


def _scale_and_zero(
    scale_ERG: torch.Tensor, zero_point_ERG: torch.Tensor | None, pieces: int
) -> torch.Tensor:
    """``(E, G * pieces, R, 2)`` pairs ``(scale, (8 - z) * scale)`` in ``KERNEL_DTYPE``.

    Each of the scheme's groups becomes ``pieces`` kernel groups with its pair.
    Computed in float32 and rounded once, so a bf16 ``zero`` carries one rounding.
    """
    scale = scale_ERG.float()
    if zero_point_ERG is None:
        zero = torch.zeros_like(scale)
    else:
        zero = (_SYM_OFFSET - zero_point_ERG.float()) * scale
    pairs = torch.stack([scale, zero], dim=-1).transpose(1, 2)
    if pieces > 1:
        pairs = pairs.repeat_interleave(pieces, dim=1)
    return pairs.contiguous().to(KERNEL_DTYPE)


def _pack_codes(qdata_RP: torch.Tensor) -> torch.Tensor:
    """Canonical packed bytes ``(R, K/2)`` -> the kernel's opaque packed form."""
    codes_RK = unpack_int4(qdata_RP).to(torch.int32).contiguous()
    pack = getattr(torch.ops.aten, _PACK_OP)
    packed: torch.Tensor = pack(codes_RK, _INNER_K_TILES)
    return packed


def _pack_experts(qdata_ERP: torch.Tensor) -> torch.Tensor:
    """Pack expert by expert into one ``(E, ...)`` tensor (peak: one expert's codes)."""
    first = _pack_codes(qdata_ERP[0])
    packed = torch.empty(
        (int(qdata_ERP.shape[0]), *first.shape),
        dtype=first.dtype,
        device=first.device,  # not the default device (a `with torch.device(...)`)
    )
    packed[0] = first
    for expert in range(1, int(qdata_ERP.shape[0])):
        packed[expert] = _pack_codes(qdata_ERP[expert])
    return packed


@final
class CPUInt4Backend:
    """Per-expert loop over torch's CPU int4 kernels, packed once at ``prepare``.

    Only experts that received tokens run. The GEMMs run in bf16 (``KERNEL_DTYPE``):
    fp16 and fp32 inputs are rounded to it, and the output is converted back to the
    input's dtype. The activation and the router weighting run in float32, and outputs
    are accumulated in float32.
    """

    @property
    def name(self) -> str:
        """``cpu-int4``."""
        return "cpu-int4"

    def supports(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        layout: WeightLayout,
        device: DeviceInfo,
        *,
        dtype: torch.dtype,
    ) -> Support:
        """CPU, canonical layout, fp32/fp16/bf16, groups of a multiple of 32, rows % 16 == 0."""
        reason = _refusal(config, scheme, layout, device, dtype)
        return Support.no(reason) if reason else Support.yes()

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> CPUInt4Prepared:
        """Pack every expert's w13 and w2 for the kernel; ``weights`` is not mutated.

        Raises:
            BackendUnavailableError: when ``supports`` would refuse, with its reason.
        """
        device = DeviceInfo.of(weights.device)
        reason = _refusal(config, weights.scheme, CANONICAL_LAYOUT, device, dtype)
        if reason:
            raise BackendUnavailableError(
                f"cpu-int4 cannot prepare these weights: {reason}"
            )
        group13 = weights.scheme.group_size_for(config.hidden_size)
        group2 = weights.scheme.group_size_for(config.intermediate_size)
        kernel13, kernel2 = kernel_group_size(group13), kernel_group_size(group2)
        assert kernel13 is not None  # _refusal checked both
        assert kernel2 is not None
        return CPUInt4Prepared(
            weights=weights,
            config=config,
            dtype=dtype,
            w13_packed=_pack_experts(weights.w13_qdata),
            w13_scale_and_zero=_scale_and_zero(
                weights.w13_scale, weights.w13_zero_point, group13 // kernel13
            ),
            w13_group_size=kernel13,
            w2_packed=_pack_experts(weights.w2_qdata),
            w2_scale_and_zero=_scale_and_zero(
                weights.w2_scale, weights.w2_zero_point, group2 // kernel2
            ),
            w2_group_size=kernel2,
        )

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        """Route, run the two int4 GEMMs per used expert, weight and sum.

        Returns:
            ``(T, D)`` in the dtype of ``hidden_TD``; the GEMMs run in bf16 whatever
            it is (``KERNEL_DTYPE``).
        """
        ready = check_prepared(prepared, CPUInt4Prepared, self.name)
        k = routing.top_k
        check_local_ids(routing.topk_ids, ready.weights.num_experts)  # host sync: CPU
        out_TD = torch.zeros(
            hidden_TD.shape[0],
            hidden_TD.shape[1],
            dtype=torch.float32,
            device=hidden_TD.device,
        )
        order_N, counts_E = sort_tokens_by_expert(
            routing.topk_ids, ready.weights.num_experts
        )
        weights_N = routing.topk_weights.flatten().float()
        # Rounded to bf16 once, here; weighted inputs are rounded after the weighting.
        on_input = ready.config.apply_router_weight_on_input
        x_TD = hidden_TD if on_input else hidden_TD.to(KERNEL_DTYPE)
        ends_E = torch.cumsum(counts_E, 0).tolist()
        for expert in torch.nonzero(counts_E).flatten().tolist():
            end = ends_E[expert]
            pairs = order_N[end - int(counts_E[expert]) : end]
            tokens = pairs // k
            y_ND = _expert_forward(x_TD[tokens], ready, expert, weights_N[pairs, None])
            out_TD.index_add_(0, tokens, y_ND)
        return out_TD.to(hidden_TD.dtype)


def _expert_forward(
    x_ND: torch.Tensor, ready: CPUInt4Prepared, expert: int, weight_N1: torch.Tensor
) -> torch.Tensor:
    """One expert on its routed rows: float32 ``(N, D)``, router weight applied."""
    on_input = ready.config.apply_router_weight_on_input
    if on_input:
        x_ND = x_ND.float() * weight_N1
    y_ND = _kernel_expert(x_ND.to(KERNEL_DTYPE), ready, expert)
    return y_ND if on_input else y_ND * weight_N1


def _kernel_expert(
    x_ND: torch.Tensor, ready: CPUInt4Prepared, expert: int
) -> torch.Tensor:
    """One expert through torch's int4 kernel (bf16); float32 ``(N, D)`` out."""
    mm = getattr(torch.ops.aten, _MM_OP)
    h_NH = mm(
        x_ND.contiguous(),
        ready.w13_packed[expert],
        ready.w13_group_size,
        ready.w13_scale_and_zero[expert],
    )
    # The activation runs in float32 (cheap next to the GEMMs) and is rounded once.
    h_NH = _add_bias(h_NH.float(), ready.weights.w13_bias, expert)
    a_NF = apply_activation(h_NH, ready.config).to(KERNEL_DTYPE)
    y_ND: torch.Tensor = mm(
        a_NF,
        ready.w2_packed[expert],
        ready.w2_group_size,
        ready.w2_scale_and_zero[expert],
    ).float()
    return _add_bias(y_ND, ready.weights.w2_bias, expert)


def _add_bias(
    y: torch.Tensor, bias_E: torch.Tensor | None, expert: int
) -> torch.Tensor:
    """``y + bias[expert]`` in float32 (gpt-oss expert biases), or ``y``."""
    return y if bias_E is None else y + bias_E[expert].float()
