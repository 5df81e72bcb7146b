"""Which compressed-tensors ``config_groups`` entry describes a checkpoint's experts.

A ``quantization_config`` may hold several groups (for example W8A16 attention and
W4A16 experts). compressed-tensors gives each module the group of its first matching
target, where exact module names come first, then ``re:`` regexes (matched with
``re.match`` on the module name), both in sorted order, then class names; a target
listed in two groups belongs to the later one; modules matched by ``ignore`` are not
quantized. The expert projections are linear layers, so the class names that match
them are :data:`LINEAR_CLASS_NAMES`. Pure; imports only the standard library and core.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Final

from core.errors import ConfigError

LINEAR_CLASS_NAMES: Final = ("Linear",)
"""Class-name targets that select an expert projection (compressed-tensors matches
``Linear`` against the module's class)."""

ConfigGroup = Mapping[str, object]


def strings_of(value: object) -> list[str]:
    """A ``targets`` / ``ignore`` entry as a list of strings (one string or a list)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    return []


def matches_name(module: str, target: str) -> bool:
    """Whether ``target`` names ``module``: exactly, or as a ``re:`` regex prefix match.

    Raises:
        ConfigError: for a ``re:`` target that is not a valid regular expression.
    """
    if not target.startswith("re:"):
        return target == module
    try:
        return re.match(target[3:], module) is not None
    except re.error as err:
        raise ConfigError(
            f"compressed-tensors target must be a valid `re:` regex, got {target!r} "
            f"({err})"
        ) from err


def matches_target(module: str, target: str) -> bool:
    """Whether ``target`` selects the expert projection ``module`` (name or class)."""
    return matches_name(module, target) or target in LINEAR_CLASS_NAMES


def group_of_module(module: str, groups: Mapping[str, ConfigGroup]) -> str | None:
    """The label of the group compressed-tensors gives ``module``, or ``None``."""
    by_target: dict[str, str] = {}
    for label, group in groups.items():
        for target in strings_of(group.get("targets")):
            by_target[target] = label  # a later group takes over a shared target
    ordered = sorted(by_target, key=lambda t: ("re:" in t, t))
    for target in ordered:
        if matches_name(module, target):
            return by_target[target]
    return next((by_target[t] for t in ordered if t in LINEAR_CLASS_NAMES), None)


def select_config_group(
    config: Mapping[str, object], *, module_names: Sequence[str] = ()
) -> tuple[str, ConfigGroup]:
    """The ``config_groups`` entry that quantizes the experts, and its label.

    With ``module_names`` (the expert projections' full module names), the group is
    the one compressed-tensors would give them; when none is targeted, or without
    names, it is the only group with 4-bit weights. Groups with identical ``weights``
    and ``format`` count as one.

    Raises:
        ConfigError: when there are no groups, ``ignore`` excludes an expert module,
            the experts follow groups with different weights, or several 4-bit groups
            could be the experts' (naming them).
    """
    raw = config.get("config_groups")
    groups = (
        {str(k): g for k, g in raw.items() if isinstance(g, Mapping)}
        if isinstance(raw, Mapping)
        else {}
    )
    if not groups:
        raise ConfigError(
            "compressed-tensors quantization_config config_groups must hold at least "
            f"one group, got {raw!r}"
        )
    ignore = strings_of(config.get("ignore"))
    for module in module_names:
        hit = next((t for t in ignore if matches_target(module, t)), None)
        if hit is not None:
            raise ConfigError(
                f"compressed-tensors quantization_config ignore entry {hit!r} leaves "
                f"the expert module {module!r} unquantized; its int4 tensors cannot "
                "be read"
            )
    targeted = sorted({g for m in module_names if (g := group_of_module(m, groups))})
    if targeted:
        return _one_group(targeted, groups, "target the expert modules")
    int4 = [label for label, g in groups.items() if _num_bits(g) == 4]
    if not int4:
        raise ConfigError(
            "compressed-tensors config_groups must have a group with 4-bit weights "
            f"for the experts, got groups {sorted(groups)} with num_bits "
            f"{[_num_bits(g) for g in groups.values()]}"
        )
    return _one_group(int4, groups, "have 4-bit weights and none targets the experts")


def _num_bits(group: ConfigGroup) -> object:
    weights = group.get("weights")
    return weights.get("num_bits") if isinstance(weights, Mapping) else None


def _one_group(
    labels: list[str], groups: Mapping[str, ConfigGroup], why: str
) -> tuple[str, ConfigGroup]:
    first = groups[labels[0]]
    same = all(
        groups[label].get("weights") == first.get("weights")
        and groups[label].get("format") == first.get("format")
        for label in labels
    )
    if not same:
        raise ConfigError(
            f"compressed-tensors config_groups {labels} all {why} but differ in their "
            "weights; the experts of one layer need one int4 scheme, so pass the "
            "quantization_config of their group alone"
        )
    return labels[0], first
