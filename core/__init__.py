"""Functional core of int4-moe: schemes, layouts, quantization, routing, the oracle.

Pure: imports only the standard library, torch and attrs.
"""

from core.activation import apply_activation as apply_activation
from core.config import (
    ACTIVATIONS as ACTIVATIONS,
    GROUP_SCORES as GROUP_SCORES,
    SCORING_FUNCS as SCORING_FUNCS,
    Activation as Activation,
    GroupScore as GroupScore,
    MoEConfig as MoEConfig,
    ScoringFunc as ScoringFunc,
)
from core.errors import (
    BackendUnavailableError as BackendUnavailableError,
    ConfigError as ConfigError,
    ConfigTypeError as ConfigTypeError,
    DeviceError as DeviceError,
    DTypeError as DTypeError,
    Int4MoEError as Int4MoEError,
    NotLoadedError as NotLoadedError,
    PreparedTypeError as PreparedTypeError,
    ShapeError as ShapeError,
    UnsupportedError as UnsupportedError,
)
from core.layout import (
    CANONICAL_LAYOUT as CANONICAL_LAYOUT,
    PackingFormat as PackingFormat,
    WeightLayout as WeightLayout,
)
from core.packing import pack_int4 as pack_int4, unpack_int4 as unpack_int4
from core.quantize import (
    choose_qparams as choose_qparams,
    dequantize as dequantize,
    dequantize_expert as dequantize_expert,
    dequantize_expert_weights as dequantize_expert_weights,
    dequantize_packed as dequantize_packed,
    quantize as quantize,
    quantize_expert_weights as quantize_expert_weights,
    quantize_tensor as quantize_tensor,
)
from core.reference import (
    moe_backward_reference as moe_backward_reference,
    moe_forward_reference as moe_forward_reference,
)
from core.routing import (
    Routing as Routing,
    count_tokens_per_expert as count_tokens_per_expert,
    localize_routing as localize_routing,
    route_topk as route_topk,
    sort_tokens_by_expert as sort_tokens_by_expert,
)
from core.scheme import (
    INT4_ASYM as INT4_ASYM,
    INT4_ASYM_G32 as INT4_ASYM_G32,
    INT4_ASYM_G128 as INT4_ASYM_G128,
    INT4_SYM as INT4_SYM,
    INT4_SYM_G32 as INT4_SYM_G32,
    INT4_SYM_G128 as INT4_SYM_G128,
    Int4Mapping as Int4Mapping,
    Int4Scheme as Int4Scheme,
)
from core.weights import (
    QParams as QParams,
    QuantizedExpertWeights as QuantizedExpertWeights,
)
