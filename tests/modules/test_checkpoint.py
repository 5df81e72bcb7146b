"""Loading one MoE layer from safetensors files or state dicts, in every format."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core.config import MoEConfig
from core.errors import ConfigError, ShapeError
from core.formats import export_expert_weights, quantization_config
from core.packing import unpack_int4
from core.quantize import quantize_expert_weights
from core.scheme import INT4_ASYM_G32, INT4_SYM_G32, Int4Scheme
from core.weights import QuantizedExpertWeights
from modules import Int4MoE
from modules.checkpoint import from_checkpoint, load_experts
from tests.core.formats.packers import awq_pack, gptq_pack
from tests.tolerances import EXACT

CFG = MoEConfig(num_experts=3, top_k=2, hidden_size=64, intermediate_size=32)
PREFIX = "model.layers.1.mlp"


def _weights(gen: torch.Generator, scheme: Int4Scheme) -> QuantizedExpertWeights:
    w13 = torch.randn(3, 64, 64, generator=gen)
    w2 = torch.randn(3, 64, 32, generator=gen)
    return quantize_expert_weights(w13, w2, scheme, scale_dtype=torch.float16)


def _same(a: QuantizedExpertWeights, b: QuantizedExpertWeights) -> None:
    assert a.scheme == b.scheme
    assert a.tensors().keys() == b.tensors().keys()
    for name, tensor in a.tensors().items():
        torch.testing.assert_close(b.tensors()[name], tensor, **EXACT)


def _projections(
    w: QuantizedExpertWeights, e: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(codes (N, K), scale (N, G), zero (N, G)) of gate, up and down of expert e."""
    f = w.intermediate_size
    codes13, codes2 = unpack_int4(w.w13_qdata[e]), unpack_int4(w.w2_qdata[e])
    z13 = (
        w.w13_zero_point[e]
        if w.w13_zero_point is not None
        else torch.full_like(w.w13_scale[e], 8, dtype=torch.uint8)
    )
    z2 = (
        w.w2_zero_point[e]
        if w.w2_zero_point is not None
        else torch.full_like(w.w2_scale[e], 8, dtype=torch.uint8)
    )
    return {
        "gate_proj": (codes13[:f], w.w13_scale[e, :f], z13[:f]),
        "up_proj": (codes13[f:], w.w13_scale[e, f:], z13[f:]),
        "down_proj": (codes2, w.w2_scale[e], z2),
    }


