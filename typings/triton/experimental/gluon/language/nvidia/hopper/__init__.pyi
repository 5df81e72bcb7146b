# Stub for triton.experimental.gluon.language.nvidia.hopper 3.6/3.7 (warpgroup_mma,
# fence_async_shared), used by backends/triton/_kernels_wgmma.py.
from _typeshed import Incomplete

def fence_async_shared(cluster: bool = False) -> None: ...
def warpgroup_mma(
    a: Incomplete,
    b: Incomplete,
    acc: Incomplete,
    *,
    use_acc: Incomplete = True,
    precision: Incomplete = None,
    max_num_imprecise_acc: Incomplete = None,
    is_async: bool = False,
) -> Incomplete: ...
def warpgroup_mma_wait(
    num_outstanding: Incomplete = 0, deps: Incomplete = None
) -> Incomplete: ...
