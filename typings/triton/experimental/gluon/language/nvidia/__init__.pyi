# Stub for triton.experimental.gluon.language.nvidia 3.6/3.7 (package only).