def _gptq_state(
    w: QuantizedExpertWeights, *, v1: bool = True
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for e in range(w.num_experts):
        for proj, (codes, scale, zero) in _projections(w, e).items():
            qweight, qzeros = gptq_pack(codes.T.long(), zero.T.long(), v1=v1)
            k = codes.shape[1]
            name = f"{PREFIX}.experts.{e}.{proj}"
            out |= {
                f"{name}.qweight": qweight,
                f"{name}.qzeros": qzeros,
                f"{name}.scales": scale.T.contiguous(),
                f"{name}.g_idx": torch.arange(k, dtype=torch.int32) // 32,
            }
    return out


def _awq_state(w: QuantizedExpertWeights) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for e in range(w.num_experts):
        for proj, (codes, scale, zero) in _projections(w, e).items():
            qweight, qzeros = awq_pack(codes.T.long(), zero.T.long())
            name = f"{PREFIX}.experts.{e}.{proj}"
            out |= {
                f"{name}.qweight": qweight,
                f"{name}.qzeros": qzeros,
                f"{name}.scales": scale.T.contiguous(),
            }
    return out


def _ct_state(
    w: QuantizedExpertWeights,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> dict[str, torch.Tensor]:
    return export_expert_weights(w, prefix=f"{PREFIX}.experts", names=names)


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_compressed_tensors_state_dict_round_trips(
    generator: torch.Generator, scheme: Int4Scheme
) -> None:
    w = _weights(generator, scheme)
    loaded = load_experts(_ct_state(w), prefix=PREFIX, config=CFG)
    assert loaded.format == "compressed-tensors"
    _same(w, loaded.weights)


def test_mixtral_naming_is_read(generator: torch.Generator) -> None:
    w = _weights(generator, INT4_SYM_G32)
    state = _ct_state(w, ("w1", "w3", "w2"))
    _same(w, load_experts(state, prefix=PREFIX, config=CFG).weights)


def test_gptq_is_detected_and_symmetric_zero_points_dropped(
    generator: torch.Generator,
) -> None:
    w = _weights(generator, INT4_SYM_G32)
    loaded = load_experts(_gptq_state(w), prefix=PREFIX, config=CFG)
    assert loaded.format == "gptq"
    _same(w, loaded.weights)


def test_awq_is_detected_from_qweight_shape(generator: torch.Generator) -> None:
    w = _weights(generator, INT4_ASYM_G32)
    loaded = load_experts(_awq_state(w), prefix=PREFIX, config=CFG)
    assert loaded.format == "awq"
    _same(w, loaded.weights)


def test_gptq_v2_needs_the_quantization_config(generator: torch.Generator) -> None:
    w = _weights(generator, INT4_ASYM_G32)
    state = _gptq_state(w)
    qc = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 32,
        "sym": False,
        "checkpoint_format": "gptq",
    }
    _same(
        w,
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc).weights,
    )
    qc["checkpoint_format"] = "gptq_v2"
    shifted = load_experts(
        state, prefix=PREFIX, config=CFG, quantization_config=qc
    ).weights
    assert shifted.w13_zero_point is not None
    assert w.w13_zero_point is not None
    assert torch.equal(shifted.w13_zero_point.long() + 1, w.w13_zero_point.long())


def test_gptq_state_without_a_config_reads_symmetric_v1_and_v2(
    generator: torch.Generator,
) -> None:
    """Symmetric zero points tell v1 (7 stored) from v2 (8 stored): both read exactly."""
    w = _weights(generator, INT4_SYM_G32)
    for v1 in (True, False):
        state = _gptq_state(w, v1=v1)
        _same(w, load_experts(state, prefix=PREFIX, config=CFG).weights)


def test_gptq_state_without_a_config_refuses_asymmetric(
    generator: torch.Generator,
) -> None:
    """v1 and v2 would read one zero point apart: refused rather than guessed."""
    state = _gptq_state(_weights(generator, INT4_ASYM_G32))
    with pytest.raises(
        ConfigError, match="checkpoint_format must be known for GPTQ qzeros"
    ):
        load_experts(state, prefix=PREFIX, config=CFG)


@pytest.mark.parametrize("version", ["gptq", "gptq_v2"])
def test_gptq_folder_reads_quantize_config_json(
    version: str, generator: torch.Generator, tmp_path: Path
) -> None:
    """AutoGPTQ/GPTQModel's own file says the version when config.json does not."""
    w = _weights(generator, INT4_ASYM_G32)
    state = _gptq_state(w, v1=version == "gptq")
    save_file(state, str(tmp_path / "m.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    (tmp_path / "quantize_config.json").write_text(
        json.dumps({"bits": 4, "group_size": 32, "sym": False,
                    "checkpoint_format": version})
    )  # fmt: skip
    _same(w, load_experts(tmp_path, prefix=PREFIX, config=CFG).weights)


def test_awq_folder_reads_quant_config_json(
    generator: torch.Generator, tmp_path: Path
) -> None:
    """AutoAWQ's own file (before its config moved into config.json) is read as AWQ."""
    w = _weights(generator, INT4_ASYM_G32)
    save_file(_awq_state(w), str(tmp_path / "m.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    own = {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}
    (tmp_path / "quant_config.json").write_text(json.dumps(own))
    loaded = load_experts(tmp_path, prefix=PREFIX, config=CFG)
    assert loaded.format == "awq"
    _same(w, loaded.weights)
    # What the file says is honoured: a GEMV-packed checkpoint is refused, not misread.
    (tmp_path / "quant_config.json").write_text(json.dumps(own | {"version": "GEMV"}))
    with pytest.raises(ConfigError, match=r"AWQ version must be `gemm`.*'gemv'"):
        load_experts(tmp_path, prefix=PREFIX, config=CFG)
    # quantization_config in config.json comes first.
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "awq", **own}})
    )
    _same(w, load_experts(tmp_path, prefix=PREFIX, config=CFG).weights)


