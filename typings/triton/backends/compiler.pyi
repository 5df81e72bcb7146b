# Stub for triton.backends.compiler 3.7 (closed: GPUTarget), used by bench/compile_sm90.py.
from dataclasses import dataclass  # noqa: TID251 (upstream's GPUTarget is a frozen dataclass)

@dataclass(frozen=True)
class GPUTarget:
    backend: str
    arch: int | str
    warp_size: int
