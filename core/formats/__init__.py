"""Checkpoint formats: pure importers to the canonical int4 layout, and an exporter.

GPTQ, AWQ and compressed-tensors ``pack_quantized`` (README: checkpoints); every
conversion is exact: dequantizing the result equals the format's own dequantization.
Imports only torch, attrs and core.
"""

from core.formats.awq import from_awq as from_awq
from core.formats.compressed_tensors import (
    export_expert_weights as export_expert_weights,
    from_compressed_tensors as from_compressed_tensors,
    quantization_config as quantization_config,
    to_compressed_tensors as to_compressed_tensors,
)
from core.formats.experts import (
    assemble_experts as assemble_experts,
    assemble_per_expert as assemble_per_expert,
    concat_rows as concat_rows,
    deinterleave_rows as deinterleave_rows,
    scheme_for as scheme_for,
    split_experts as split_experts,
    stack_projections as stack_projections,
)
from core.formats.gptq import from_gptq as from_gptq
from core.formats.options import (
    CheckpointFormat as CheckpointFormat,
    FormatOptions as FormatOptions,
    import_projection as import_projection,
    parse_quantization_config as parse_quantization_config,
    to_checkpoint_format as to_checkpoint_format,
)
from core.formats.projection import Int4Projection as Int4Projection
from core.formats.targets import select_config_group as select_config_group