@pytest.mark.parametrize("group", ["32", 32.0, True])
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_a_group_size_that_is_not_an_int_is_refused(
    method: str, group: object, generator: torch.Generator
) -> None:
    """Read as "not declared", the group size would be guessed from the tensors."""
    w = _weights(generator, INT4_ASYM_G32)
    state = _gptq_state(w) if method == "gptq" else _awq_state(w)
    qc = {"quant_method": method, "bits": 4, "group_size": group}
    with pytest.raises(
        ConfigError,
        match=rf"quantization_config group_size must be an int, got {group!r}",
    ):
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc)


def test_fused_three_d_experts(generator: torch.Generator) -> None:
    from core.formats import split_experts, to_compressed_tensors

    w = _weights(generator, INT4_ASYM_G32)
    w13, w2 = split_experts(w)
    state = {
        f"{PREFIX}.experts.gate_up_proj.{k}": v
        for k, v in to_compressed_tensors(w13).items()
    }
    state |= {
        f"{PREFIX}.experts.down_proj.{k}": v
        for k, v in to_compressed_tensors(w2).items()
    }
    _same(w, load_experts(state, prefix=PREFIX, config=CFG).weights)


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
    w = _weights(generator, INT4_ASYM_G32)
    state = _ct_state(w) | {
        f"{PREFIX}.gate.weight": torch.randn(3, 64, generator=generator)
    }
    _write_shards(state, tmp_path, index=index)
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": quantization_config(INT4_ASYM_G32)})
    )
    loaded = load_experts(tmp_path, prefix=PREFIX, config=CFG)
    _same(w, loaded.weights)
    assert loaded.gate_weight is not None
    torch.testing.assert_close(
        loaded.gate_weight, state[f"{PREFIX}.gate.weight"], **EXACT
    )


def test_single_file_and_module_forward(
    generator: torch.Generator, tmp_path: Path
) -> None:
    w = _weights(generator, INT4_SYM_G32)
    gate = torch.randn(3, 64, generator=generator).to(torch.float16)
    save_file(
        _ct_state(w) | {f"{PREFIX}.gate.weight": gate},
        str(tmp_path / "model.safetensors"),
    )
    moe = from_checkpoint(
        tmp_path / "model.safetensors", prefix=PREFIX, config=CFG, backend="reference"
    )
    via_class = Int4MoE.from_checkpoint(
        tmp_path / "model.safetensors", prefix=PREFIX, config=CFG, backend="reference"
    )
    for name, tensor in moe.state_dict().items():
        torch.testing.assert_close(via_class.state_dict()[name], tensor, **EXACT)
    direct = Int4MoE.from_quantized(
        w, config=CFG, backend="reference", gate_weight=gate
    )
    x = torch.randn(5, 64, generator=generator).to(torch.float16)
    torch.testing.assert_close(moe(x), direct(x), **EXACT)


def test_missing_and_extra_tensors_are_named(generator: torch.Generator) -> None:
    state = _ct_state(_weights(generator, INT4_SYM_G32))
    del state[f"{PREFIX}.experts.2.up_proj.weight_scale"]
    with pytest.raises(
        ConfigError, match=r"missing .*experts\.2\.up_proj\.weight_scale"
    ):
        load_experts(state, prefix=PREFIX, config=CFG)
    state = _ct_state(_weights(generator, INT4_SYM_G32))
    state[f"{PREFIX}.experts.1.down_proj.bias"] = torch.zeros(64)
    with pytest.raises(ConfigError, match=r"unexpected .*experts\.1\.down_proj\.bias"):
        load_experts(state, prefix=PREFIX, config=CFG)
    with pytest.raises(ConfigError, match="missing"):
        load_experts(
            _ct_state(_weights(generator, INT4_SYM_G32)),
            prefix=PREFIX,
            config=MoEConfig(
                num_experts=4, top_k=2, hidden_size=64, intermediate_size=32
            ),
        )


