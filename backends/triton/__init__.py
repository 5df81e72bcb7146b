"""Triton backends for CUDA: fused W4A16 (int4 resident) and bf16 emulation.

May import core and backends; triton only inside functions (``_kernels`` is imported
when a kernel first runs). Shape legend: ``T`` tokens, ``D`` hidden, ``F``
intermediate, ``H`` = 2F, ``E`` experts, ``P`` packed reduction dim, ``G`` groups.
"""

import importlib.util
import warnings
from typing import final

import attrs
import torch

from backends.base import (
    BackendWarning,
    DeviceInfo,
    PreparedExperts,
    Support,
    check_prepared,
)
from backends.triton._fused import fused_moe
from backends.triton._launch import ExpertMatrix, is_interpreting
from backends.triton._route import (
    fused_router_for as fused_router_for,
    route_topk_fused as route_topk_fused,
)
from core.config import MoEConfig
from core.errors import DTypeError, ShapeError
from core.layout import CANONICAL_LAYOUT, WeightLayout
from core.quantize import dequantize_expert
from core.routing import Routing
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights

_DTYPES = (torch.bfloat16, torch.float16)
"""The dtypes the kernels compute in."""
_INPUT_DTYPES = (*_DTYPES, torch.float32)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels run in for ``dtype`` inputs: fp32 is rounded to bf16.

    W4A16: 16-bit activations. fp32 inputs get bf16's error (a few 1e-3 relative
    against float32 math on the same int4 weights) at the kernels' speed, as on
    ``cpu-int4``; the ``reference`` backend is the float32 path.
    """
    return torch.bfloat16 if dtype == torch.float32 else dtype


def _fused_in_compute_dtype(
    hidden_TD: torch.Tensor,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    routing: Routing,
    config: MoEConfig,
) -> torch.Tensor:
    """``fused_moe`` in ``compute_dtype``, the output in ``hidden_TD``'s dtype."""
    dtype = hidden_TD.dtype
    if dtype == compute_dtype(dtype):  # bf16, fp16: no casts (``to`` costs ~1 us)
        return fused_moe(hidden_TD, w13, w2, routing, config)
    out_TD = fused_moe(hidden_TD.to(compute_dtype(dtype)), w13, w2, routing, config)
    return out_TD.to(dtype)


def _common_support(
    config: MoEConfig, layout: WeightLayout, device: DeviceInfo, dtype: torch.dtype
) -> Support:
    """Refusals shared by both Triton backends (device, dtype, layout, package)."""
    if importlib.util.find_spec("triton") is None:
        return Support.no("triton is not installed")
    on_cpu = device.type == "cpu" and is_interpreting()
    if device.type not in ("cuda", "xpu") and not on_cpu:
        return Support.no(
            "device must be `cuda` or `xpu` (or `cpu` with TRITON_INTERPRET=1), "
            f"got {device.type!r}"
        )
    if dtype not in _INPUT_DTYPES:
        return Support.no(
            "dtype must be `torch.bfloat16`, `torch.float16` or `torch.float32` "
            f"(computed in bf16), got {dtype}"
        )
    if layout != CANONICAL_LAYOUT:
        return Support.no(f"layout must be the canonical layout, got {layout}")
    if on_cpu:
        return Support.yes(
            explicit_only=True,
            reason="runs in Triton's CPU interpreter (a testing tool): by name only",
        )
    return Support.yes()


def _matrices(weights: QuantizedExpertWeights) -> tuple[ExpertMatrix, ExpertMatrix]:
    scheme = weights.scheme
    d, f = weights.hidden_size, weights.intermediate_size
    w13 = ExpertMatrix(
        data=weights.w13_qdata.contiguous(),
        scale=weights.w13_scale.contiguous(),
        zero_point=_contiguous(weights.w13_zero_point),
        group_size=scheme.group_size_for(d),
        bias=_contiguous(weights.w13_bias),
    )
    w2 = ExpertMatrix(
        data=weights.w2_qdata.contiguous(),
        scale=weights.w2_scale.contiguous(),
        zero_point=_contiguous(weights.w2_zero_point),
        group_size=scheme.group_size_for(f),
        bias=_contiguous(weights.w2_bias),
    )
    return w13, w2


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


