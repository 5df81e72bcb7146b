"""The nn.Module facade of int4-moe: ``from modules import Int4MoE``."""

from modules.checkpoint_source import Source as Source
from modules.int4_moe import Int4MoE as Int4MoE

from modules.checkpoint import (  # isort: skip  (imports modules.int4_moe)
    LoadedExperts as LoadedExperts,
    from_checkpoint as from_checkpoint,
    load_experts as load_experts,
)
from modules.hf import (  # isort: skip
    Int4SparseMoeBlock as Int4SparseMoeBlock,
    RoutingMode as RoutingMode,
    moe_config_from_hf as moe_config_from_hf,
    replace_moe_blocks as replace_moe_blocks,
)