def test_formats_that_disagree_or_are_not_int4_are_refused(
    generator: torch.Generator,
) -> None:
    state = _ct_state(_weights(generator, INT4_SYM_G32))
    with pytest.raises(ConfigError, match="contradicts"):
        load_experts(
            state,
            prefix=PREFIX,
            config=CFG,
            format="gptq",
            quantization_config={"quant_method": "awq"},
        )
    with pytest.raises(ConfigError, match="bits must be 4"):
        load_experts(
            state,
            prefix=PREFIX,
            config=CFG,
            quantization_config={"quant_method": "gptq", "bits": 8},
        )
    with pytest.raises(ConfigError, match="version must be `gemm`"):
        load_experts(
            state,
            prefix=PREFIX,
            config=CFG,
            quantization_config={"quant_method": "awq", "version": "gemv"},
        )
    with pytest.raises(
        ConfigError,
        match=rf"prefix 'model.layers.9.mlp': no tensors under "
        rf"'model.layers.9.mlp.experts.' in the checkpoint; experts are under the "
        rf"prefixes \['{PREFIX}'\]",
    ):
        load_experts(state, prefix="model.layers.9.mlp", config=CFG)
    same = load_experts(state, prefix=PREFIX + ".", config=CFG)  # a trailing dot
    _same(load_experts(state, prefix=PREFIX, config=CFG).weights, same.weights)


def _weights_args(
    bits: int, *, symmetric: bool, group: int | None
) -> dict[str, object]:
    return {
        "num_bits": bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": "channel" if group is None else "group",
        "group_size": group,
    }


