"""A one-program Triton kernel around ``_kernels._activate``, for test_triton_kernels.py.

Its own module: ``@triton.jit`` needs triton imported at module level, and Triton reads
the parameters' annotations, so the kernel carries none (pyproject relaxes both here).
"""

import triton
import triton.language as tl

from backends.triton._kernels import _activate


@triton.jit
def activate_kernel(gate_ptr, up_ptr, out_ptr, n, alpha, limit, ACT: tl.constexpr):
    """``out[i] = act(gate[i]) * up[i]`` for ``i < n <= 1024``, in float32."""
    offs = tl.arange(0, 1024)
    mask = offs < n
    gate = tl.load(gate_ptr + offs, mask=mask, other=0.0)
    up = tl.load(up_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, _activate(gate, up, alpha, limit, ACT), mask=mask)
