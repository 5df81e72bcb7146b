"""Backends run the expert math behind one Protocol; see ``backends.base``."""

from backends.base import (
    BackendWarning as BackendWarning,
    DeviceInfo as DeviceInfo,
    MoEBackend as MoEBackend,
    PreparedExperts as PreparedExperts,
    Support as Support,
    check_prepared as check_prepared,
)
from backends.builtin import register_builtin_backends
from backends.registry import (
    available_backends as available_backends,
    create_backend as create_backend,
    register_backend as register_backend,
    select_backend as select_backend,
    unregister_backend as unregister_backend,
)

register_builtin_backends()
