"""A checkpoint's tensors: from safetensors files, folders of shards or state dicts.

Opens a source by name only (file headers; tensors are read on request) and reads the
``quantization_config`` beside it. Imports only core; safetensors is imported only when
files are read, and no other ``modules`` file is imported.
"""

import importlib.util
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, TypeAlias

import attrs
import torch

from core.errors import ConfigError, DeviceError
from core.validate import check_type

Source: TypeAlias = str | os.PathLike[str] | Mapping[str, torch.Tensor]
_INDEX = "model.safetensors.index.json"


@attrs.frozen(kw_only=True)
class OpenedSource:
    """Tensor names and a reader; files are opened only to read what is asked."""

    names: frozenset[str]
    read: Callable[[Iterable[str]], dict[str, torch.Tensor]]


def open_source(source: Source, device: torch.device | str) -> OpenedSource:
    """``source``'s tensor names, and a reader that loads tensors onto ``device``."""
    if isinstance(source, Mapping):
        tensors = source

        def read(names: Iterable[str]) -> dict[str, torch.Tensor]:
            for name in names:  # a state dict of numpy arrays type-checks as Any
                check_type(f"source[{name!r}]", tensors[name], torch.Tensor)
            return {n: tensors[n].to(device) for n in names}

        return OpenedSource(names=frozenset(tensors), read=read)
    return _files_source(_shard_map(Path(source)), str(device))


def checkpoint_names(source: Source) -> frozenset[str]:
    """The tensor names of a checkpoint (file headers only; no tensor is read)."""
    check_type("source", source, (str, os.PathLike, Mapping))
    return open_source(source, "cpu").names


def _shard_map(path: Path) -> dict[str, Path]:
    """Tensor name to the file holding it (headers only; no tensor is read)."""
    if importlib.util.find_spec("safetensors") is None:
        raise ImportError(
            "reading checkpoint files needs safetensors: pip install 'int4-moe[hf]' "
            "(or pass a state dict)"
        )

    if path.is_file():
        files = [path]
    elif (path / _INDEX).is_file():
        index = _read_json(path / _INDEX)
        weight_map = index.get("weight_map")
        want = (
            f"{path / _INDEX} must map tensor names to shard files under 'weight_map'"
        )
        if not isinstance(weight_map, dict):
            raise ConfigError(f"{want}, got {type(weight_map).__name__}")
        for name, file in weight_map.items():
            if not isinstance(file, str):
                raise ConfigError(f"{want}, got {name!r} mapped to {file!r}")
        return {name: path / file for name, file in weight_map.items()}
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"))
    else:
        files = []
    if not path.exists():
        raise ConfigError(
            f"source must be a .safetensors file or a folder of them, got {path}, "
            "which does not exist"
        )
    if not files:
        raise ConfigError(
            f"source must be a .safetensors file or a folder of them, got {path}"
        )
    out: dict[str, Path] = {}
    for file in files:
        with _opened(file, "cpu") as f:
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


def _opened(file: Path, device: str) -> Any:  # safetensors' handle
    """``safe_open(file)`` onto ``device``; what it refuses is named.

    A file whose header does not read (on the CPU too) is not safetensors: a
    ``ConfigError`` names it. A file that reads on the CPU but not onto ``device``
    is refused for the device: a ``DeviceError``.
    """
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(file, framework="pt", device=device)
    except SafetensorError as err:
        if device != "cpu":
            try:
                with safe_open(file, framework="pt", device="cpu"):
                    pass
            except SafetensorError:
                pass
            else:
                raise DeviceError(
                    f"device must be one safetensors loads onto, got {device!r}: {err}"
                ) from err
        raise ConfigError(
            f"checkpoint file {file} must be a safetensors file, got one it cannot "
            f"read: {err}"
        ) from err


def _read_json(file: Path) -> dict[str, Any]:
    """The JSON object in ``file``; a ConfigError naming the file if it is not one."""
    try:
        found = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"{file} must hold JSON, got text it cannot parse: {err}"
        ) from err
    if not isinstance(found, dict):
        raise ConfigError(f"{file} must hold a JSON object, got {type(found).__name__}")
    return found


def _files_source(shards: dict[str, Path], device: str) -> OpenedSource:
    def read(names: Iterable[str]) -> dict[str, torch.Tensor]:
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(shards[name], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for file, wanted in by_file.items():
            with _opened(file, device) as f:
                out.update({n: f.get_tensor(n) for n in wanted})
        return out

    return OpenedSource(names=frozenset(shards), read=read)


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
        found = _read_json(config).get("quantization_config")
        if isinstance(found, dict):
            return found
    for name, method in _OWN_CONFIG_FILES:
        own = folder / name
        if own.is_file():
            return {"quant_method": method, **_read_json(own)}
    return None


_OWN_CONFIG_FILES: Final = (
    ("quantize_config.json", "gptq"),
    ("quant_config.json", "awq"),
)
"""Quantizers' own config files, in the order they are looked for, and their method."""
