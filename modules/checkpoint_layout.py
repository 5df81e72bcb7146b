"""How one MoE layer's tensors are named in a checkpoint, and which format they are in.

Plans the projection keys under ``<prefix>.experts.``, detects GPTQ / AWQ /
compressed-tensors from tensor names and shapes, and names missing or unexpected
tensors. Imports only core; no other ``modules`` file.
"""

import re
from collections.abc import Callable, Iterable
from typing import Final

import torch

from core.config import MoEConfig
from core.errors import ConfigError
from core.formats.options import SUFFIXES, FormatOptions, g_idx_required

NAMINGS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
"""Per-expert projection names: HF (gate, up, down) and Mixtral (w1, w3, w2)."""
_PER_EXPERT = re.compile(r"^(\d+)\.([^.]+)\.([^.]+)$")


def join_name(*parts: str) -> str:
    """The dotted name of the non-empty ``parts``."""
    return ".".join(p for p in parts if p)


def describe_missing_experts(base: str, names: Iterable[str]) -> str:
    """Why no experts were found under ``base``, with the prefixes that have some."""
    found = sorted({n.split(".experts.")[0] for n in names if ".experts." in n})
    where = (
        f"; experts are under the prefixes {found[:4]}"
        + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        if found
        else "; it has no `.experts.` tensors"
    )
    return f"no tensors under {base!r} in the checkpoint{where}"


def plan_projections(
    rel_names: set[str], num_experts: int, base: str = "experts."
) -> dict[str, list[str]]:
    """Role (`gate`, `up`, `gate_up`, `down`) to projection keys under ``base``.

    Raises:
        ConfigError: when per-expert tensors are numbered past ``num_experts`` (a
            checkpoint of more experts than the config says).
    """
    matches = [m for n in rel_names if (m := _PER_EXPERT.match(n))]
    held = {int(m.group(1)) for m in matches}
    if held and max(held) >= num_experts:
        raise ConfigError(
            f"config.num_experts must cover the checkpoint's experts, got "
            f"num_experts={num_experts} but {base!r} numbers experts up to "
            f"{max(held)} ({len(held)} held)"
        )
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


def detect_format(
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


def collect_names(
    opts: FormatOptions, plan: dict[str, list[str]], present: set[str], base: str
) -> list[str]:
    """The names to read for the projection keys of ``plan``, relative to ``base``.

    Raises:
        ConfigError: naming the missing tensors (and why, where act-order needs a
            ``g_idx``) or else the unexpected ones.
    """
    wanted: list[str] = []
    missing: list[str] = []
    for keys in plan.values():
        got, lost = _names_of(opts, keys, present)
        wanted += got
        missing += lost
    if missing:
        g_idx = g_idx_required(opts)
        lost_g_idx = g_idx and any(m.endswith(f".{g_idx[0]}") for m in missing)
        why = f" ({g_idx[1]})" if g_idx and lost_g_idx else ""
        raise ConfigError(
            f"missing {opts.format} tensors: {list_names(missing, base)}{why}"
        )
    extra = present - set(wanted)
    if extra:
        raise ConfigError(
            f"unexpected tensors under {base!r}: {list_names(extra, base)}"
        )
    return wanted


def list_names(names: Iterable[str], base: str) -> str:
    """The first ten ``names`` under ``base``, sorted, and how many more there are."""
    full = sorted(f"{base}{n}" for n in names)
    more = f" and {len(full) - 10} more" if len(full) > 10 else ""
    return ", ".join(full[:10]) + more


def correction_bias_name(prefix: str, names: frozenset[str]) -> str | None:
    """The name of the router's correction bias, if the checkpoint has one.

    On the gate (DeepSeek-V3) or on the block itself (MiniMax-M2); both raise.
    """
    found = [
        n
        for n in (
            join_name(prefix, "gate.e_score_correction_bias"),
            join_name(prefix, "e_score_correction_bias"),
        )
        if n in names
    ]
    if len(found) > 1:
        raise ConfigError(
            f"checkpoint must hold one e_score_correction_bias for {prefix!r}, got "
            f"{found}"
        )
    return found[0] if found else None
