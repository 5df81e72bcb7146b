# Stub for triton.experimental.gluon.language.nvidia.ampere 3.6/3.7 (closed: mma_v2),
# used by backends/triton/_kernels_mma.py.
from _typeshed import Incomplete

def mma_v2(
    a: Incomplete, b: Incomplete, acc: Incomplete, input_precision: Incomplete = None
) -> Incomplete: ...
