# Stub for triton.experimental.gluon 3.6/3.7 (closed: jit), used by backends/triton/_kernels_mma.py.
from triton import _F, JITFunction

def jit(fn: _F) -> JITFunction[_F]: ...
