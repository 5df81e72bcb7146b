"""``torch.compile`` support: the layer's inference forward as one custom op.

Dynamo cannot trace the layer's routing objects (frozen attrs) nor every backend's
kernels, so a compiled inference graph calls the whole layer as ``int4_moe::forward``:
an opaque op whose fake implementation gives the output's shape and dtype. The graph
then has no break there, ``fullgraph=True`` can include the layer, and the CUDA-graph
modes of ``torch.compile`` can capture it with the rest of the model (the Triton
backends make no host synchronization).

The op is self-contained: its inputs are the layer's state tensors (``STATE``, in that
order, ``None`` where absent) and a JSON spec of its config, scheme and backend
(``describe_layer``), not a reference to the module. So what the graph passes is what
runs: ``torch.func.functional_call`` with other weights runs those weights, an in-graph edit
of a buffer is ordered before the op that reads it, ``torch.export`` keeps the weights
with the program, and identical layers share one compiled graph (equal specs, no guard
on which layer it is). At run time the op finds the live layer holding exactly those
tensors (``register_layer``; weak references, keeping no layer alive) and runs its
forward, so its prepared form is shared with eager calls. Tensors no live layer holds
(swapped in, or an exported program loaded elsewhere) get a layer of their own, built
around aliases of them without copying and dropped when any of them is freed
(``_SHADOWS``).

A captured CUDA graph replays the kernels it recorded, on the prepared form of that
moment: after loading, moving or editing weights, reset Dynamo and compile again.

Training (grad mode on, and the input or the routing requiring a gradient) keeps a
graph break instead: the op has no backward of its own; the eager layer's is
``modules/backward.py``.
"""

import json
import weakref
from typing import TYPE_CHECKING, Final

import attrs
import torch

from core.config import MoEConfig
from core.scheme import Int4Mapping, Int4Scheme
from modules.prepared import WEIGHT_BUFFERS, data_ptrs, versions

if TYPE_CHECKING:
    from modules.int4_moe import Int4MoE

STATE: Final = (*WEIGHT_BUFFERS, "gate_weight", "e_score_correction_bias", "expert_map")
"""The layer's state tensors, in the order the op takes them."""

_LAYERS: Final[weakref.WeakSet["Int4MoE"]] = weakref.WeakSet()
_OWNERS: Final[dict[int, weakref.ReferenceType["Int4MoE"]]] = {}
"""``id(w13_qdata)`` -> the live layer last found holding it (a hint: always checked;
cleared when it reaches ``_MAX_OWNERS`` entries)."""
_MAX_OWNERS: Final = 4096


@attrs.frozen(eq=False)
class _Shadow:
    """A layer built around tensors no live layer holds, and weak references to them.

    The layer holds aliases of the tensors (same memory, other tensor objects), so
    the entry keeps no tensor given to the op alive: when any of them is freed, a
    weak reference's callback drops the entry, and with it the memory.
    """

    state: tuple["weakref.ReferenceType[torch.Tensor] | None", ...]
    data_ptrs: tuple[int, ...]
    versions: tuple[int, ...]
    spec: str
    layer: "Int4MoE"
    token: object

    def serves(self, state: list[torch.Tensor | None], spec: str) -> bool:
        """Whether it was built from exactly ``state`` under ``spec``.

        The same tensors on the same memory, not edited in place since: ``t.data =
        ...``, ``copy_`` and ``load_state_dict`` into them are seen (version counters;
        inference tensors keep none). The layer copies the router's tensors, so an
        edit of those must build it again.
        """
        return (
            all(
                (r is None and t is None) or (r is not None and r() is t)
                for r, t in zip(self.state, state, strict=True)
            )
            and data_ptrs(state) == self.data_ptrs
            and versions(state) == self.versions
            and self.spec == spec
        )


_SHADOWS: Final[dict[tuple[int, ...], _Shadow]] = {}
"""The ids of the state tensors no live layer holds -> their shadow layer."""


def register_layer(layer: "Int4MoE") -> None:
    """Make ``layer`` findable by ``int4_moe::forward`` (held weakly)."""
    _LAYERS.add(layer)


def describe_layer(config: MoEConfig, scheme: Int4Scheme, backend: str) -> str:
    """The op's description of a layer: config, scheme and backend, as JSON."""
    return json.dumps(
        {
            "config": attrs.asdict(config),
            "scheme": {
                "mapping": scheme.mapping.value,
                "group_size": scheme.group_size,
            },
            "backend": backend,
        },
        sort_keys=True,
    )


