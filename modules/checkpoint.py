"""Load one MoE layer's int4 experts from a checkpoint: safetensors files or a state dict.

Reads lazily (only the tensors under the layer's prefix), detects GPTQ / AWQ /
compressed-tensors from tensor names and ``quantization_config``, and reports missing
or unexpected tensors by name. May import core, backends and modules; safetensors is
imported only when files are read. Shape legend: ``E`` experts, ``D`` hidden,
``F`` intermediate.
"""

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final, TypeAlias, TypeVar, overload

import attrs
import torch

from core.config import MoEConfig
from core.errors import ConfigError, DTypeError, ShapeError
from core.formats import (
    Int4Projection,
    assemble_experts,
    concat_rows,
    stack_projections,
)
from core.formats.options import (
    SUFFIXES,
    FormatOptions,
    g_idx_required,
    import_projection,
    parse_quantization_config,
    to_checkpoint_format,
)
from core.scheme import Int4Mapping, Int4Scheme
from core.validate import check_type
from core.weights import QuantizedExpertWeights
from modules.int4_moe import Int4MoE

Source: TypeAlias = str | os.PathLike[str] | Mapping[str, torch.Tensor]
NAMINGS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
"""Per-expert projection names: HF (gate, up, down) and Mixtral (w1, w3, w2)."""
_INDEX = "model.safetensors.index.json"
_Layer = TypeVar("_Layer", bound=Int4MoE)


@attrs.frozen(kw_only=True, eq=False)
class LoadedExperts:
    """One MoE layer read from a checkpoint.

    Attributes:
        weights: the experts in the canonical layout.
        gate_weight: float router ``(E, D)`` when ``<prefix>.gate.weight`` exists.
        e_score_correction_bias: ``(E,)`` when the checkpoint has one, on the gate
            (``<prefix>.gate.e_score_correction_bias``, DeepSeek-V3) or on the block
            (``<prefix>.e_score_correction_bias``, MiniMax-M2).
        format: the format that was read.
    """

    weights: QuantizedExpertWeights
    gate_weight: torch.Tensor | None
    e_score_correction_bias: torch.Tensor | None
    format: str


# ---------------------------------------------------------------------- sources
@attrs.frozen(kw_only=True)
class _Source:
    """Tensor names and a reader; files are opened only to read what is asked."""

    names: frozenset[str]
    read: Callable[[Iterable[str]], dict[str, torch.Tensor]]


def _open_source(source: Source, device: torch.device | str) -> _Source:
    if isinstance(source, Mapping):
        tensors = source
        return _Source(
            names=frozenset(tensors),
            read=lambda names: {n: tensors[n].to(device) for n in names},
        )
    return _files_source(_shard_map(Path(source)), str(device))


def checkpoint_names(source: Source) -> frozenset[str]:
    """The tensor names of a checkpoint (file headers only; no tensor is read)."""
    check_type("source", source, (str, os.PathLike, Mapping))
    return _open_source(source, "cpu").names


