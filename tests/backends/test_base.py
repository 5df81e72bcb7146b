"""``PreparedExperts`` (backends/base.py): what a prepared form holds beside the weights."""

import warnings

import torch

from backends.cpu_int4 import CPUInt4Backend
from backends.reference import ReferenceBackend
from backends.triton import TritonEmulationBackend, TritonW4A16Backend
from core.config import MoEConfig
from core.quantize import quantize_expert_weights
from core.scheme import INT4_SYM_G32

CONFIG = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)


def test_extra_bytes_counts_a_backends_own_copies(generator: torch.Generator) -> None:
    """0 where the canonical int4 buffers are read as they are; the packed copy of
    cpu-int4 and the 16-bit weights of triton-emulation where they are not."""
    e, d, f = 4, 64, 32
    weights = quantize_expert_weights(
        torch.randn(e, 2 * f, d, generator=generator),
        torch.randn(e, d, f, generator=generator),
        INT4_SYM_G32,
        scale_dtype=torch.bfloat16,
    )
    reference = ReferenceBackend().prepare(weights, CONFIG, dtype=torch.float32)
    assert reference.extra_bytes() == 0
    assert (
        TritonW4A16Backend()
        .prepare(weights, CONFIG, dtype=torch.bfloat16)
        .extra_bytes()
        == 0
    )
    cpu = CPUInt4Backend().prepare(weights, CONFIG, dtype=torch.bfloat16)
    own = (cpu.w13_packed, cpu.w13_scale_and_zero, cpu.w2_packed, cpu.w2_scale_and_zero)
    assert cpu.extra_bytes() == sum(t.numel() * t.element_size() for t in own) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulation backend's memory warning
        emulation = TritonEmulationBackend().prepare(
            weights, CONFIG, dtype=torch.bfloat16
        )
    assert emulation.extra_bytes() == e * 3 * f * d * 2  # bf16 w13 and w2
