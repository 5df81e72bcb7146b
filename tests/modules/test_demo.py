"""The main job (``int4-moe demo``): it runs, and its numbers are right."""

import io
import re

import pytest
import torch

from core.errors import ConfigError
from core.scheme import INT4_ASYM_G128, INT4_SYM
from modules.__main__ import build_parser, main
from modules.demo import MODELS, DemoOptions, parse_scheme, run_demo, time_call
from tests.tolerances import REL_L2_VS_ORACLE


def test_demo_reports_error_memory_speed(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "demo",
        "--model",
        "tiny",
        "--tokens",
        "5",
        "--iters",
        "1",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for word in ("model      tiny", "error", "memory", "speed", "ms per call"):
        assert word in out


def test_demo_default_is_a_real_model_shape() -> None:
    """The README's main job (``int4-moe demo``) runs a public model's layer shape."""
    args = build_parser().parse_args(["demo"])
    assert args.model == "qwen3-30b-a3b"
    assert MODELS[args.model].num_experts == 128


def test_demo_numbers(generator: torch.Generator) -> None:
    del generator
    options = DemoOptions(
        model="tiny",
        tokens=9,
        scheme=parse_scheme("asym-g128"),
        backend="cpu-int4",
        device="cpu",
        dtype=torch.bfloat16,
        iters=1,
    )
    result = run_demo(options, io.StringIO())
    assert result["backend"] == "cpu-int4"
    # the real kernel on bf16 activations against the float32 oracle: some rounding
    # error (the reference backend would report exactly 0), within the bf16 tolerance
    kernel_err = float(result["rel_err_vs_int4_oracle"])
    assert 0 < kernel_err < REL_L2_VS_ORACLE[torch.bfloat16]
    # group-128 int4 on the whole layer: ~14-16 dB, i.e. a relative error near 0.2.
    assert 0.05 < float(result["rel_err_vs_float"]) < 0.3
    cfg = MODELS["tiny"]
    params = cfg.num_experts * 3 * cfg.hidden_size * cfg.intermediate_size
    assert result["bf16_bytes"] == params * 2
    # packed codes + one bf16 scale and one uint8 zero point per group of 128
    assert result["int4_bytes"] == params // 2 + params // 128 * (2 + 1)
    assert float(result["ms_per_call"]) > 0


def test_parse_scheme() -> None:
    assert parse_scheme("asym-g128") == INT4_ASYM_G128
    assert parse_scheme("sym-g-1") == INT4_SYM
    with pytest.raises(ConfigError, match="scheme must look like"):
        parse_scheme("int4")


def test_every_model_shape_is_valid_for_group_32() -> None:
    for config in MODELS.values():
        assert config.hidden_size % 32 == 0
        assert config.intermediate_size % 32 == 0


def test_timing_waits_for_an_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[None] = []
    monkeypatch.setattr(torch.xpu, "synchronize", lambda: synced.append(None))
    options = DemoOptions(
        model="tiny",
        tokens=1,
        scheme=INT4_SYM,
        backend="auto",
        device="xpu",
        dtype=torch.bfloat16,
        iters=3,
    )
    assert time_call(lambda: torch.zeros(1), options) >= 0
    assert len(synced) == 2 * 3  # before and after each timed call


def _absent_device() -> str | None:
    return next(
        (t for t in ("cuda", "xpu") if not getattr(torch, t).is_available()), None
    )


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--tokens", "0", "argument --tokens: must be an integer >= 1, got '0'"),
        ("--tokens", "-3", "argument --tokens: must be an integer >= 1, got '-3'"),
        ("--iters", "0", "argument --iters: must be an integer >= 1, got '0'"),
        (
            "--scheme",
            "sym-g33",
            "argument --scheme: group_size must be one of `32`, `64`, `128`, `256`, "
            "`-1`, got 33",
        ),
        ("--device", "mps", "must be `auto`, `cpu`, `cuda` or `xpu`, got 'mps'"),
        ("--device", "absent", "must be a device this machine has, got"),
    ],
)
def test_cli_refuses_bad_arguments_with_the_reason(
    flag: str, value: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if value == "absent":
        absent = _absent_device()
        if absent is None:
            pytest.skip("this machine has both a CUDA and an XPU device")
        value = absent
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--model", "tiny", flag, value])
    assert exit_info.value.code == 2
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (
            "nope",
            r"argument --backend: must be `auto` or one of .*cpu-int4.*, got 'nope'",
        ),
        # xpu-fused never runs on a CPU, whatever the environment.
        ("xpu-fused", r"argument --backend: backend 'xpu-fused' cannot run .* on cpu"),
    ],
)
def test_demo_refuses_a_backend_before_quantizing(
    backend: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown or refusing ``--backend`` is a usage error (exit 2, the reason on
    stderr), given before any expert is quantized, not a traceback after it."""
    argv = ["demo", "--model", "tiny", "--device", "cpu", "--backend", backend]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.err)
    assert "quantiz" not in captured.out
