"""MoEConfig: the static shape and routing description of one MoE layer.

Pure metadata (attrs, frozen, hashable). Imports only stdlib and attrs.
"""

import math
import operator
from numbers import Integral
from typing import Literal, SupportsIndex, TypeAlias

import attrs

from core.errors import ConfigError, ConfigTypeError

Activation: TypeAlias = Literal["silu", "gelu", "gelu_tanh", "swigluoai"]
ScoringFunc: TypeAlias = Literal["softmax", "sigmoid"]
GroupScore: TypeAlias = Literal["max", "top2_sum"]

ACTIVATIONS: tuple[Activation, ...] = ("silu", "gelu", "gelu_tanh", "swigluoai")
SCORING_FUNCS: tuple[ScoringFunc, ...] = ("softmax", "sigmoid")
GROUP_SCORES: tuple[GroupScore, ...] = ("max", "top2_sum")


def _to_int(value: SupportsIndex) -> SupportsIndex:
    """Converter: a non-bool integer of any type as an ``int``.

    ``numbers.Integral`` (``numpy.int64``, say) and anything else with ``__index__``,
    as the annotation promises (a 0-d integer tensor). Anything else (bool of any
    kind, float, str, a tensor of several values) comes through unchanged, for the
    validator to refuse by the field's name.
    """
    given: object = value  # untyped callers can pass anything
    if isinstance(given, bool) or "bool" in str(getattr(given, "dtype", "")):
        return value  # True, numpy.True_, torch.tensor(True)
    if isinstance(given, Integral):
        return int(given)
    try:
        return operator.index(given)  # type: ignore[arg-type]  # checked at runtime
    except TypeError:  # 2.0, "2", a float tensor
        return value


def _check_positive_int(name: str, value: object) -> None:
    # `type(...) is int`: bool is an int subclass, and 2.0 == 2 would pass a range check.
    if type(value) is not int:
        raise ConfigTypeError(
            f"{name} must be an int, got {type(value).__name__} {value!r}"
        )
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")


def _positive(_inst: object, attribute: "attrs.Attribute[int]", value: object) -> None:
    _check_positive_int(attribute.name, value)


def _optional_positive(
    _inst: object, attribute: "attrs.Attribute[int | None]", value: object
) -> None:
    if value is not None:
        _check_positive_int(attribute.name, value)


def _is_bool(_inst: object, attribute: "attrs.Attribute[bool]", value: object) -> None:
    if type(value) is not bool:
        raise ConfigTypeError(
            f"{attribute.name} must be a bool, got {type(value).__name__} {value!r}"
        )


def _one_of(allowed: tuple[str, ...]) -> "attrs._ValidatorType[str]":
    def check(_inst: object, attribute: "attrs.Attribute[str]", value: str) -> None:
        if value not in allowed:
            names = ", ".join(f"`{a}`" for a in allowed)
            raise ConfigError(f"{attribute.name} must be one of {names}, got {value!r}")

    return check


