# intel-extension-for-pytorch 2.8.0 (archived); used by backends/xpu/ipex.py.
# Closed stub: nothing here is called; see modules/__init__.pyi.
