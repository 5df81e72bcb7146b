# intel-extension-for-pytorch 2.8.0 (archived; XPU builds 2.9.10+xpu/2.10.10+xpu off PyPI); used by backends/xpu/ipex.py.
# Closed stub: nothing here is called; see llm/modules/__init__.pyi (GatedMLPMOE).
