"""Selection is pure over DeviceInfo: fake backends, no monkeypatching of torch."""

from typing import final

import pytest
import torch

from backends import available_backends, register_backend, select_backend
from backends.base import DeviceInfo, PreparedExperts, Support, check_prepared
from backends.reference import ReferenceBackend, ReferencePrepared
from backends.registry import create_backend, explain_backends, unregister_backend
from core.config import MoEConfig
from core.errors import BackendUnavailableError, ConfigError, ConfigTypeError
from core.layout import CANONICAL_LAYOUT, WeightLayout
from core.routing import Routing
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, Int4Scheme
from core.weights import QuantizedExpertWeights

CFG = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=64)
CPU = DeviceInfo(type="cpu")
CUDA = DeviceInfo(type="cuda", index=0, capability=(9, 0), name="fake H200")


@final
class _OnlyOn:
    """A fake backend accepting one device type and symmetric schemes."""

    def __init__(self, name: str, device_type: str) -> None:
        self._name, self._type = name, device_type

    @property
    def name(self) -> str:
        return self._name

    def supports(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        layout: WeightLayout,
        device: DeviceInfo,
        *,
        dtype: torch.dtype,
    ) -> Support:
        del config, layout, dtype
        if device.type != self._type:
            return Support.no(f"needs {self._type}, got {device.type}")
        if scheme.has_zero_point:
            return Support.no("symmetric only")
        return Support.yes()

    def prepare(
        self, weights: QuantizedExpertWeights, config: MoEConfig, *, dtype: torch.dtype
    ) -> PreparedExperts:
        raise NotImplementedError

    def apply(
        self, hidden_TD: torch.Tensor, prepared: PreparedExperts, routing: Routing
    ) -> torch.Tensor:
        raise NotImplementedError


def _only_fakes() -> None:
    for name in available_backends():
        unregister_backend(name)
    register_backend("reference", ReferenceBackend, priority=0)
    register_backend("fake-cuda", lambda: _OnlyOn("fake-cuda", "cuda"), priority=30)
    register_backend("fake-cpu", lambda: _OnlyOn("fake-cpu", "cpu"), priority=10)


def test_auto_walks_priorities() -> None:
    _only_fakes()
    assert available_backends() == ("fake-cuda", "fake-cpu", "reference")
    pick = select_backend(
        CFG, INT4_SYM_G32, CANONICAL_LAYOUT, CUDA, dtype=torch.bfloat16
    )
    assert pick.name == "fake-cuda"
    pick = select_backend(
        CFG, INT4_SYM_G32, CANONICAL_LAYOUT, CPU, dtype=torch.bfloat16
    )
    assert pick.name == "fake-cpu"
    pick = select_backend(
        CFG, INT4_ASYM_G32, CANONICAL_LAYOUT, CUDA, dtype=torch.bfloat16
    )
    assert pick.name == "reference"


def test_explicit_choice_raises_with_reason() -> None:
    _only_fakes()
    with pytest.raises(
        BackendUnavailableError,
        match=r"^backend 'fake-cuda' cannot run int4_sym_g32 with torch\.bfloat16 on "
        r"cpu: fake-cuda: needs cuda, got cpu$",
    ):
        select_backend(
            CFG,
            INT4_SYM_G32,
            CANONICAL_LAYOUT,
            CPU,
            dtype=torch.bfloat16,
            prefer="fake-cuda",
        )


def test_no_backend_joins_every_reason() -> None:
    _only_fakes()
    unregister_backend("reference")
    with pytest.raises(
        BackendUnavailableError,
        match=r"^no registered backend can run int4_asym_g32 with torch\.bfloat16 on "
        r"cuda: fake-cuda: symmetric only; fake-cpu: needs cpu, got cuda$",
    ):
        select_backend(CFG, INT4_ASYM_G32, CANONICAL_LAYOUT, CUDA, dtype=torch.bfloat16)


def test_unknown_name_lists_the_registered() -> None:
    _only_fakes()
    with pytest.raises(
        BackendUnavailableError, match="`fake-cuda`, `fake-cpu`, `reference`, got 'x'"
    ):
        create_backend("x")


def test_register_rejects_auto() -> None:
    with pytest.raises(ConfigError, match="other than `auto`"):
        register_backend("auto", ReferenceBackend, priority=1)


def test_builtin_backends_registered() -> None:
    names = available_backends()
    assert names[-1] == "reference"
    assert "cpu-int4" in names


def test_check_prepared_rejects_foreign() -> None:
    foreign = PreparedExperts(weights=None, config=CFG, dtype=torch.float32)  # type: ignore[arg-type]  # only the type matters
    with pytest.raises(
        TypeError,
        match=r"prepared must come from backend 'reference'.prepare \(ReferencePrepared\), got PreparedExperts",
    ):
        check_prepared(foreign, ReferencePrepared, "reference")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"type": "gpu"}, ConfigError, r"type must be one of \('cpu', 'cuda', 'xpu', 'other'\), got 'gpu'"),
        ({"type": "cuda", "index": -1}, ConfigError, "index must be None or an int >= 0, got -1"),
        ({"type": "cuda", "index": True}, ConfigError, "index must be None or an int >= 0, got True"),
        ({"type": "cuda", "capability": (9,)}, ConfigError, r"capability must be None or a \(major, minor\) tuple of ints >= 0, got \(9,\)"),
        ({"type": "cuda", "capability": [9, 0]}, ConfigError, r"got \[9, 0\]"),
        ({"type": "cuda", "capability": (9, "0")}, ConfigError, r"got \(9, '0'\)"),
        ({"type": "cpu", "name": None}, ConfigTypeError, "name must be a str, got NoneType"),
    ],
)  # fmt: skip
def test_device_info_refuses_bad_fields(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    """A hand-built DeviceInfo (tests, selection by description) is checked field by field."""
    with pytest.raises(error, match=match):
        DeviceInfo(**kwargs)  # type: ignore[arg-type]  # deliberately bad values
    assert DeviceInfo(type="cuda", index=0, capability=(9, 0), name="x").capability == (
        9,
        0,
    )


def test_device_info_of_cpu() -> None:
    assert DeviceInfo.of("cpu") == DeviceInfo(type="cpu", index=None, name="cpu")
    assert DeviceInfo.of("meta").type == "other"
    assert not Support.no("x")
    assert Support.yes()


def _explain_on_cpu() -> list[str]:
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=64, intermediate_size=64)
    return explain_backends(
        config,
        INT4_SYM_G32,
        CANONICAL_LAYOUT,
        DeviceInfo(type="cpu"),
        dtype=torch.float32,
    )


def test_explain_backends_says_ok_for_a_backend_that_can_run() -> None:
    lines = _explain_on_cpu()
    assert "reference: ok" in lines
    assert "cpu-int4: ok" in lines
    assert any(line.startswith("xpu-fused: device must be `xpu`") for line in lines)


def test_explain_backends_says_when_auto_passes_a_backend_by() -> None:
    class ByNameOnly:
        name = "by-name-only"

        def supports(self, *_: object, **__: object) -> Support:
            return Support.yes(explicit_only=True, reason="a testing tool")

    register_backend("by-name-only", ByNameOnly, priority=1000)  # type: ignore[arg-type]
    try:
        lines = _explain_on_cpu()
    finally:
        unregister_backend("by-name-only")
    assert "by-name-only: ok by name only (a testing tool)" in lines
