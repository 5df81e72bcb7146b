# Stub for triton.compiler 3.7 (closed: the re-exports below), used by bench/compile_sm90.py.
from triton.compiler.compiler import (
    ASTSource as ASTSource,
    CompiledKernel as CompiledKernel,
    compile as compile,
)
