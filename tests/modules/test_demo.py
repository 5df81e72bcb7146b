"""The main job (``int4-moe demo``): it runs, and its numbers are right."""

import io
import re
import types
from typing import Any

import attrs
import pytest
import torch

import modules.__main__ as cli
import modules.demo as demo
from core.config import MoEConfig
from core.errors import ConfigError
from core.routing import route_topk
from core.scheme import (
    INT4_ASYM_G128,
    INT4_SYM,
    INT4_SYM_G32,
)
from modules import Int4MoE
from modules.__main__ import build_parser, main
from modules.demo import (
    MODELS,
    DemoOptions,
    float_layer_output,
    parse_scheme,
    run_demo,
    time_call,
)
from tests.dense import dense_moe_f64
from tests.tolerances import REL_L2_VS_ORACLE, rel_l2


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
    # cpu-int4's own copy: torch's packed codes and a bf16 (scale, zero) per group
    assert result["backend_extra_bytes"] == params // 2 + params // 128 * 2 * 2
    assert float(result["ms_per_call"]) > 0


def test_the_memory_line_counts_the_backends_own_copy() -> None:
    """What the layer holds: the int4 buffers plus what the backend keeps beside them."""
    stream = io.StringIO()
    result = run_demo(_options(backend="cpu-int4", dtype=torch.bfloat16), stream)
    gib = 1024**3
    int4, extra = float(result["int4_bytes"]), float(result["backend_extra_bytes"])
    bf16 = float(result["bf16_bytes"])
    assert extra > 0
    assert (
        f"memory     int4 {int4 / gib:.3f} GiB + {extra / gib:.3f} GiB cpu-int4's own "
        f"copy = {(int4 + extra) / gib:.3f} GiB vs bf16 {bf16 / gib:.3f} GiB "
        f"({bf16 / (int4 + extra):.2f}x smaller)" in stream.getvalue()
    )


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
    assert captured.err.startswith(
        "usage: int4-moe demo "
    )  # demo's, as for other errors
    assert "quantiz" not in captured.out


_BASE = DemoOptions(
    model="tiny",
    tokens=4,
    scheme=INT4_SYM_G32,
    backend="reference",
    device="cpu",
    dtype=torch.float32,
    iters=1,
)


def _options(**changes: Any) -> DemoOptions:
    return attrs.evolve(_BASE, **changes)


def test_demo_report_shows_its_numbers_and_the_oracle_is_the_layers_routing() -> None:
    stream = io.StringIO()
    result = run_demo(_options(), stream)
    report = stream.getvalue()
    # the reference backend in float32 is the oracle itself, on the same routing
    assert float(result["rel_err_vs_int4_oracle"]) < 1e-6
    float_err = float(result["rel_err_vs_float"])
    kernel_err = float(result["rel_err_vs_int4_oracle"])
    assert (
        f"error      {float_err:.4f} relative L2 vs the float layer (int4 rounding), "
        f"{kernel_err:.2e} vs the float32 int4 oracle" in report
    )
    ratio = float(result["bf16_bytes"]) / float(result["int4_bytes"])
    assert ratio > 3
    assert result["backend_extra_bytes"] == 0  # reference reads the int4 buffers
    assert f"({ratio:.2f}x smaller)" in report


def test_float_layer_matches_dense_float64(generator: torch.Generator) -> None:
    options = _options(dtype=torch.bfloat16)
    config = MODELS["tiny"]
    x = torch.randn(6, config.hidden_size, generator=generator).to(torch.bfloat16)
    routing = route_topk(
        torch.randn(6, config.num_experts, generator=generator), config
    )
    out = float_layer_output(x, routing, config, options)
    pairs = [demo._expert_float(config, e, options) for e in range(config.num_experts)]
    expected = dense_moe_f64(
        x,
        torch.stack([w13 for w13, _ in pairs]),
        torch.stack([w2 for _, w2 in pairs]),
        routing.topk_weights,
        routing.topk_ids,
        config=config,
    )
    assert rel_l2(expected, out) < REL_L2_VS_ORACLE[torch.float32]


