"""The backend contract: MoEBackend Protocol, Support, DeviceInfo, PreparedExperts.

May import core; heavy or optional packages only inside functions.
Shape legend: ``T`` tokens, ``D`` hidden size.
"""

from typing import Final, Literal, Protocol, TypeVar, runtime_checkable

import attrs
import torch

from core.config import MoEConfig
from core.errors import ConfigError, ConfigTypeError, PreparedTypeError
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


_DEVICE_TYPES: Final = ("cpu", "cuda", "xpu", "other")


def _is_count(value: object) -> bool:
    """An int >= 0 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_device_type(_inst: object, _attr: object, value: object) -> None:
    if value not in _DEVICE_TYPES:
        raise ConfigError(
            f"DeviceInfo type must be one of {_DEVICE_TYPES}, got {value!r}"
        )


def _check_index(_inst: object, _attr: object, value: int | None) -> None:
    if value is not None and not _is_count(value):
        raise ConfigError(
            f"DeviceInfo index must be None or an int >= 0, got {value!r}"
        )


def _check_capability(
    _inst: object, _attr: object, value: tuple[int, int] | None
) -> None:
    given: object = value  # checked at run time: callers may pass anything
    if given is None:
        return
    if not (
        isinstance(given, tuple)
        and len(given) == 2
        and all(_is_count(v) for v in given)
    ):
        raise ConfigError(
            "DeviceInfo capability must be None or a (major, minor) tuple of ints "
            f">= 0, got {value!r}"
        )


def _check_name(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, str):
        raise ConfigTypeError(
            f"DeviceInfo name must be a str, got {type(value).__name__}"
        )


@attrs.frozen(kw_only=True)
class DeviceInfo:
    """What selection needs to know about a device, as a plain value.

    Attributes:
        type: `cpu`, `cuda`, `xpu` or `other`.
        index: device index, if any.
        capability: CUDA compute capability ``(major, minor)``, if known.
        name: human-readable device name.
    """

    type: DeviceType = attrs.field(validator=_check_device_type)
    index: int | None = attrs.field(default=None, validator=_check_index)
    capability: tuple[int, int] | None = attrs.field(
        default=None, validator=_check_capability
    )
    name: str = attrs.field(default="", validator=_check_name)

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

    def extra_bytes(self) -> int:
        """Bytes this form holds beside its canonical weights: a backend's own copies.

        The tensors among its attrs fields (and those of attrs objects in them) whose
        storage is none of the canonical weights'; each storage counted once. 0 for a
        backend that reads the canonical layout as it is.
        """
        canonical = {
            t.untyped_storage().data_ptr() for t in self.weights.tensors().values()
        }
        seen: dict[int, int] = {}
        for tensor in _field_tensors(self, depth=2):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in canonical:
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())


def _field_tensors(obj: attrs.AttrsInstance, *, depth: int) -> list[torch.Tensor]:
    """The tensors among ``obj``'s attrs fields, ``depth`` attrs objects deep."""
    out: list[torch.Tensor] = []
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif depth > 1 and attrs.has(type(value)) and field.name != "weights":
            out += _field_tensors(value, depth=depth - 1)
    return out


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
        """``(T, D)`` output in the dtype of ``hidden_TD``.

        ``routing`` comes checked by the caller: ``Int4MoE`` checks its shapes and
        that its local ids are in ``[-1, E)`` (-1 contributes zero), on the host for
        CPU ids and by a device-side assert on CUDA (unless ``check_topk_ids`` is
        off). The CPU backends check the ids again on the host; the Triton ones read
        them as given (an id past ``E`` reads outside the weights), since a check
        there would cost a host sync per call.
        """
        ...
