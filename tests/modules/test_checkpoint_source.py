"""modules/checkpoint_source.py: single files, folders of shards (indexed or not) and
the quantizers' config files beside them, read through load_experts."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core.errors import ConfigError, DeviceError
from core.formats import quantization_config
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32
from modules.checkpoint import load_experts
from tests.modules.checkpoint_states import (
    CFG,
    PREFIX,
    assert_same,
    awq_state,
    ct_state,
    gptq_state,
    quantized_weights,
)
from tests.tolerances import EXACT


@pytest.mark.parametrize("version", ["gptq", "gptq_v2"])
def test_gptq_folder_reads_quantize_config_json(
    version: str, generator: torch.Generator, tmp_path: Path
) -> None:
    """AutoGPTQ/GPTQModel's own file says the version when config.json does not."""
    w = quantized_weights(generator, INT4_ASYM_G32)
    state = gptq_state(w, v1=version == "gptq")
    save_file(state, str(tmp_path / "m.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    (tmp_path / "quantize_config.json").write_text(
        json.dumps({"bits": 4, "group_size": 32, "sym": False,
                    "checkpoint_format": version})
    )  # fmt: skip
    assert_same(w, load_experts(tmp_path, prefix=PREFIX, config=CFG).weights)


def test_awq_folder_reads_quant_config_json(
    generator: torch.Generator, tmp_path: Path
) -> None:
    """AutoAWQ's own file (before its config moved into config.json) is read as AWQ."""
    w = quantized_weights(generator, INT4_ASYM_G32)
    save_file(awq_state(w), str(tmp_path / "m.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    own = {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}
    (tmp_path / "quant_config.json").write_text(json.dumps(own))
    loaded = load_experts(tmp_path, prefix=PREFIX, config=CFG)
    assert loaded.format == "awq"
    assert_same(w, loaded.weights)
    # What the file says is honoured: a GEMV-packed checkpoint is refused, not misread.
    (tmp_path / "quant_config.json").write_text(json.dumps(own | {"version": "GEMV"}))
    with pytest.raises(ConfigError, match=r"AWQ version must be `gemm`.*'gemv'"):
        load_experts(tmp_path, prefix=PREFIX, config=CFG)
    # quantization_config in config.json comes first.
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "awq", **own}})
    )
    assert_same(w, load_experts(tmp_path, prefix=PREFIX, config=CFG).weights)


def _write_shards(state: dict[str, torch.Tensor], folder: Path, *, index: bool) -> None:
    names = sorted(state)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for file, part in shards.items():
        save_file({n: state[n].contiguous() for n in part}, str(folder / file))
    if index:
        weight_map = {n: f for f, part in shards.items() for n in part}
        # A tensor of another layer in a shard that does not exist: reading it would fail,
        # so loading this layer proves that only the layer's own tensors are opened.
        weight_map["model.layers.0.mlp.experts.0.gate_proj.weight_packed"] = (
            "absent.safetensors"
        )
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": weight_map})
        )


@pytest.mark.parametrize("index", [True, False], ids=["indexed", "globbed"])
def test_sharded_folder_is_read_lazily(
    generator: torch.Generator, tmp_path: Path, index: bool
) -> None:
    w = quantized_weights(generator, INT4_ASYM_G32)
    state = ct_state(w) | {
        f"{PREFIX}.gate.weight": torch.randn(3, 64, generator=generator)
    }
    _write_shards(state, tmp_path, index=index)
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": quantization_config(INT4_ASYM_G32)})
    )
    loaded = load_experts(tmp_path, prefix=PREFIX, config=CFG)
    assert_same(w, loaded.weights)
    assert loaded.gate_weight is not None
    torch.testing.assert_close(
        loaded.gate_weight, state[f"{PREFIX}.gate.weight"], **EXACT
    )


def test_files_without_safetensors_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import fails
    with pytest.raises(ImportError, match=r"needs safetensors: pip install"):
        load_experts(tmp_path, prefix=PREFIX, config=CFG)


