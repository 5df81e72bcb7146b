# Stub for triton 3.6/3.7 (closed: the host tensor descriptor), used by backends/triton/_launch.py
# and bench/compile_launches.py (base, block_shape).
from typing import Any

class TensorDescriptor:
    base: Any
    block_shape: list[int]
    @staticmethod
    def from_tensor(
        tensor: Any, block_shape: list[int], padding: str = ...
    ) -> TensorDescriptor: ...
