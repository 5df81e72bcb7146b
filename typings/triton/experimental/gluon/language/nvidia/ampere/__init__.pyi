# Stub for triton.experimental.gluon.language.nvidia.ampere 3.6/3.7 (mma_v2; async_copy
# open), used by backends/triton/_kernels_mma.py.
from _typeshed import Incomplete

async_copy: Incomplete

def mma_v2(
    a: Incomplete, b: Incomplete, acc: Incomplete, input_precision: Incomplete = None
) -> Incomplete: ...