def _shard_map(path: Path) -> dict[str, Path]:
    """Tensor name to the file holding it (headers only; no tensor is read)."""
    try:
        from safetensors import safe_open
    except ImportError as err:
        raise ImportError(
            "reading checkpoint files needs safetensors: pip install 'int4-moe[hf]' "
            "(or pass a state dict)"
        ) from err

    if path.is_file():
        files = [path]
    elif (path / _INDEX).is_file():
        weight_map = json.loads((path / _INDEX).read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"))
    else:
        files = []
    if not files:
        raise ConfigError(
            f"source must be a .safetensors file or a folder of them, got {path}"
        )
    out: dict[str, Path] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            names = f.keys()  # safe_open is not a mapping
            for name in names:
                if name in out:
                    raise ConfigError(
                        f"checkpoint folder {path} must hold each tensor in one file "
                        f"(it has no {_INDEX} to choose), got {name!r} in both "
                        f"{out[name].name} and {file.name}"
                    )
                out[name] = file
    return out


def _files_source(shards: dict[str, Path], device: str) -> _Source:
    from safetensors import safe_open

    def read(names: Iterable[str]) -> dict[str, torch.Tensor]:
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(shards[name], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for file, wanted in by_file.items():
            with safe_open(file, framework="pt", device=device) as f:
                out.update({n: f.get_tensor(n) for n in wanted})
        return out

    return _Source(names=frozenset(shards), read=read)


def read_quantization_config(source: Source) -> dict[str, object] | None:
    """The ``quantization_config`` of ``config.json`` beside a checkpoint, if any.

    Without one, the ``quantize_config.json`` that AutoGPTQ and GPTQModel write beside
    their checkpoints (read as GPTQ unless it names another ``quant_method``), else the
    ``quant_config.json`` that AutoAWQ wrote before its config moved into
    ``config.json`` (read as AWQ unless it names another ``quant_method``).
    """
    if isinstance(source, Mapping):
        return None
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    config = folder / "config.json"
    if config.is_file():
        found = json.loads(config.read_text()).get("quantization_config")
        if isinstance(found, dict):
            return found
    for name, method in _OWN_CONFIG_FILES:
        own = folder / name
        if own.is_file():
            found = json.loads(own.read_text())
            if isinstance(found, dict):
                return {"quant_method": method, **found}
    return None


_OWN_CONFIG_FILES: Final = (
    ("quantize_config.json", "gptq"),
    ("quant_config.json", "awq"),
)
"""Quantizers' own config files, in the order they are looked for, and their method."""


# ---------------------------------------------------------------------- layout
_PER_EXPERT = re.compile(r"^(\d+)\.([^.]+)\.([^.]+)$")


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _missing_experts(base: str, names: Iterable[str]) -> str:
    """Why no experts were found under ``base``, with the prefixes that have some."""
    found = sorted({n.split(".experts.")[0] for n in names if ".experts." in n})
    where = (
        f"; experts are under the prefixes {found[:4]}"
        + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        if found
        else "; it has no `.experts.` tensors"
    )
    return f"no tensors under {base!r} in the checkpoint{where}"


def _plan(rel_names: set[str], num_experts: int) -> dict[str, list[str]]:
    """Role (`gate`, `up`, `gate_up`, `down`) to projection keys under ``experts.``."""
    matches = [m for n in rel_names if (m := _PER_EXPERT.match(n))]
    if matches:
        projs = {m.group(2) for m in matches}
        naming = next((nm for nm in NAMINGS if set(nm) & projs), NAMINGS[0])
        return {
            role: [f"{e}.{proj}" for e in range(num_experts)]
            for role, proj in zip(("gate", "up", "down"), naming, strict=True)
        }
    if any(n.startswith("gate_up_proj.") for n in rel_names):
        return {"gate_up": ["gate_up_proj"], "down": ["down_proj"]}
    return {"gate": ["gate_proj"], "up": ["up_proj"], "down": ["down_proj"]}


def _detect(
    rel_names: set[str],
    read_one: Callable[[str], torch.Tensor],
    down_key: str,
    config: MoEConfig,
) -> FormatOptions:
    """Guess the format from tensor names, then from a ``qweight`` shape."""
    suffixes = {n.rsplit(".", 1)[-1] for n in rel_names}
    if "weight_packed" in suffixes:
        return FormatOptions(format="compressed-tensors")
    if "qweight" not in suffixes:
        raise ConfigError(
            "cannot tell the format: expected `weight_packed` (compressed-tensors) or "
            f"`qweight` (GPTQ/AWQ) tensors, got suffixes {sorted(suffixes)[:10]}"
        )
    if "g_idx" in suffixes:
        return FormatOptions(format="gptq")
    # down projection: GPTQ qweight (F/8, D), AWQ (F, D/8).
    last = int(read_one(f"{down_key}.qweight").shape[-1])
    d = config.hidden_size
    if last in (d, d // 8) and d != 8:
        return FormatOptions(format="gptq" if last == d else "awq")
    raise ConfigError(
        f"qweight of {down_key} has last dim {last}; expected hidden_size={d} (GPTQ) "
        f"or hidden_size/8={d // 8} (AWQ)"
    )


_ZERO_POINTS: Final = {"gptq": "qzeros", "compressed-tensors": "weight_zero_point"}
"""The optional zero-point tensor of each format, required when it is asymmetric."""


def _names_of(
    opts: FormatOptions, keys: list[str], present: set[str]
) -> tuple[list[str], list[str]]:
    """(names to read, missing names) for these projection keys."""
    required, optional = SUFFIXES[opts.format]
    if opts.symmetric is False and opts.format in _ZERO_POINTS:
        required += (_ZERO_POINTS[opts.format],)
    g_idx = g_idx_required(opts)
    if g_idx is not None:
        required += (g_idx[0],)
    wanted: list[str] = []
    missing: list[str] = []
    for key in keys:
        for suffix in required:
            (wanted if f"{key}.{suffix}" in present else missing).append(
                f"{key}.{suffix}"
            )
        wanted += [f"{key}.{s}" for s in optional if f"{key}.{s}" in present]
    return wanted, missing


def _listing(names: Iterable[str], base: str) -> str:
    full = sorted(f"{base}{n}" for n in names)
    more = f" and {len(full) - 10} more" if len(full) > 10 else ""
    return ", ".join(full[:10]) + more


# ---------------------------------------------------------------------- loading
def load_experts(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = "auto",
    quantization_config: Mapping[str, object] | None = None,
    device: torch.device | str = "cpu",
) -> LoadedExperts:
    """Read one MoE layer's experts (and float router) into the canonical layout.

    Args:
        source: a ``.safetensors`` file, a folder of shards (with or without
            ``model.safetensors.index.json``), or an in-memory state dict.
        prefix: the MoE block's name, e.g. ``model.layers.3.mlp``; experts live under
            ``<prefix>.experts.`` (per expert ``{e}.gate_proj`` / ``up_proj`` /
            ``down_proj`` or Mixtral ``w1`` / ``w3`` / ``w2``, or fused 3-D
            ``gate_up_proj`` / ``down_proj``), the router at ``<prefix>.gate.weight``.
        config: the layer's sizes; ``num_experts`` experts are expected.
        format: `auto` detects from ``quantization_config`` and tensor names; or
            `gptq`, `awq`, `compressed-tensors` (case and ``_``/``-`` ignored).
        quantization_config: the checkpoint's ``quantization_config``; read from the
            ``config.json`` beside ``source`` when left out. For compressed-tensors,
            the ``config_groups`` entry whose targets match the expert modules is
            used (see :func:`core.formats.targets.select_config_group`).
        device: where the tensors are loaded.

    Raises:
        ConfigError: for an unknown or contradicting format, an ambiguous or
            non-int4 ``config_groups`` entry, experts in ``ignore``, or missing or
            unexpected tensors (named); ShapeError / DTypeError for malformed tensors.
    """
    check_type("source", source, (str, os.PathLike, Mapping))
    check_type("prefix", prefix, str)
    check_type("config", config, MoEConfig)
    if quantization_config is not None:
        check_type("quantization_config", quantization_config, Mapping)
    fmt = to_checkpoint_format(format)
    src = _open_source(source, device)
    if quantization_config is None:
        quantization_config = read_quantization_config(source)
    prefix = prefix.rstrip(".")  # the experts' and the router's names alike
    base = _join(prefix, "experts") + "."
    rel = {n[len(base) :] for n in src.names if n.startswith(base)}
    if not rel:
        raise ConfigError(f"prefix {prefix!r}: " + _missing_experts(base, src.names))
    if rel >= _CANONICAL_REQUIRED:
        if fmt != "auto":
            raise ConfigError(
                f"format {fmt!r} contradicts the checkpoint: it holds int4-moe's own "
                f"tensors ({sorted(_CANONICAL_REQUIRED)}) under {base!r}"
            )
        return _canonical(src, prefix, base, rel, config)
    plan = _plan(rel, config.num_experts)
    modules = [base + key for keys in plan.values() for key in keys]
    opts = parse_quantization_config(
        quantization_config, fmt, module_names=modules
    ) or _detect(rel, lambda n: src.read([base + n])[base + n], plan["down"][0], config)
    wanted: list[str] = []
    missing: list[str] = []
    for keys in plan.values():
        got, lost = _names_of(opts, keys, rel)
        wanted += got
        missing += lost
    if missing:
        g_idx = g_idx_required(opts)
        lost_g_idx = g_idx and any(m.endswith(f".{g_idx[0]}") for m in missing)
        why = f" ({g_idx[1]})" if g_idx and lost_g_idx else ""
        raise ConfigError(
            f"missing {opts.format} tensors: {_listing(missing, base)}{why}"
        )
    extra = rel - set(wanted)
    if extra:
        raise ConfigError(f"unexpected tensors under {base!r}: {_listing(extra, base)}")
    gate_name = _join(prefix, "gate.weight")
    bias_name = _correction_bias_name(prefix, src.names)
    router = [n for n in (gate_name, bias_name) if n is not None and n in src.names]
    tensors = src.read([base + n for n in wanted] + router)
    weights = _assemble(plan, opts, {n: tensors[base + n] for n in wanted}, base)
    _check_sizes(weights, config)
    return LoadedExperts(
        weights=weights,
        gate_weight=tensors.get(gate_name),
        e_score_correction_bias=None if bias_name is None else tensors[bias_name],
        format=opts.format,
    )


_CANONICAL_REQUIRED: Final = frozenset(
    {"w13_qdata", "w13_scale", "w2_qdata", "w2_scale"}
)
_CANONICAL_OPTIONAL: Final = frozenset(
    {
        "w13_zero_point",
        "w2_zero_point",
        "w13_bias",
        "w2_bias",
        "e_score_correction_bias",
        "gate_weight",
    }
)


def _canonical(
    src: _Source, prefix: str, base: str, rel: set[str], config: MoEConfig
) -> LoadedExperts:
    """An ``Int4MoE``'s own state under ``base`` (a replaced model's saved state).

    The scheme follows from the tensors: asymmetric where zero points are stored, the
    group size from the number of scale groups (one per row: ``-1``).

    Raises:
        ConfigError: for tensors int4-moe does not store there (``expert_map``: a
            shard of an expert-parallel layer is not a whole layer), or scale groups
            that give no supported group size.
    """
    extra = rel - _CANONICAL_REQUIRED - _CANONICAL_OPTIONAL
    if extra:
        raise ConfigError(
            f"unexpected tensors beside int4-moe's own under {base!r}: "
            f"{_listing(extra, base)}"
        )
    bias_name = _correction_bias_name(prefix, src.names)
    gate_name = _join(prefix, "gate.weight")
    router = [n for n in (gate_name, bias_name) if n is not None and n in src.names]
    tensors = src.read([base + n for n in rel] + router)
    t = {n: tensors[base + n] for n in rel}
    zero = t.get("w13_zero_point")
    scheme = Int4Scheme(
        mapping=Int4Mapping.SYMMETRIC if zero is None else Int4Mapping.ASYMMETRIC,
        group_size=_own_group_size(t, base),
    )
    weights = QuantizedExpertWeights.from_tensors(t, scheme)
    _check_sizes(weights, config)
    if gate_name in tensors and "gate_weight" in t:
        raise ConfigError(
            f"checkpoint must hold one router for {prefix!r}, got {gate_name!r} and "
            f"{base + 'gate_weight'!r}"
        )
    bias = (
        tensors[bias_name]
        if bias_name is not None
        else t.get("e_score_correction_bias")
    )
    return LoadedExperts(
        weights=weights,
        gate_weight=tensors.get(gate_name, t.get("gate_weight")),
        e_score_correction_bias=bias,
        format="int4-moe",
    )


def _own_group_size(t: Mapping[str, torch.Tensor], base: str) -> int:
    """The group size of int4-moe's own tensors, from both scales' group counts.

    Each projection's K is its codes' (two a byte). ``-1`` only when both hold one
    group a row: with ``G = hidden_size`` and a larger ``intermediate_size``, w13 has
    one group a row and w2 several.
    """
    found: dict[str, tuple[int, int]] = {}  # scale name: (K, groups)
    for proj in ("w13", "w2"):
        name = f"{proj}_scale"
        k = 2 * int(t[f"{proj}_qdata"].shape[-1])
        groups = int(t[name].shape[-1]) if t[name].ndim else 0
        if groups < 1 or k % groups:
            raise ConfigError(
                f"{base}{name} must hold a number of groups dividing its K={k}, "
                f"got {groups}"
            )
        found[name] = (k, groups)
    (k13, g13), (k2, g2) = found["w13_scale"], found["w2_scale"]
    if g13 == g2 == 1:
        return -1
    if k13 // g13 != k2 // g2:
        raise ConfigError(
            f"{base}w13_scale and {base}w2_scale must share one group size, got "
            f"{k13}/{g13} and {k2}/{g2} columns a group"
        )
    return k13 // g13


def _correction_bias_name(prefix: str, names: frozenset[str]) -> str | None:
    """The name of the router's correction bias, if the checkpoint has one.

    On the gate (DeepSeek-V3) or on the block itself (MiniMax-M2); both raise.
    """
    found = [
        n
        for n in (
            _join(prefix, "gate.e_score_correction_bias"),
            _join(prefix, "e_score_correction_bias"),
        )
        if n in names
    ]
    if len(found) > 1:
        raise ConfigError(
            f"checkpoint must hold one e_score_correction_bias for {prefix!r}, got "
            f"{found}"
        )
    return found[0] if found else None


def _assemble(
    plan: dict[str, list[str]],
    opts: FormatOptions,
    tensors: Mapping[str, torch.Tensor],
    base: str,
) -> QuantizedExpertWeights:
    def role(name: str) -> Int4Projection:
        projections = []
        for key in plan[name]:
            local = {
                n[len(key) + 1 :]: t
                for n, t in tensors.items()
                if n.startswith(key + ".")
            }
            try:
                projections.append(import_projection(opts, local))
            except (ShapeError, DTypeError, ConfigError) as error:
                raise type(error)(f"{base}{key}: {error}") from error
        return (
            projections[0]
            if len(projections) == 1 and "." not in plan[name][0]
            else stack_projections(name, projections)
        )

    w13 = (
        role("gate_up")
        if "gate_up" in plan
        else concat_rows("w13", role("gate"), role("up"))
    )
    return assemble_experts(w13, role("down"))


def _check_sizes(weights: QuantizedExpertWeights, config: MoEConfig) -> None:
    got = (weights.num_experts, weights.hidden_size, weights.intermediate_size)
    want = (config.num_experts, config.hidden_size, config.intermediate_size)
    if got != want:
        raise ConfigError(
            "checkpoint experts have (num_experts, hidden_size, intermediate_size) = "
            f"{got}, but config says {want}"
        )


@overload
def from_checkpoint(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = ...,
    quantization_config: Mapping[str, object] | None = ...,
    backend: str = ...,
    device: torch.device | str = ...,
) -> Int4MoE: ...


@overload
def from_checkpoint(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = ...,
    quantization_config: Mapping[str, object] | None = ...,
    backend: str = ...,
    device: torch.device | str = ...,
    module_cls: type[_Layer],
) -> _Layer: ...


def from_checkpoint(
    source: Source,
    *,
    prefix: str,
    config: MoEConfig,
    format: str = "auto",
    quantization_config: Mapping[str, object] | None = None,
    backend: str = "auto",
    device: torch.device | str = "cpu",
    module_cls: type[Int4MoE] = Int4MoE,
) -> Int4MoE:
    """Build an :class:`Int4MoE` (or ``module_cls``) from a checkpoint layer.

    Arguments as :func:`load_experts`; ``backend`` as ``Int4MoE``. The router
    (``<prefix>.gate.weight``) and DeepSeek-V3's correction bias are loaded when present.
    ``module_cls.from_checkpoint`` (which this calls) keeps a subclass's type.
    """
    return module_cls.from_checkpoint(
        source,
        prefix=prefix,
        config=config,
        format=format,
        quantization_config=quantization_config,
        backend=backend,
        device=device,
    )