def _two_groups(attention: dict[str, object], ignore: list[str]) -> dict[str, object]:
    """Attention quantized by `attention` (listed first), experts int4 sym g32."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {"targets": ["re:.*self_attn.*"], "weights": attention},
            "group_1": {
                "targets": ["re:.*experts.*"],
                "weights": _weights_args(4, symmetric=True, group=32),
            },
        },
        "ignore": ignore,
    }


@pytest.mark.parametrize(
    "attention",
    [
        _weights_args(8, symmetric=True, group=None),
        _weights_args(4, symmetric=True, group=128),
        _weights_args(4, symmetric=False, group=32),
    ],
    ids=["w8_channel", "w4_g128", "w4_asym_g32"],
)
def test_mixed_config_groups_read_the_experts_group(
    generator: torch.Generator, attention: dict[str, object]
) -> None:
    w = _weights(generator, INT4_SYM_G32)
    qc = _two_groups(attention, ["lm_head", "re:.*mlp.gate$"])
    loaded = load_experts(
        _ct_state(w), prefix=PREFIX, config=CFG, quantization_config=qc
    )
    _same(w, loaded.weights)
    qc = _two_groups(attention, ["re:.*experts\\.2\\..*"])
    with pytest.raises(ConfigError, match=r"leaves the expert module .*experts\.2\."):
        load_experts(_ct_state(w), prefix=PREFIX, config=CFG, quantization_config=qc)


def test_format_names_are_checked_and_normalised(generator: torch.Generator) -> None:
    w = _weights(generator, INT4_SYM_G32)
    for name in ("compressed_tensors", "Compressed-Tensors"):
        loaded = load_experts(_ct_state(w), prefix=PREFIX, config=CFG, format=name)
        assert loaded.format == "compressed-tensors"
        _same(w, loaded.weights)
    with pytest.raises(ConfigError, match=r"format must be `auto`.* got 'gptq_v2'"):
        load_experts(_ct_state(w), prefix=PREFIX, config=CFG, format="gptq_v2")


def test_files_without_safetensors_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import fails
    with pytest.raises(ImportError, match=r"needs safetensors: pip install"):
        load_experts(tmp_path, prefix=PREFIX, config=CFG)


@pytest.mark.parametrize("dot", ["", "."], ids=["prefix", "prefix_with_dot"])
@pytest.mark.parametrize("where", ["gate.", ""], ids=["on_gate", "on_block"])
def test_correction_bias_is_read_from_the_gate_or_the_block(
    where: str, dot: str, generator: torch.Generator
) -> None:
    """DeepSeek-V3 stores it on the gate, MiniMax-M2 on the block; both at once is
    ambiguous and raises. A prefix written with a trailing dot finds the router and
    the bias as it finds the experts."""
    w = _weights(generator, INT4_SYM_G32)
    bias = torch.randn(3, generator=generator)
    gate = torch.randn(3, 64, generator=generator)
    state = _ct_state(w) | {
        f"{PREFIX}.{where}e_score_correction_bias": bias,
        f"{PREFIX}.gate.weight": gate,
    }
    loaded = load_experts(state, prefix=PREFIX + dot, config=CFG)
    assert loaded.e_score_correction_bias is not None
    torch.testing.assert_close(loaded.e_score_correction_bias, bias, **EXACT)
    assert loaded.gate_weight is not None
    torch.testing.assert_close(loaded.gate_weight, gate, **EXACT)
    both = state | {
        f"{PREFIX}.gate.e_score_correction_bias": bias,
        f"{PREFIX}.e_score_correction_bias": bias,
    }
    with pytest.raises(ConfigError, match="must hold one e_score_correction_bias"):
        load_experts(both, prefix=PREFIX, config=CFG)


@pytest.mark.parametrize("packing", ["auto_round:auto_gptq", "auto_round:auto_awq"])
def test_auto_round_checkpoints_load_as_their_packing(
    packing: str, generator: torch.Generator
) -> None:
    w = _weights(generator, INT4_ASYM_G32)
    state = _gptq_state(w) if packing.endswith("gptq") else _awq_state(w)
    qc = {
        "quant_method": "auto-round",
        "packing_format": packing,
        "bits": 4,
        "group_size": 32,
        "sym": False,
    }
    loaded = load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc)
    assert loaded.format == packing.rsplit("_", 1)[-1]
    _same(w, loaded.weights)


def test_int4_moe_own_state_is_read_as_it_is(generator: torch.Generator) -> None:
    """A saved Int4MoE's buffers under ``<prefix>.experts.``: the scheme follows from
    them (zero points: asymmetric; scale groups: the group size)."""
    from core.scheme import INT4_SYM

    def saved(w: QuantizedExpertWeights) -> dict[str, torch.Tensor]:
        moe = Int4MoE.from_quantized(w, config=CFG)
        return {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()}

    for scheme in (INT4_ASYM_G32, INT4_SYM):
        w = _weights(generator, scheme)
        loaded = load_experts(saved(w), prefix=PREFIX, config=CFG)
        assert loaded.format == "int4-moe"
        _same(w, loaded.weights)
    state = saved(_weights(generator, INT4_SYM_G32))
    gate = torch.randn(3, 64, generator=generator)
    routed = Int4MoE.from_quantized(_weights(generator, INT4_SYM_G32), config=CFG)
    with_gate = {f"{PREFIX}.experts.{k}": v for k, v in routed.state_dict().items()}
    with_gate[f"{PREFIX}.experts.gate_weight"] = gate  # a standalone layer's router
    got = load_experts(with_gate, prefix=PREFIX, config=CFG).gate_weight
    assert got is not None
    torch.testing.assert_close(got, gate, **EXACT)
    two = with_gate | {f"{PREFIX}.gate.weight": gate}
    with pytest.raises(ConfigError, match=r"checkpoint must hold one router for"):
        load_experts(two, prefix=PREFIX, config=CFG)
    with pytest.raises(ConfigError, match="format 'gptq' contradicts the checkpoint"):
        load_experts(state, prefix=PREFIX, config=CFG, format="gptq")
    shard = state | {f"{PREFIX}.experts.expert_map": torch.zeros(3, dtype=torch.int32)}
    with pytest.raises(
        ConfigError, match=r"unexpected tensors beside int4-moe's own .*expert_map"
    ):
        load_experts(shard, prefix=PREFIX, config=CFG)


def _asymmetric_export(gen: torch.Generator) -> dict[str, torch.Tensor]:
    w = quantize_expert_weights(
        torch.randn(3, 64, 64, generator=gen),
        torch.randn(3, 64, 32, generator=gen),
        INT4_ASYM_G32,
        scale_dtype=torch.float16,
    )
    return export_expert_weights(w, prefix=f"{PREFIX}.experts")


def test_asymmetric_compressed_tensors_without_a_zero_point_are_refused(
    generator: torch.Generator,
) -> None:
    """Declared asymmetric: a missing weight_zero_point is named, not read as 8."""
    state = _asymmetric_export(generator)
    dropped = f"{PREFIX}.experts.1.up_proj.weight_zero_point"
    del state[dropped]
    with pytest.raises(
        ConfigError, match=rf"missing compressed-tensors tensors: {dropped}"
    ):
        load_experts(
            state, prefix=PREFIX, config=CFG,
            quantization_config=quantization_config(INT4_ASYM_G32),
        )  # fmt: skip


def test_load_experts_refuses_a_config_of_other_sizes(
    generator: torch.Generator,
) -> None:
    """The checkpoint's sizes are checked against the config by load_experts itself."""
    state = _asymmetric_export(generator)
    wide = MoEConfig(num_experts=3, top_k=2, hidden_size=64, intermediate_size=64)
    with pytest.raises(
        ConfigError,
        match=r"checkpoint experts have \(num_experts, hidden_size, intermediate_size\) "
        r"= \(3, 64, 32\), but config says \(3, 64, 64\)",
    ):
        load_experts(
            state, prefix=PREFIX, config=wide,
            quantization_config=quantization_config(INT4_ASYM_G32),
        )  # fmt: skip


