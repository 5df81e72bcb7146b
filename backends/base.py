"""The backend contract: MoEBackend Protocol, Support, DeviceInfo, PreparedExperts.

May import core; heavy or optional packages only inside functions.
Shape legend: ``T`` tokens, ``D`` hidden size.
"""

from typing import Literal, Protocol, TypeVar, runtime_checkable

import attrs
import torch

from core.config import MoEConfig
from core.errors import PreparedTypeError
from core.layout import WeightLayout
from core.routing import Routing
from core.scheme import Int4Scheme
from core.weights import QuantizedExpertWeights

DeviceType = Literal["cpu", "cuda", "xpu", "other"]


class BackendWarning(UserWarning):
    """Base of the warnings backends give about a documented, deliberate trade-off.

    For example ``triton-emulation`` holding 16-bit weights; filter this class to
    silence them all.
    """


@attrs.frozen(kw_only=True)
class Support:
    """A backend's answer to "can you run this?", with the reason when it cannot.

    Attributes:
        ok: whether the backend supports the request.
        reason: why not (empty when ``ok``), or why it is ``explicit_only``.
        explicit_only: supported, but ``select_backend(prefer="auto")`` passes it by:
            it runs only when asked for by name (a Triton kernel in Triton's CPU
            interpreter, which is a testing tool, is the case in point).
    """

    ok: bool
    reason: str = ""
    explicit_only: bool = False

    @classmethod
    def yes(cls, *, explicit_only: bool = False, reason: str = "") -> "Support":
        """Supported (by name only when ``explicit_only``, because ``reason``)."""
        return cls(ok=True, explicit_only=explicit_only, reason=reason)

    @classmethod
    def no(cls, reason: str) -> "Support":
        """Not supported, because ``reason``."""
        return cls(ok=False, reason=reason)

    def __bool__(self) -> bool:
        return self.ok


@attrs.frozen(kw_only=True)
class DeviceInfo:
    """What selection needs to know about a device, as a plain value.

    Attributes:
        type: `cpu`, `cuda`, `xpu` or `other`.
        index: device index, if any.
        capability: CUDA compute capability ``(major, minor)``, if known.
        name: human-readable device name.
    """

    type: DeviceType
    index: int | None = None
    capability: tuple[int, int] | None = None
    name: str = ""

    @classmethod
    def of(cls, device: torch.device | str) -> "DeviceInfo":
        """Describe ``device`` (queries torch: call this at the edges only)."""
        dev = torch.device(device)
        if dev.type == "cuda":
            given: int | None = dev.index
            idx = given if given is not None else torch.cuda.current_device()
            major, minor = torch.cuda.get_device_capability(idx)
            return cls(
                type="cuda",
                index=idx,
                capability=(major, minor),
                name=torch.cuda.get_device_name(idx),
            )
        if dev.type in ("cpu", "xpu"):
            kind: DeviceType = "cpu" if dev.type == "cpu" else "xpu"
            return cls(type=kind, index=dev.index, name=dev.type)
        return cls(type="other", index=dev.index, name=dev.type)


@attrs.frozen(kw_only=True, eq=False)
class PreparedExperts:
    """Base of every backend's prepared form (abstract: backends subclass it, final).

    Attributes:
        weights: the canonical weights it was prepared from (shared, never mutated).
        config: the layer configuration.
        dtype: the activation dtype it was prepared for.
    """

    weights: QuantizedExpertWeights
    config: MoEConfig
    dtype: torch.dtype

    def serves(self, dtype: torch.dtype) -> bool:
        """Whether the backend's ``apply`` may take ``dtype`` inputs with this form.

        By default only ``self.dtype``; a backend whose prepared form does not depend
        on the input dtype overrides this, so that ``Int4MoE`` keeps one prepared form
        when calls alternate dtypes instead of preparing again.
        """
        return dtype == self.dtype


P = TypeVar("P", bound=PreparedExperts)


def check_prepared(prepared: PreparedExperts, cls: type[P], backend: str) -> P:
    """Return ``prepared`` as ``cls`` for backend ``backend``'s ``apply``.

    Raises:
        PreparedTypeError: (a ``TypeError``) naming the backend and both types, for the
            prepared form of another backend.
    """
    if not isinstance(prepared, cls):
        raise PreparedTypeError(
            f"prepared must come from backend {backend!r}.prepare "
            f"({cls.__name__}), got {type(prepared).__name__}"
        )
    return prepared


@runtime_checkable
class MoEBackend(Protocol):
    """Runs the expert math for ``Int4MoE``. Structural: no inheritance needed.

    ``supports`` is cheap and pure over its arguments; ``prepare`` runs once after the
    weights are loaded (or moved) and may repack them; ``apply`` runs per forward call.
    """

    @property
    def name(self) -> str:
        """Registry name of the backend, e.g. ``reference``."""
        ...

    def supports(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        layout: WeightLayout,
        device: DeviceInfo,
        *,
        dtype: torch.dtype,
    ) -> Support:
        """Whether this backend can run the layer on ``device`` with ``dtype`` inputs."""
        ...

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> PreparedExperts:
        """One-time conversion into the backend's form; never mutates ``weights``."""
        ...

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        """``(T, D)`` output in the dtype of ``hidden_TD``."""
        ...
