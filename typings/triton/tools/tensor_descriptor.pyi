# Stub for triton 3.6/3.7 (closed: the host tensor descriptor), used by backends/triton/_launch.py.
from typing import Any

class TensorDescriptor:
    @staticmethod
    def from_tensor(
        tensor: Any, block_shape: list[int], padding: str = ...
    ) -> TensorDescriptor: ...