def test_int4_moe_own_state_takes_the_router_and_bias_of_the_gate(
    generator: torch.Generator,
) -> None:
    """A replaced model's saved layer keeps its router (and DeepSeek-V3's correction
    bias) on ``<prefix>.gate``, beside int4-moe's own tensors: both are read."""
    w = _weights(generator, INT4_SYM_G32)
    moe = Int4MoE.from_quantized(w, config=CFG)
    gate = torch.randn(3, 64, generator=generator)
    bias = torch.randn(3, generator=generator)
    state = {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()} | {
        f"{PREFIX}.gate.weight": gate,
        f"{PREFIX}.gate.e_score_correction_bias": bias,
    }
    loaded = load_experts(state, prefix=PREFIX, config=CFG)
    assert loaded.format == "int4-moe"
    _same(w, loaded.weights)
    assert loaded.gate_weight is not None
    assert loaded.e_score_correction_bias is not None
    torch.testing.assert_close(loaded.gate_weight, gate, **EXACT)
    torch.testing.assert_close(loaded.e_score_correction_bias, bias, **EXACT)


def test_int4_moe_own_state_is_checked_against_the_config(
    generator: torch.Generator,
) -> None:
    """As for the quantizers' formats, the sizes are checked by load_experts itself,
    and a state missing one of int4-moe's required tensors is a ConfigError."""
    moe = Int4MoE.from_quantized(_weights(generator, INT4_SYM_G32), config=CFG)
    state = {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()}
    wide = MoEConfig(num_experts=3, top_k=2, hidden_size=64, intermediate_size=64)
    with pytest.raises(
        ConfigError,
        match=r"checkpoint experts have \(num_experts, hidden_size, intermediate_size\) "
        r"= \(3, 64, 32\), but config says \(3, 64, 64\)",
    ):
        load_experts(state, prefix=PREFIX, config=wide)
    del state[f"{PREFIX}.experts.w2_scale"]
    with pytest.raises(ConfigError):
        load_experts(state, prefix=PREFIX, config=CFG)