@final
@attrs.frozen(kw_only=True, eq=False)
class TritonW4A16Prepared(PreparedExperts):
    """The canonical int4 weights, used as they are (no repacking)."""

    w13: ExpertMatrix
    w2: ExpertMatrix

    def serves(self, dtype: torch.dtype) -> bool:
        """Every input dtype of the backend: nothing here depends on it."""
        return dtype in _INPUT_DTYPES


@final
class TritonW4A16Backend:
    """Fused W4A16 MoE on int4 weights; ``_fused.py`` picks the path per call.

    Weights stay in the canonical layout (int4 memory). Decode sizes run an int4 GEMV
    or a grouped GEMM that dequantizes in registers before the dot; from 256 routed
    pairs per expert, chunks of experts are dequantized into a 16-bit scratch buffer
    of at most 1 GiB just before their GEMMs (``_configs.DEQUANT_SCRATCH_BYTES``).
    Every scheme and group size, bf16 and fp16 activations, every activation of
    ``core``, gpt-oss expert biases.
    """

    @property
    def name(self) -> str:
        """``triton-w4a16``."""
        return "triton-w4a16"

    def supports(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        layout: WeightLayout,
        device: DeviceInfo,
        *,
        dtype: torch.dtype,
    ) -> Support:
        """CUDA or XPU (Intel's Triton), bf16/fp16/fp32, canonical layout.

        The CPU in Triton's interpreter by name only.
        """
        del scheme
        return _common_support(config, layout, device, dtype)

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> TritonW4A16Prepared:
        """The canonical weights as GEMM operands.

        Nothing is copied unless a tensor is strided (e.g. a transposed view): the
        kernels read contiguous rows, so such a tensor is copied once, here.
        """
        w13, w2 = _matrices(weights)
        return TritonW4A16Prepared(
            weights=weights, config=config, dtype=dtype, w13=w13, w2=w2
        )

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        """``(T, D)`` output in the dtype of ``hidden_TD``; no host synchronization.

        fp32 inputs run in bf16 (``compute_dtype``).
        """
        ready = check_prepared(prepared, TritonW4A16Prepared, self.name)
        return _fused_in_compute_dtype(
            hidden_TD, ready.w13, ready.w2, routing, ready.config
        )


@final
@attrs.frozen(kw_only=True, eq=False)
class TritonEmulationPrepared(PreparedExperts):
    """Every expert dequantized once to the activation dtype, as GEMM operands.

    Attributes:
        w13: ``(E, 2F, D)`` 16-bit weights (and the experts' w13 bias, if any).
        w2: ``(E, D, F)`` 16-bit weights (and the experts' w2 bias, if any).
    """

    w13: ExpertMatrix
    w2: ExpertMatrix

    def serves(self, dtype: torch.dtype) -> bool:
        """The input dtypes that compute in the weights' dtype (fp32 and bf16 share)."""
        return dtype in _INPUT_DTYPES and compute_dtype(dtype) == self.w13.data.dtype


class EmulationMemoryWarning(BackendWarning):
    """``triton-emulation`` holds 16-bit expert weights (4x the int4 memory)."""


_MEMORY_WARNING = (
    "triton-emulation dequantizes the int4 experts to {dtype} once: the layer then "
    "holds 16-bit weights (4x the int4 memory); use triton-w4a16 to keep int4 in memory"
)


