# Stub for triton.compiler.compiler 3.7 (closed: ASTSource, CompiledKernel, compile), used by bench/compile_sm90.py.
from collections.abc import Callable, Mapping
from typing import TypeAlias, TypeVar

from _typeshed import Incomplete
from triton import JITFunction
from triton.backends.compiler import GPUTarget

_F = TypeVar("_F", bound=Callable[..., object])
# Constexpr values keyed by parameter name or by (index,).
_Constexprs: TypeAlias = Mapping[str, object] | Mapping[tuple[int, ...], object]

class ASTSource:
    def __init__(
        self,
        fn: JITFunction[_F],
        signature: Mapping[str, str],
        constexprs: _Constexprs | None = None,
        attrs: Mapping[tuple[int, ...], list[list[object]]] | None = None,
    ) -> None: ...

class _KernelMetadata:  # upstream: a namedtuple of the compile's metadata JSON
    name: str
    shared: int
    target: GPUTarget
    def __getattr__(self, name: str) -> Incomplete: ...

class CompiledKernel:
    # Each stage's IR as text; the binary stage ("cubin", "hsaco") as bytes.
    asm: dict[str, str | bytes]
    metadata: _KernelMetadata
    name: str
    def __init__(
        self, src: ASTSource, metadata_group: dict[str, str], hash: str
    ) -> None: ...

def compile(
    src: ASTSource | str,
    target: GPUTarget | None = None,
    options: Mapping[str, object] | None = None,
) -> CompiledKernel: ...