def test_quantizers_own_config_files_in_order_and_by_method(
    generator: torch.Generator, tmp_path: "Path"
) -> None:
    """``quantize_config.json`` is looked for before ``quant_config.json``, and the
    ``quant_method`` a file names is kept (read as GPTQ only when it names none)."""
    import json

    w = _weights(generator, INT4_ASYM_G32)
    awq = {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}
    save_file(_awq_state(w), str(tmp_path / "m.safetensors"))
    (tmp_path / "quantize_config.json").write_text(
        json.dumps({"quant_method": "awq", **awq})
    )
    loaded = load_experts(tmp_path, prefix=PREFIX, config=CFG)
    assert loaded.format == "awq"
    _same(w, loaded.weights)
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    save_file(_gptq_state(w, v1=True), str(gptq / "m.safetensors"))
    (gptq / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 32, "sym": False, "checkpoint_format": "gptq"}
    ))  # fmt: skip
    (gptq / "quant_config.json").write_text(json.dumps(awq))
    loaded = load_experts(gptq, prefix=PREFIX, config=CFG)
    assert loaded.format == "gptq"
    _same(w, loaded.weights)


def test_a_given_quantization_config_wins_over_the_files(
    generator: torch.Generator, tmp_path: "Path"
) -> None:
    """The ``quantization_config`` argument is used as given; the files beside the
    checkpoint are read only when it is left out."""
    import json

    w = _weights(generator, INT4_ASYM_G32)
    save_file(_gptq_state(w, v1=True), str(tmp_path / "m.safetensors"))
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False}
    (tmp_path / "config.json").write_text(json.dumps(
        {"quantization_config": qc | {"checkpoint_format": "gptq_v2"}}
    ))  # fmt: skip
    given = qc | {"checkpoint_format": "gptq"}
    _same(
        w,
        load_experts(
            tmp_path, prefix=PREFIX, config=CFG, quantization_config=given
        ).weights,
    )


def test_a_single_expert_layer_is_read(generator: torch.Generator) -> None:
    """Per-expert names stack into (E, ...) even for one expert."""

    one = MoEConfig(num_experts=1, top_k=1, hidden_size=64, intermediate_size=32)
    w = quantize_expert_weights(
        torch.randn(1, 64, 64, generator=generator),
        torch.randn(1, 64, 32, generator=generator),
        INT4_SYM_G32,
        scale_dtype=torch.float16,
    )
    _same(w, load_experts(_ct_state(w), prefix=PREFIX, config=one).weights)


def test_asymmetric_gptq_missing_one_qzeros_is_named(
    generator: torch.Generator,
) -> None:
    """``sym: false`` makes every projection's qzeros required: one dropped is
    reported by name, not read as zero point 8."""
    state = _gptq_state(_weights(generator, INT4_ASYM_G32))
    del state[f"{PREFIX}.experts.1.up_proj.qzeros"]
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False}
    with pytest.raises(
        ConfigError, match=r"missing gptq tensors: .*experts\.1\.up_proj\.qzeros"
    ):
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=qc)


def test_a_malformed_projection_is_named_in_the_error(
    generator: torch.Generator,
) -> None:
    """A format error inside one projection says which projection it is."""
    state = _ct_state(_weights(generator, INT4_SYM_G32))
    key = f"{PREFIX}.experts.2.down_proj.weight_scale"
    state[key] = state[key][:16]
    with pytest.raises(
        ShapeError, match=rf"{PREFIX}\.experts\.2\.down_proj: weight_scale must be"
    ):
        load_experts(state, prefix=PREFIX, config=CFG)