def test_demo_runs_the_layer_on_activations_of_the_asked_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[torch.dtype] = []
    forward = Int4MoE.forward

    def spy(self: Int4MoE, hidden_states: torch.Tensor, **kw: object) -> torch.Tensor:
        seen.append(hidden_states.dtype)
        return forward(self, hidden_states, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Int4MoE, "forward", spy)
    run_demo(_options(dtype=torch.float16, tokens=2), io.StringIO())
    assert seen
    assert set(seen) == {torch.float16}


def test_time_call_is_the_median_after_two_warmups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([0.0, 0.001, 1.0, 1.005, 2.0, 2.003])  # samples of 1, 5 and 3 ms
    monkeypatch.setattr(
        demo, "time", types.SimpleNamespace(perf_counter=lambda: next(clock))
    )
    calls: list[None] = []

    def fn() -> torch.Tensor:
        calls.append(None)
        return torch.zeros(1)

    assert time_call(fn, _options(iters=3)) == pytest.approx(3.0)
    assert len(calls) == 2 + 3


# From each model's config.json on the Hugging Face Hub (hidden_size,
# moe_intermediate_size or intermediate_size, n_routed_experts / num_experts,
# num_experts_per_tok, and DeepSeek-V3's grouped sigmoid routing).
PUBLISHED: dict[str, dict[str, Any]] = {
    "mixtral-8x7b": {"num_experts": 8, "top_k": 2, "hidden_size": 4096, "intermediate_size": 14336},
    "qwen3-30b-a3b": {"num_experts": 128, "top_k": 8, "hidden_size": 2048, "intermediate_size": 768},
    "qwen3-235b-a22b": {"num_experts": 128, "top_k": 8, "hidden_size": 4096, "intermediate_size": 1536},
    "deepseek-v3": {
        "num_experts": 256, "top_k": 8, "hidden_size": 7168, "intermediate_size": 2048,
        "scoring_func": "sigmoid", "num_expert_group": 8, "topk_group": 4,
        "routed_scaling_factor": 2.5,
    },
    "gpt-oss-20b": {
        "num_experts": 32, "top_k": 4, "hidden_size": 2880, "intermediate_size": 2880,
        "activation": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", PUBLISHED)
def test_model_shapes_are_the_published_ones(name: str) -> None:
    assert MODELS[name] == MoEConfig(**PUBLISHED[name])


def test_cli_passes_its_arguments_to_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[DemoOptions] = []
    monkeypatch.setattr(cli, "run_demo", lambda options, stream: seen.append(options))
    assert main(["demo", "--model", "tiny", "--device", "cpu"]) == 0
    argv = ["demo", "--model", "tiny", "--device", "cpu", "--tokens", "7", "--scheme",
            "asym-g128", "--backend", "cpu-int4", "--iters", "3", "--seed", "5"]  # fmt: skip
    for flag in ("bf16", "fp16", "fp32"):
        assert main([*argv, "--dtype", flag]) == 0
    given = DemoOptions(
        model="tiny", tokens=7, scheme=INT4_ASYM_G128, backend="cpu-int4",
        device="cpu", dtype=torch.bfloat16, iters=3, seed=5,
    )  # fmt: skip
    assert seen == [
        DemoOptions(
            model="tiny", tokens=16, scheme=INT4_SYM_G32, backend="auto",
            device="cpu", dtype=torch.bfloat16, iters=10, seed=0,
        ),
        given,
        attrs.evolve(given, dtype=torch.float16),
        attrs.evolve(given, dtype=torch.float32),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("present", "expected"),
    [({"cpu", "cuda", "xpu"}, "cuda"), ({"cpu", "xpu"}, "xpu"), ({"cpu"}, "cpu")],
)
def test_auto_device_prefers_cuda_then_xpu(
    present: set[str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "_is_available", lambda t: t in present)
    assert build_parser().parse_args(["demo", "--device", "auto"]).device == expected


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--tokens", "abc", "argument --tokens: must be an integer >= 1, got 'abc'"),
        (
            "--device",
            "cpu:zero",
            "must be a device string like `cuda:0`, got 'cpu:zero'",
        ),
    ],
)
def test_cli_refuses_more_bad_arguments(
    flag: str, value: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # (belong as more cases of test_cli_refuses_bad_arguments_with_the_reason)
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--model", "tiny", flag, value])
    assert exit_info.value.code == 2
    assert reason in capsys.readouterr().err