def _holds(layer: "Int4MoE", state: list[torch.Tensor | None], spec: str) -> bool:
    """Whether ``layer`` is described by ``spec`` and holds exactly ``state``.

    Identities first: cheap, and the first one fails for any other layer.
    """
    mine = layer.op_state()
    return (
        all(a is b for a, b in zip(mine, state, strict=True)) and layer.op_spec == spec
    )


def _layer_for(state: list[torch.Tensor | None], spec: str) -> "Int4MoE":
    """The live layer holding ``state`` under ``spec``, else one built around it.

    Live layers come first, so a layer that takes over tensors a shadow was built for
    (``load_state_dict(assign=True)``) serves them with its own prepared form, and
    ``invalidate_prepared`` reaches it; the shadow is dropped then.
    """
    hint = id(state[0])
    ref = _OWNERS.get(hint)
    known = None if ref is None else ref()
    if known is not None and _holds(known, state, spec):
        return known
    key = tuple(id(t) for t in state)
    for layer in list(_LAYERS):
        if _holds(layer, state, spec):
            if len(_OWNERS) >= _MAX_OWNERS:
                _OWNERS.clear()
            _OWNERS[hint] = weakref.ref(layer)
            _SHADOWS.pop(key, None)
            return layer
    shadow = _SHADOWS.get(key)
    if shadow is not None and shadow.serves(state, spec):
        return shadow.layer
    return _shadow(key, state, spec).layer


def _shadow(
    key: tuple[int, ...], state: list[torch.Tensor | None], spec: str
) -> _Shadow:
    """A new shadow for ``state``, dropped when any of its tensors is freed."""
    layer = _build([None if t is None else t.detach() for t in state], spec)
    token = object()  # names this entry without referring to it: no reference cycle

    def drop(_: object) -> None:
        found = _SHADOWS.get(key)
        if found is not None and found.token is token:
            del _SHADOWS[key]  # the last reference: the layer and its aliases go now

    entry = _Shadow(
        state=tuple(None if t is None else weakref.ref(t, drop) for t in state),
        data_ptrs=data_ptrs(state),
        versions=versions(state),
        spec=spec,
        layer=layer,
        token=token,
    )
    _SHADOWS[key] = entry
    return entry


def _build(state: list[torch.Tensor | None], spec: str) -> "Int4MoE":
    """A layer around ``state`` (no copy), checked as ``from_quantized`` checks."""
    from core.weights import QuantizedExpertWeights
    from modules.int4_moe import Int4MoE  # it imports this module

    described = json.loads(spec)
    fields = dict(described["config"])
    if fields.get("num_expert_group") is None:
        # A group_score alone did nothing; specs exported before it was refused
        # may hold one.
        fields.pop("group_score", None)
    config = MoEConfig(**fields)
    scheme = Int4Scheme(
        mapping=Int4Mapping(described["scheme"]["mapping"]),
        group_size=described["scheme"]["group_size"],
    )
    t = dict(zip(STATE, state, strict=True))
    layer = Int4MoE.from_quantized(
        QuantizedExpertWeights.from_tensors(t, scheme),
        config=config,
        backend=described["backend"],
        gate_weight=t["gate_weight"],
        e_score_correction_bias=t["e_score_correction_bias"],
        expert_map=t["expert_map"],
    )
    _LAYERS.discard(layer)  # found through _SHADOWS only
    return layer


@torch.library.custom_op("int4_moe::forward", mutates_args=())
def forward_op(  # positional: the op's schema, which the compiled graphs call
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    state: list[torch.Tensor | None],
    spec: str,
) -> torch.Tensor:
    """The forward of the ``Int4MoE`` that ``state`` and ``spec`` describe, eagerly."""
    layer = _layer_for(state, spec)
    return layer.forward_eager(hidden_states, router_logits, topk_weights, topk_ids)


@forward_op.register_fake
def _forward_fake(  # positional: forward_op's schema
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    state: list[torch.Tensor | None],
    spec: str,
) -> torch.Tensor:
    """The output: ``hidden_states``'s shape, dtype and device, contiguous.

    Not ``empty_like``: that keeps a strided input's strides, which the real output
    (the backend's ``(T, D)`` rows reshaped) does not have.
    """
    del router_logits, topk_weights, topk_ids, state, spec
    return hidden_states.new_empty(hidden_states.shape)