@pytest.mark.parametrize("scheme", [INT4_SYM_G32, INT4_ASYM_G32], ids=lambda s: s.name)
def test_own_state_with_one_group_in_w13_and_several_in_w2(
    generator: torch.Generator, scheme: Int4Scheme
) -> None:
    """group_size == hidden_size < intermediate_size: w13 holds one group a row and w2
    two; the group size is read from both, and the state round-trips exactly."""
    cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=32, intermediate_size=64)
    w = quantize_expert_weights(
        torch.randn(2, 128, 32, generator=generator),
        torch.randn(2, 32, 64, generator=generator),
        scheme,
    )
    moe = Int4MoE.from_quantized(w, config=cfg)
    state = {f"{PREFIX}.experts.{k}": v for k, v in moe.state_dict().items()}
    loaded = load_experts(state, prefix=PREFIX, config=cfg).weights
    assert loaded.scheme == scheme
    _same(w, loaded)
    scale = state[f"{PREFIX}.experts.w2_scale"]
    state[f"{PREFIX}.experts.w2_scale"] = torch.cat([scale, scale], dim=-1)
    with pytest.raises(
        ConfigError, match=r"must share one group size, got 32/1 and 64/4"
    ):
        load_experts(state, prefix=PREFIX, config=cfg)


def _act_order_config(fmt: str, *, declared: bool) -> dict[str, object]:
    """GPTQ ``desc_act`` with or without ``static_groups``; compressed-tensors
    ``actorder`` `group` or `weight`: act-order declared or not."""
    if fmt == "gptq":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 32,
            "desc_act": True,
            "static_groups": not declared,
        }
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": 32,
        "actorder": "group" if declared else "weight",
    }
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }


@pytest.mark.parametrize(
    ("fmt", "name"), [("gptq", "g_idx"), ("compressed-tensors", "weight_g_idx")]
)
def test_act_order_checkpoints_without_their_g_idx_are_refused(
    fmt: str, name: str, generator: torch.Generator
) -> None:
    """Act-order declared, g_idx not stored: refused by name, never read as
    contiguous groups; GPTQ static groups and `weight` ordering need none."""
    w = _weights(generator, INT4_SYM_G32)
    state = _gptq_state(w) if fmt == "gptq" else _ct_state(w)
    stored = dict(state)
    state = {n: t for n, t in state.items() if not n.endswith(f".{name}")}
    declared = _act_order_config(fmt, declared=True)
    with pytest.raises(
        ConfigError,
        match=rf"missing {fmt} tensors: .*experts\.0\.down_proj\.{name}.* "
        r"\(quantization_config declares act-order",
    ):
        load_experts(state, prefix=PREFIX, config=CFG, quantization_config=declared)
    spared = _act_order_config(fmt, declared=False)
    loaded = load_experts(state, prefix=PREFIX, config=CFG, quantization_config=spared)
    _same(w, loaded.weights)
    if fmt == "gptq":  # stored, the g_idx is read (here: contiguous groups)
        loaded = load_experts(
            stored, prefix=PREFIX, config=CFG, quantization_config=declared
        )
        _same(w, loaded.weights)


def test_folder_without_index_refuses_a_tensor_held_twice(
    generator: torch.Generator, tmp_path: Path
) -> None:
    """Without an index nothing says which copy to read (e.g. a stale shard)."""
    state = _ct_state(_weights(generator, INT4_SYM_G32))
    save_file(state, str(tmp_path / "model-00001-of-00001.safetensors"))
    stale = _ct_state(_weights(generator, INT4_SYM_G32))
    save_file(stale, str(tmp_path / "model-00001-of-00002.safetensors"))
    with pytest.raises(
        ConfigError,
        match=r"must hold each tensor in one file .*got '.*experts\.0\.down_proj\."
        r"weight_packed' in both model-00001-of-00001\.safetensors and "
        r"model-00001-of-00002\.safetensors",
    ):
        load_experts(tmp_path, prefix=PREFIX, config=CFG)
