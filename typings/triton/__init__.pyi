# Stub for triton 3.6/3.7 (closed host API), used by backends/triton/_align.py, _launch.py, _kernels.py and bench/.
from collections.abc import Callable
from typing import Generic, TypeVar

from _typeshed import Incomplete
from triton.compiler.compiler import compile as compile

_F = TypeVar("_F", bound=Callable[..., object])

__version__: str

class JITFunction(Generic[_F]):
    fn: _F
    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]: ...
    def __call__(self, *args: Incomplete, **kwargs: Incomplete) -> Incomplete: ...

def jit(fn: _F) -> JITFunction[_F]: ...
def cdiv(x: int, y: int) -> int: ...
def next_power_of_2(n: int) -> int: ...