def test_quantizers_own_config_files_in_order_and_by_method(
    generator: torch.Generator, tmp_path: "Path"
) -> None:
    """``quantize_config.json`` is looked for before ``quant_config.json``, and the
    ``quant_method`` a file names is kept (read as GPTQ only when it names none)."""
    import json

    w = quantized_weights(generator, INT4_ASYM_G32)
    awq = {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}
    save_file(awq_state(w), str(tmp_path / "m.safetensors"))
    (tmp_path / "quantize_config.json").write_text(
        json.dumps({"quant_method": "awq", **awq})
    )
    loaded = load_experts(tmp_path, prefix=PREFIX, config=CFG)
    assert loaded.format == "awq"
    assert_same(w, loaded.weights)
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    save_file(gptq_state(w, v1=True), str(gptq / "m.safetensors"))
    (gptq / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 32, "sym": False, "checkpoint_format": "gptq"}
    ))  # fmt: skip
    (gptq / "quant_config.json").write_text(json.dumps(awq))
    loaded = load_experts(gptq, prefix=PREFIX, config=CFG)
    assert loaded.format == "gptq"
    assert_same(w, loaded.weights)


def test_a_given_quantization_config_wins_over_the_files(
    generator: torch.Generator, tmp_path: "Path"
) -> None:
    """The ``quantization_config`` argument is used as given; the files beside the
    checkpoint are read only when it is left out."""
    import json

    w = quantized_weights(generator, INT4_ASYM_G32)
    save_file(gptq_state(w, v1=True), str(tmp_path / "m.safetensors"))
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False}
    (tmp_path / "config.json").write_text(json.dumps(
        {"quantization_config": qc | {"checkpoint_format": "gptq_v2"}}
    ))  # fmt: skip
    given = qc | {"checkpoint_format": "gptq"}
    assert_same(
        w,
        load_experts(
            tmp_path, prefix=PREFIX, config=CFG, quantization_config=given
        ).weights,
    )


def test_folder_without_index_refuses_a_tensor_held_twice(
    generator: torch.Generator, tmp_path: Path
) -> None:
    """Without an index nothing says which copy to read (e.g. a stale shard)."""
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    save_file(state, str(tmp_path / "model-00001-of-00001.safetensors"))
    stale = ct_state(quantized_weights(generator, INT4_SYM_G32))
    save_file(stale, str(tmp_path / "model-00001-of-00002.safetensors"))
    with pytest.raises(
        ConfigError,
        match=r"must hold each tensor in one file .*got '.*experts\.0\.down_proj\."
        r"weight_packed' in both model-00001-of-00001\.safetensors and "
        r"model-00001-of-00002\.safetensors",
    ):
        load_experts(tmp_path, prefix=PREFIX, config=CFG)


def test_a_missing_path_is_named_as_missing(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"got .*nowhere\.safetensors, which does not exist"
    ):
        load_experts(tmp_path / "nowhere.safetensors", prefix=PREFIX, config=CFG)


@pytest.mark.parametrize("as_files", [True, False], ids=["files", "state-dict"])
def test_loading_onto_the_meta_device_is_refused_up_front(
    as_files: bool, generator: torch.Generator, tmp_path: Path
) -> None:
    """Before: safetensors' bare ``device meta is invalid`` for files, torch's ``Cannot
    copy out of meta tensor`` for a state dict."""
    state = gptq_state(quantized_weights(generator, INT4_SYM_G32), v1=False)
    save_file(state, str(tmp_path / "m.safetensors"))
    source: Path | dict[str, torch.Tensor] = tmp_path if as_files else state
    config = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}
    with pytest.raises(DeviceError, match="device must hold the checkpoint's values"):
        load_experts(
            source, prefix=PREFIX, config=CFG, quantization_config=config,
            device="meta",
        )  # fmt: skip
    with pytest.raises(DeviceError, match="must name a torch device, got 'gpu0'"):
        load_experts(
            source, prefix=PREFIX, config=CFG, quantization_config=config,
            device="gpu0",
        )  # fmt: skip