def _dequantize_per_expert(
    weights: QuantizedExpertWeights, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """All experts in ``dtype``, dequantized one at a time.

    The float32 temporary is then one expert's: the whole layer in float32 would be 8x
    its int4 size (45 GB for DeepSeek-V3).
    """
    e, f, d = weights.num_experts, weights.intermediate_size, weights.hidden_size
    w13 = torch.empty((e, 2 * f, d), dtype=dtype, device=weights.device)
    w2 = torch.empty((e, d, f), dtype=dtype, device=weights.device)
    for expert in range(e):
        w13[expert], w2[expert] = dequantize_expert(weights, expert, dtype=dtype)
    return w13, w2


def _largest_weight(weights: QuantizedExpertWeights, name: str) -> float:
    """The largest dequantized magnitude of ``name`` (w13 or w2), in float32."""
    largest = 0.0
    for expert in range(weights.num_experts):
        w13, w2 = dequantize_expert(weights, expert, dtype=torch.float32)
        largest = max(largest, float((w13 if name == "w13" else w2).abs().amax()))
    return largest


@final
class TritonEmulationBackend:
    """Dequantize at load, then our own Triton fused MoE on 16-bit weights.

    Memory is that of bf16 (or fp16) weights, about 4x the int4 form; ``prepare``
    (a one-time step per weight load) warns about it with ``EmulationMemoryWarning``.
    """

    @property
    def name(self) -> str:
        """``triton-emulation``."""
        return "triton-emulation"

    def supports(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        layout: WeightLayout,
        device: DeviceInfo,
        *,
        dtype: torch.dtype,
    ) -> Support:
        """CUDA or XPU (Intel's Triton), bf16/fp16/fp32, canonical layout.

        The CPU in Triton's interpreter by name only.
        """
        del scheme
        return _common_support(config, layout, device, dtype)

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> TritonEmulationPrepared:
        """Dequantize every expert to ``compute_dtype(dtype)``.

        Warns about the memory that takes (``EmulationMemoryWarning``).
        """
        sixteen_bit = compute_dtype(dtype)
        warnings.warn(
            _MEMORY_WARNING.format(dtype=sixteen_bit),
            EmulationMemoryWarning,
            stacklevel=2,
        )
        w13, w2 = _dequantize_per_expert(weights, sixteen_bit)
        for name, w in (("w13", w13), ("w2", w2)):
            if not bool(torch.isfinite(torch.stack([w.amax(), w.amin()])).all()):
                raise ShapeError(
                    f"triton-emulation's {name} dequantized to {sixteen_bit} must be "
                    f"finite, got values past its range (largest int4 weight "
                    f"{_largest_weight(weights, name):.3g}); run the layer in bf16 "
                    "(triton-w4a16 in fp16 dequantizes to fp16 at prefill as well)"
                )
        return TritonEmulationPrepared(
            weights=weights,
            config=config,
            dtype=dtype,
            w13=ExpertMatrix(data=w13, bias=_contiguous(weights.w13_bias)),
            w2=ExpertMatrix(data=w2, bias=_contiguous(weights.w2_bias)),
        )

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        """``(T, D)`` output in the dtype of ``hidden_TD``; no host synchronization.

        Raises:
            DTypeError: if the prepared weights are packed int4 (uint8), or in another
                dtype than ``hidden_TD`` computes in (prepared for another dtype).
        """
        ready = check_prepared(prepared, TritonEmulationPrepared, self.name)
        wanted = compute_dtype(hidden_TD.dtype)
        for name, w in (("w13", ready.w13.data), ("w2", ready.w2.data)):
            if w.dtype not in _DTYPES:
                raise DTypeError(
                    f"triton-emulation needs {name} dequantized to bfloat16 or float16 by "
                    f"prepare, got {w.dtype} (packed int4 weights go to triton-w4a16)"
                )
            if hidden_TD.dtype in _INPUT_DTYPES and w.dtype != wanted:
                raise DTypeError(
                    f"hidden_states in {hidden_TD.dtype} need {name} prepared in "
                    f"{wanted}, got {w.dtype}: prepare again with dtype={hidden_TD.dtype}"
                )
        return _fused_in_compute_dtype(
            hidden_TD, ready.w13, ready.w2, routing, ready.config
        )
