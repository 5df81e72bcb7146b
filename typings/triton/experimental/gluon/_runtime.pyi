# Stub for triton.experimental.gluon._runtime 3.7 (closed: GluonASTSource), used by bench/compile_sm90.py.
from triton.compiler.compiler import ASTSource

class GluonASTSource(ASTSource): ...
