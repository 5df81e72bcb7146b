"""Tensor containers for quantized expert weights (attrs, frozen, identity equality).

Shape legend: ``E`` experts, ``D`` hidden size, ``F`` intermediate size, ``H`` = 2F,
``P`` packed reduction dim (reduction / 2), ``G`` groups along the reduction dim.
Imports only torch, attrs and core.
"""

from collections.abc import Mapping

import attrs
import torch

from core.scheme import Int4Scheme


@attrs.frozen(kw_only=True, eq=False)
class QParams:
    """Quantization parameters of one weight tensor ``(..., N, K)``.

    Attributes:
        scale: ``(..., N, G)`` floating scales.
        zero_point: ``(..., N, G)`` uint8 codes ``0..15`` (asymmetric) or ``None``.
    """

    scale: torch.Tensor
    zero_point: torch.Tensor | None = None


@attrs.frozen(kw_only=True, eq=False)
class QuantizedExpertWeights:
    """All experts of one MoE layer in the canonical int4 layout (see the README).

    Attributes:
        w13_qdata: uint8 ``(E, 2F, D/2)``; gate rows ``[0:F]``, up rows ``[F:2F]``.
        w13_scale: ``(E, 2F, D/G)`` in the activation dtype.
        w13_zero_point: uint8 ``(E, 2F, D/G)`` codes (asymmetric) or ``None``.
        w2_qdata: uint8 ``(E, D, F/2)``.
        w2_scale: ``(E, D, F/G)``.
        w2_zero_point: uint8 ``(E, D, F/G)`` or ``None``.
        scheme: the int4 scheme all six tensors follow.
        w13_bias: float ``(E, 2F)`` added to the w13 output, or ``None`` (gpt-oss).
        w2_bias: float ``(E, D)`` added to the w2 output, or ``None``.

    Construct through ``core.validate.check_expert_weights`` at public boundaries; the
    container itself checks nothing, so hot paths stay cheap.
    """

    w13_qdata: torch.Tensor
    w13_scale: torch.Tensor
    w13_zero_point: torch.Tensor | None
    w2_qdata: torch.Tensor
    w2_scale: torch.Tensor
    w2_zero_point: torch.Tensor | None
    scheme: Int4Scheme
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None

    @property
    def num_experts(self) -> int:
        """``E``."""
        return int(self.w13_qdata.shape[0])

    @property
    def hidden_size(self) -> int:
        """``D``."""
        return int(self.w2_qdata.shape[1])

    @property
    def intermediate_size(self) -> int:
        """``F``."""
        return int(self.w13_qdata.shape[1]) // 2

    @property
    def device(self) -> torch.device:
        """Device of the packed weights."""
        return self.w13_qdata.device

    @property
    def scale_dtype(self) -> torch.dtype:
        """Dtype of the scales (the activation dtype in practice)."""
        return self.w13_scale.dtype

    @property
    def w13(self) -> QParams:
        """Scale and zero point of w13."""
        return QParams(scale=self.w13_scale, zero_point=self.w13_zero_point)

    @property
    def w2(self) -> QParams:
        """Scale and zero point of w2."""
        return QParams(scale=self.w2_scale, zero_point=self.w2_zero_point)

    @classmethod
    def from_tensors(
        cls, tensors: Mapping[str, torch.Tensor | None], scheme: Int4Scheme
    ) -> "QuantizedExpertWeights":
        """The inverse of :meth:`tensors`: canonical names to weights (others ignored).

        Raises:
            KeyError: naming the first of the four int4 tensors that is absent.
        """

        def required(name: str) -> torch.Tensor:
            tensor = tensors.get(name)
            if tensor is None:
                raise KeyError(f"{name} must be given to build the experts, got none")
            return tensor

        return cls(
            w13_qdata=required("w13_qdata"),
            w13_scale=required("w13_scale"),
            w13_zero_point=tensors.get("w13_zero_point"),
            w2_qdata=required("w2_qdata"),
            w2_scale=required("w2_scale"),
            w2_zero_point=tensors.get("w2_zero_point"),
            scheme=scheme,
            w13_bias=tensors.get("w13_bias"),
            w2_bias=tensors.get("w2_bias"),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """The stored tensors by canonical name (zero points only when present)."""
        named = {
            "w13_qdata": self.w13_qdata,
            "w13_scale": self.w13_scale,
            "w13_zero_point": self.w13_zero_point,
            "w2_qdata": self.w2_qdata,
            "w2_scale": self.w2_scale,
            "w2_zero_point": self.w2_zero_point,
            "w13_bias": self.w13_bias,
            "w2_bias": self.w2_bias,
        }
        return {k: v for k, v in named.items() if v is not None}

    def nbytes(self) -> int:
        """Bytes held by all stored tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())
