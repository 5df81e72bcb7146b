"""Predicates and checks of core.validate not covered through their callers."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from core.validate import is_supported_group_size


@pytest.mark.parametrize(
    ("group_size", "supported"),
    [(32, True), (-1, True), (48, False), (32.0, False), (True, False)],
    ids=str,
)
def test_is_supported_group_size(group_size: int, supported: bool) -> None:
    assert is_supported_group_size(group_size) is supported


def test_check_cast_fits() -> None:
    """Overflow to inf and nonzero values rounding to 0 are refused, by count."""
    from core.errors import ShapeError
    from core.validate import check_cast_fits

    scales = torch.tensor([1e-3, 2.0, 0.0], dtype=torch.bfloat16)
    check_cast_fits("s", scales, torch.float16)  # fits (0 stays 0)
    check_cast_fits("s", scales.to("meta"), torch.float16)  # no values to check
    with pytest.raises(
        ShapeError, match=r"s must fit torch.float16, got 1 values overflowing it"
    ):
        check_cast_fits(
            "s", torch.tensor([1e5, 1.0], dtype=torch.bfloat16), torch.float16
        )
    with pytest.raises(
        ShapeError,
        match=r"s must fit torch.float16, got 2 nonzero values rounding to 0 "
        r"\(smallest magnitude 1e-10\)",
    ):
        check_cast_fits("s", torch.tensor([1e-9, 1e-10, 1.0]), torch.float16)
    check_cast_fits(
        "s", torch.tensor([float("inf")]), torch.float16
    )  # not made inf here


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize(
    ("ids", "valid"),
    [
        ([[0, 7], [3, 1]], True),
        ([[0, 8], [3, 1]], False),  # one past the end
        ([[0, 7], [-1, 1]], False),  # -1 is a local "held elsewhere", not a global id
        ([[0, 7], [3, 2**40]], False),
    ],
    ids=str,
)
def test_check_routing_ranges_ids_on_the_host_or_the_device(
    on_device: bool,
    ids: list[list[int]],
    valid: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPU ids are read back for a ShapeError; CUDA ones go to ``torch._assert_async``
    (no host sync), which on the CPU here raises at once, so the condition it checks
    is tested without a GPU."""
    from core import validate
    from core.config import MoEConfig
    from core.errors import ShapeError
    from core.routing import Routing

    monkeypatch.setattr(validate, "checks_on_device", lambda tensor: on_device)
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32)
    routing = Routing(topk_weights=torch.ones(2, 2), topk_ids=torch.tensor(ids))
    if valid:
        validate.check_routing(routing, cfg, num_tokens=2)
        return
    error = RuntimeError if on_device else ShapeError
    with pytest.raises(error, match=r"topk_ids must be in \[0, num_experts=8\)"):
        validate.check_routing(routing, cfg, num_tokens=2)


def test_checks_on_device_only_for_cuda() -> None:
    from core.validate import checks_on_device

    assert not checks_on_device(torch.zeros(1))
    assert not checks_on_device(torch.zeros(1, device="meta"))
    with FakeTensorMode():  # a CUDA tensor's device without a GPU
        on_cuda = torch.empty(1, device="cuda")
    assert checks_on_device(on_cuda)


def test_check_cast_fits_without_underflow() -> None:
    """For additive biases: values rounding to 0 pass, overflow is still refused."""
    from core.errors import ShapeError
    from core.validate import check_cast_fits

    check_cast_fits("b", torch.tensor([1e-9, 1.0]), torch.float16, underflow=False)
    with pytest.raises(ShapeError, match=r"b must fit torch\.float16, got 1 values"):
        check_cast_fits("b", torch.tensor([1e-9, 1e6]), torch.float16, underflow=False)


def test_check_device() -> None:
    """Parsed and present devices pass; the rest raise naming the argument."""
    from core.errors import ConfigTypeError, DeviceError
    from core.validate import check_device

    assert check_device("d", "cpu", allow_meta=False) == torch.device("cpu")
    assert check_device("d", torch.device("meta"), allow_meta=True).type == "meta"
    with pytest.raises(DeviceError, match=r"d must hold values .*, got meta"):
        check_device("d", "meta", allow_meta=False)
    with pytest.raises(DeviceError, match="d must name a torch device, got 'gpu'"):
        check_device("d", "gpu", allow_meta=True)
    with pytest.raises(
        ConfigTypeError, match="d must be of type str or device, got bool"
    ):
        check_device("d", True, allow_meta=True)
    if torch.accelerator.is_available():  # an int is an index of the accelerator
        assert check_device("d", 0, allow_meta=True).index == 0
    else:
        with pytest.raises(DeviceError, match="d must name a torch device, got 0"):
            check_device("d", 0, allow_meta=True)
    absent = next(k for k in ("cuda", "xpu") if not getattr(torch, k).is_available())
    with pytest.raises(
        DeviceError, match=f"d must be a device present here.*no {absent}"
    ):
        check_device("d", absent, allow_meta=True)


def test_check_device_under_a_fake_mode_takes_devices_not_here() -> None:
    """Tracing for a GPU on a CPU host (FakeTensorMode) allocates nothing there."""
    from core.errors import DeviceError
    from core.validate import check_device

    absent = next(k for k in ("cuda", "xpu") if not getattr(torch, k).is_available())
    with FakeTensorMode():
        assert check_device("d", absent, allow_meta=False).type == absent
        with pytest.raises(DeviceError, match="d must name a torch device"):
            check_device("d", "gpu", allow_meta=False)