def _positive_float(
    _inst: object, attribute: "attrs.Attribute[float]", value: object
) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigTypeError(
            f"{attribute.name} must be a number, got {type(value).__name__} {value!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"{attribute.name} must be a finite positive number, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class MoEConfig:
    """One MoE layer: sizes, routing and activation.

    Attributes:
        num_experts: experts in the layer (``E``); with an ``expert_map`` the global count.
        top_k: experts per token (``K``).
        hidden_size: model dimension (``D``).
        intermediate_size: per-expert intermediate size (``F``); w13 has ``2F`` rows.
        renormalize: rescale the top-k weights to sum to one.
        scoring_func: `softmax` or `sigmoid` over the router logits.
        activation: `silu` (SwiGLU), `gelu`, `gelu_tanh` (both gated like SwiGLU) or
            `swigluoai` (gpt-oss; clamped, ``(up + 1) * gate * sigmoid(alpha * gate)``).
        num_expert_group: DeepSeek-style grouped top-k: number of expert groups.
        topk_group: DeepSeek-style grouped top-k: groups kept per token.
        group_score: how grouped top-k ranks a group: `top2_sum`, the sum of its two
            best scores (correction bias included; DeepSeek-V3), or `max`, its best
            score (DeepSeek-V2). ``None`` (the default): `top2_sum` with sigmoid
            scores, else `max` (``group_ranking`` is the resolved value). Given
            without ``num_expert_group`` it would do nothing, and is refused.
        routed_scaling_factor: multiplies the final top-k weights.
        apply_router_weight_on_input: scale the input by the router weight instead of the
            output (Llama-4 style; needs ``top_k == 1``).
        swiglu_alpha: ``alpha`` of `swigluoai`.
        swiglu_limit: clamp limit of `swigluoai`.
        expert_bias: the experts carry biases, ``w13_bias (E, 2F)`` added to the w13
            output and ``w2_bias (E, D)`` to the w2 output (gpt-oss).
    """

    num_experts: int = attrs.field(converter=_to_int, validator=_positive)
    top_k: int = attrs.field(converter=_to_int, validator=_positive)
    hidden_size: int = attrs.field(converter=_to_int, validator=_positive)
    intermediate_size: int = attrs.field(converter=_to_int, validator=_positive)
    renormalize: bool = attrs.field(default=True, validator=_is_bool)
    scoring_func: ScoringFunc = attrs.field(
        default="softmax", validator=_one_of(SCORING_FUNCS)
    )
    activation: Activation = attrs.field(default="silu", validator=_one_of(ACTIVATIONS))
    num_expert_group: int | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_to_int),
        validator=_optional_positive,
    )
    topk_group: int | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_to_int),
        validator=_optional_positive,
    )
    group_score: GroupScore | None = attrs.field(
        default=None, validator=attrs.validators.optional(_one_of(GROUP_SCORES))
    )
    routed_scaling_factor: float = attrs.field(default=1.0, validator=_positive_float)
    apply_router_weight_on_input: bool = attrs.field(default=False, validator=_is_bool)
    swiglu_alpha: float = attrs.field(default=1.702, validator=_positive_float)
    swiglu_limit: float = attrs.field(default=7.0, validator=_positive_float)
    expert_bias: bool = attrs.field(default=False, validator=_is_bool)

    def __attrs_post_init__(self) -> None:
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"top_k must be <= num_experts={self.num_experts}, got {self.top_k}"
            )
        if self.apply_router_weight_on_input and self.top_k != 1:
            raise ConfigError(
                f"apply_router_weight_on_input needs top_k=1, got top_k={self.top_k}"
            )
        self._check_grouping()

    def _check_grouping(self) -> None:
        groups, keep = self.num_expert_group, self.topk_group
        if (groups is None) != (keep is None):
            raise ConfigError(
                "num_expert_group and topk_group must be given together, got "
                f"num_expert_group={groups}, topk_group={keep}"
            )
        if groups is None or keep is None:
            if self.group_score is not None:  # it would have no effect
                raise ConfigError(
                    "group_score ranks expert groups and needs num_expert_group and "
                    f"topk_group, got group_score={self.group_score!r} without them"
                )
            return
        if self.num_experts % groups:
            raise ConfigError(
                f"num_expert_group must divide num_experts={self.num_experts}, got {groups}"
            )
        if keep > groups:
            raise ConfigError(
                f"topk_group must be <= num_expert_group={groups}, got {keep}"
            )
        if self.top_k > keep * (self.num_experts // groups):
            raise ConfigError(
                f"top_k={self.top_k} must be <= topk_group * experts per group = "
                f"{keep * (self.num_experts // groups)}"
            )

    @property
    def group_ranking(self) -> GroupScore:
        """``group_score``, or where ``None`` the one ``scoring_func`` implies."""
        if self.group_score is not None:
            return self.group_score
        return "top2_sum" if self.scoring_func == "sigmoid" else "max"

    @property
    def uses_grouped_topk(self) -> bool:
        """Whether DeepSeek-style grouped top-k is configured."""
        return self.num_expert_group is not None