def test_malformed_files_are_named_in_a_config_error(
    generator: torch.Generator, tmp_path: Path
) -> None:
    """Files that are not what they claim raise ``ConfigError`` naming the file."""
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    cfg = quantization_config(INT4_SYM_G32)
    bad = tmp_path / "bad.safetensors"
    bad.write_text("not a safetensors file")
    with pytest.raises(ConfigError, match=r"bad\.safetensors must be a safetensors"):
        load_experts(bad, prefix=PREFIX, config=CFG, quantization_config=cfg)
    (tmp_path / "bad_config").mkdir()
    save_file(state, str(tmp_path / "bad_config" / "model.safetensors"))
    (tmp_path / "bad_config" / "config.json").write_text("{oops")
    with pytest.raises(ConfigError, match=r"config\.json must hold JSON"):
        load_experts(tmp_path / "bad_config", prefix=PREFIX, config=CFG)
    (tmp_path / "bad_config" / "config.json").write_text("[1, 2]")
    with pytest.raises(
        ConfigError, match=r"config\.json must hold a JSON object, got list"
    ):
        load_experts(tmp_path / "bad_config", prefix=PREFIX, config=CFG)
    indexes: list[dict[str, object]] = [{"metadata": {}}, {"weight_map": {"a": 3}}]
    for index in indexes:
        folder = tmp_path / f"index_{len(index)}_{'weight_map' in index}"
        folder.mkdir()
        save_file(state, str(folder / "x.safetensors"))
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(ConfigError, match=r"index\.json must map tensor names"):
            load_experts(folder, prefix=PREFIX, config=CFG, quantization_config=cfg)


def test_a_state_dict_of_non_tensors_is_named(generator: torch.Generator) -> None:
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    arrays = {name: t.numpy() for name, t in state.items()}
    with pytest.raises(
        ConfigError, match=r"source\[.*\] must be of type Tensor, got ndarray"
    ):
        load_experts(
            arrays,  # type: ignore[arg-type]  # what a runtime caller may pass
            prefix=PREFIX, config=CFG,
            quantization_config=quantization_config(INT4_SYM_G32),
        )  # fmt: skip


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("gpu", "must name a torch device, got 'gpu'"),
        ("cuda:99", "must be a device present here, got 'cuda:99'"),
        ("xpu:7", "must be a device present here, got 'xpu:7'"),
        # torch knows `lazy` (no runtime to ask if present); safetensors refuses it,
        # and that is not a bad file
        ("lazy", "must be one safetensors loads onto, got 'lazy'"),
    ],
)
def test_a_device_not_here_is_refused_before_reading(
    generator: torch.Generator, tmp_path: Path, device: str, says: str
) -> None:
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    save_file(state, str(tmp_path / "m.safetensors"))
    with pytest.raises(DeviceError, match=f"device {says}"):
        load_experts(
            tmp_path, prefix=PREFIX, config=CFG, device=device,
            quantization_config=quantization_config(INT4_SYM_G32),
        )  # fmt: skip


def test_a_corrupt_shard_named_by_an_index_is_named_when_read(
    generator: torch.Generator, tmp_path: Path
) -> None:
    """Shards an index names are opened only when read: the same ConfigError then."""
    state = ct_state(quantized_weights(generator, INT4_SYM_G32))
    save_file(state, str(tmp_path / "good.safetensors"))
    (tmp_path / "bad.safetensors").write_text("not a safetensors file")
    weight_map = dict.fromkeys(state, "good.safetensors")
    weight_map[next(iter(state))] = "bad.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )
    with pytest.raises(ConfigError, match=r"bad\.safetensors must be a safetensors"):
        load_experts(
            tmp_path, prefix=PREFIX, config=CFG,
            quantization_config=quantization_config(INT4_SYM_G32),
        )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text"), [("quantize_config.json", "{oops"), ("quant_config.json", "[1]")]
)
def test_a_quantizers_own_config_that_is_not_a_json_object_is_named(
    generator: torch.Generator, tmp_path: Path, name: str, text: str
) -> None:
    save_file(
        ct_state(quantized_weights(generator, INT4_SYM_G32)),
        str(tmp_path / "m.safetensors"),
    )
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=rf"{name.replace('.', '[.]')} must hold"):
        load_experts(tmp_path, prefix=PREFIX, config=CFG)
