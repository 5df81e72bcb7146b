# Stub for triton.backends 3.7 (package only), used by bench/compile_sm90.py.
