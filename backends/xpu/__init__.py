"""Kernel providers of the XPU fused backend (``backends.xpu_fused``).

``vllm_xpu_kernels`` and ``intel_extension_for_pytorch`` are imported lazily, inside
the providers, and only when a provider is checked or built.
"""
