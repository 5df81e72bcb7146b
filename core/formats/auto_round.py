"""AutoRound's ``quantization_config`` as the GPTQ or AWQ config of its packing.

Pure: reads plain dicts (the ``config.json`` entry). Imports only the stdlib and core.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Final

from core.errors import ConfigError

_AUTO_ROUND_PACKINGS: Final = {
    "auto_round:auto_gptq": "gptq",
    "auto_round:auto_awq": "awq",
}
"""AutoRound ``packing_format`` values in GPTQ's or AWQ's tensor layout (the two vLLM
reads, as GPTQ v1 and AWQ GEMM)."""


def to_packing_config(
    config: Mapping[str, object], module_names: Sequence[str]
) -> dict[str, object]:
    """An AutoRound config as the GPTQ (v1) or AWQ config of its packing.

    The layout as vLLM reads it, with the ``extra_config`` entries of the expert
    modules applied by exact module name (a pattern key that matches an expert is
    refused: see :func:`_refuse_extra_patterns`).

    Raises:
        ConfigError: for a packing or data type that is not GPTQ's or AWQ's int
            layout, experts left out of ``block_name_to_quantize``, or
            ``extra_config`` entries that give expert modules different settings
            (an entry restating the base config is no difference).
    """
    packing = str(config.get("packing_format", "auto_round:auto_gptq"))
    layout = _AUTO_ROUND_PACKINGS.get(packing)
    if layout is None:
        raise ConfigError(
            "AutoRound packing_format must be one in GPTQ's or AWQ's layout "
            f"({', '.join(f'`{p}`' for p in _AUTO_ROUND_PACKINGS)}), got {packing!r}"
        )
    data_type = config.get("data_type", "int")
    if data_type != "int":
        raise ConfigError(f"AutoRound data_type must be `int`, got {data_type!r}")
    blocks = config.get("block_name_to_quantize", config.get("to_quant_block_names"))
    names = blocks.split(",") if isinstance(blocks, str) else blocks
    if isinstance(names, list) and module_names:
        outside = [m for m in module_names if not any(m.startswith(b) for b in names)]
        if outside:
            raise ConfigError(
                "AutoRound block_name_to_quantize must cover the expert modules, got "
                f"{names} without {outside[0]!r}"
            )
    extra = config.get("extra_config")
    entries = [
        dict(e) if isinstance(e := extra.get(m), Mapping) else {}
        for m in module_names
    ] if isinstance(extra, Mapping) else []  # fmt: skip
    if isinstance(extra, Mapping):
        _refuse_extra_patterns(extra, module_names)
    # Compared as the configs they give: an entry restating the base is no change.
    configs = [{**config, **e} for e in entries] or [dict(config)]
    odd = next((i for i, c in enumerate(configs) if c != configs[0]), None)
    if odd is not None:
        raise ConfigError(
            "AutoRound extra_config must give every expert module the same settings, "
            f"got {entries[0]} for {module_names[0]!r} and {entries[odd]} for "
            f"{module_names[odd]!r} over the base config"
        )
    merged = configs[0]
    sym = merged.get("sym", True)
    if layout == "gptq":
        return {
            "quant_method": "gptq",
            "bits": merged.get("bits"),
            "group_size": merged.get("group_size"),
            "sym": sym,
            "checkpoint_format": "gptq",
        }
    if sym is True:
        raise ConfigError(
            "AutoRound in AWQ's layout must be asymmetric (sym=false): symmetric AWQ "
            "has no zero points, which is not a layout read here"
        )
    return {
        "quant_method": "awq",
        "bits": merged.get("bits"),
        "group_size": merged.get("group_size"),
        "version": "gemm",
    }


def _refuse_extra_patterns(
    extra: Mapping[str, object], module_names: Sequence[str]
) -> None:
    """Refuse an ``extra_config`` key other than an expert's own name that matches one.

    Newer vLLM applies keys with regex characters as ``re.search`` patterns; only
    exact names are applied here, so a pattern (or a parent module's name) that
    reaches an expert is refused rather than ignored.
    """
    exact = set(module_names)
    for key in extra:
        if key in exact:
            continue
        try:
            hit = next((m for m in module_names if re.search(key, m)), None)
        except re.error:
            hit = None
        if hit is not None:
            raise ConfigError(
                "AutoRound extra_config must name the expert modules exactly, got "
                f"the key {key!r}, which matches {hit!r} as a pattern (patterns are "
                "not applied here: write the entries by module name)"
            )
