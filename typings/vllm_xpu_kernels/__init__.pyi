# vllm-xpu-kernels 0.1.16.2 (torch 2.14.0+xpu); used by backends/xpu/vllm_kernels.py.
# Closed stub: the package root exposes nothing we call.
