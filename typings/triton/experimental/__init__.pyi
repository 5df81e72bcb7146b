# Stub for triton.experimental 3.6/3.7 (package only), used by backends/triton/_kernels_mma.py.
