# Stub for triton.experimental.gluon.language 3.6/3.7 (open DSL surface), used by
# backends/triton/_kernels_mma.py (kernel bodies) and _launch.py (layouts).
from _typeshed import Incomplete
from triton.language import (
    bfloat16 as bfloat16,
    constexpr as constexpr,
    float16 as float16,
    float32 as float32,
    int32 as int32,
    int64 as int64,
)

class DistributedLinearLayout:
    def __init__(
        self,
        reg_bases: list[list[int]],
        lane_bases: list[list[int]],
        warp_bases: list[list[int]],
        block_bases: list[list[int]],
        shape: list[int],
    ) -> None: ...

class NVMMADistributedLayout:
    def __init__(
        self, version: list[int], warps_per_cta: list[int], instr_shape: list[int]
    ) -> None: ...

def __getattr__(name: str) -> Incomplete: ...
