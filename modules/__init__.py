"""The nn.Module facade of int4-moe: ``from modules import Int4MoE``."""

from modules.int4_moe import Int4MoE as Int4MoE
