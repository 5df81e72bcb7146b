"""PreparedCache: a backend's prepared experts and the buffers they were built from.

May import core and backends.
"""

from collections.abc import Mapping, Sequence
from typing import Final

import attrs
import torch

from backends.base import MoEBackend, PreparedExperts

WEIGHT_BUFFERS: Final = (
    "w13_qdata",
    "w13_scale",
    "w13_zero_point",
    "w2_qdata",
    "w2_scale",
    "w2_zero_point",
    "w13_bias",
    "w2_bias",
)
"""The Int4MoE buffers a backend's prepared form is built from."""


PreparedKey = tuple[torch.device, torch.dtype]
"""The input's device and dtype."""

Buffers = Mapping[str, torch.Tensor | None]


def _sources(buffers: Buffers) -> tuple[torch.Tensor | None, ...]:
    return tuple(buffers.get(name) for name in WEIGHT_BUFFERS)


def data_ptrs(tensors: Sequence[torch.Tensor | None]) -> tuple[int, ...]:
    """Each tensor's data pointer (``0`` for ``None``): ``t.data = ...`` changes it."""
    return tuple(0 if t is None else t.data_ptr() for t in tensors)


def version(tensor: torch.Tensor) -> int:
    """The version counter of ``tensor``, which in-place edits bump.

    ``-1`` for an inference tensor, which keeps none (in-place edits of one go unseen).
    """
    if tensor.is_inference():
        return -1
    return int(tensor._version)


def versions(tensors: Sequence[torch.Tensor | None]) -> tuple[int, ...]:
    """Each tensor's ``version`` (``-1`` for ``None``): in-place edits change it."""
    return tuple(-1 if t is None else version(t) for t in tensors)


@attrs.frozen(kw_only=True, eq=False)
class PreparedCache:
    """A backend's prepared experts, valid while the weight buffers stay the same.

    Attributes:
        device: the device it was prepared on.
        dtypes: the input dtypes it serves: the one it was prepared for, and those
            the same backend was selected for since and its prepared form serves.
        sources: each of ``WEIGHT_BUFFERS`` (``None`` where absent) at prepare time;
            held, so no other tensor can take their identity.
        data_ptrs: their data pointers then (catches ``buffer.data = ...``).
        versions: their version counters then (catches in-place edits, such as
            ``moe.w13_scale.mul_(2)`` or a ``copy_`` into a buffer; ``version``).
        backend: the backend chosen.
        prepared: its prepared form.
    """

    device: torch.device
    dtypes: frozenset[torch.dtype]
    sources: tuple[torch.Tensor | None, ...]
    data_ptrs: tuple[int, ...]
    versions: tuple[int, ...]
    backend: MoEBackend
    prepared: PreparedExperts

    @classmethod
    def from_buffers(
        cls,
        buffers: Buffers,
        *,
        key: PreparedKey,
        backend: MoEBackend,
        prepared: PreparedExperts,
    ) -> "PreparedCache":
        """Remember ``prepared`` as built from the weight tensors in ``buffers``."""
        sources = _sources(buffers)
        device, dtype = key
        return cls(
            device=device,
            dtypes=frozenset((dtype,)),
            sources=sources,
            data_ptrs=data_ptrs(sources),
            versions=versions(sources),
            backend=backend,
            prepared=prepared,
        )

    def has_weights(self, device: torch.device, buffers: Buffers) -> bool:
        """Whether it was built on ``device`` from the very tensors in ``buffers``.

        Each buffer must be the same tensor on the same memory, not edited in place
        since (its version counter; tensors made under ``torch.inference_mode`` keep
        none, so their in-place edits need ``Int4MoE.invalidate_prepared``).
        """
        now = _sources(buffers)
        return (
            device == self.device
            and all(a is b for a, b in zip(now, self.sources, strict=True))
            and data_ptrs(now) == self.data_ptrs
            and versions(now) == self.versions
        )

    def is_current(self, key: PreparedKey, buffers: Buffers) -> bool:
        """Whether it serves ``key`` from the very weight tensors it was built from."""
        device, dtype = key
        return dtype in self.dtypes and self.has_weights(device, buffers)

    def serving(self, dtype: torch.dtype) -> "PreparedCache":
        """The same prepared form, also serving ``dtype``.

        Raises:
            ValueError: if the prepared form does not serve ``dtype``.
        """
        if not self.prepared.serves(dtype):
            raise ValueError(
                f"dtype must be one that {self.backend.name}'s prepared form (made for "
                f"{self.prepared.dtype}) serves, got {dtype}"
            )
        return attrs.evolve(self, dtypes=self.dtypes | {dtype})
