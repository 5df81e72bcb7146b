"""``torch.compile`` support: the layer's inference forward as one custom op.

Dynamo cannot trace the layer's routing objects (frozen attrs) nor every backend's
kernels, so a compiled inference graph calls the whole layer as ``int4_moe::forward``:
an opaque op whose fake implementation gives the output's shape and dtype. The graph
then has no break there, ``fullgraph=True`` can include the layer, and the CUDA-graph
modes of ``torch.compile`` can capture it with the rest of the model (the Triton
backends make no host synchronization). A captured graph replays the kernels it
recorded, on the prepared form of that moment (the op's inputs do not include the
layer's buffers, so nothing tells the graph they changed): after loading, moving or
editing weights, reset Dynamo and compile again.

A custom op takes tensors and numbers, not modules, so each layer registers itself
here under a number that the graph carries. The registry holds weak references (it
keeps no layer alive) and is, with the backend registry, the only module-level state
of the package.

Training (grad mode on, and the input or the routing requiring a gradient) keeps a
graph break instead: the op has no backward of its own; the eager layer's is
``modules/backward.py``.
"""

import itertools
import weakref
from typing import TYPE_CHECKING, Final

import torch

if TYPE_CHECKING:
    from modules.int4_moe import Int4MoE

_LAYERS: Final[weakref.WeakValueDictionary[int, "Int4MoE"]] = (
    weakref.WeakValueDictionary()
)
_NUMBERS: Final = itertools.count()


def register_layer(layer: "Int4MoE") -> int:
    """A fresh number naming ``layer`` for ``int4_moe::forward`` (held weakly)."""
    number = next(_NUMBERS)
    _LAYERS[number] = layer
    return number


@torch.library.custom_op("int4_moe::forward", mutates_args=())
def forward_op(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    layer: int,
) -> torch.Tensor:
    """The forward of the ``Int4MoE`` registered as ``layer``, run eagerly."""
    module = _LAYERS.get(layer)
    if module is None:
        msg = (
            f"int4_moe::forward: layer {layer} no longer exists (a compiled graph "
            "outlived the Int4MoE it was traced with)"
        )
        raise RuntimeError(msg)
    return module.forward_eager(hidden_states, router_logits, topk_weights, topk_ids)


@forward_op.register_fake
def _forward_fake(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    layer: int,
) -> torch.Tensor:
    """The output: ``hidden_states``'s shape, dtype and device, contiguous.

    Not ``empty_like``: that keeps a strided input's strides, which the real output
    (the backend's ``(T, D)`` rows reshaped) does not have.
    """
    del router_logits, topk_weights, topk_ids, layer
    return hidden_states.new_empty(hidden_states.shape)
