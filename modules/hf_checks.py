"""The checks ``replace_moe_blocks`` runs on a replacement before it is swapped in.

A block is replaced only where the original block, run on the same int4 experts,
gives what the replacement gives (``verify_block``), and where the block's own
experts, holding the dequantized int4 weights, compute what ``Int4MoE``'s do
(``verify_experts``). May import core, backends and modules.
"""

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from core.errors import BackendUnavailableError, ConfigError
from core.quantize import dequantize_expert
from core.weights import QuantizedExpertWeights
from modules.int4_moe import Int4MoE

if TYPE_CHECKING:
    from modules.hf_block import Int4SparseMoeBlock


def param(module: nn.Module, name: str) -> torch.Tensor:
    """``module.<name>``, detached, which must be a tensor (``ConfigError`` if not)."""
    value = getattr(module, name, None)
    if not isinstance(value, torch.Tensor):
        raise ConfigError(
            f"experts.{name} must be a tensor, got {type(value).__name__}"
        )
    return value.detach()


class _ProbeExperts(nn.Module):
    """A block's float experts' stand-in while ``verify_block`` runs the block.

    The int4 experts on the top-k the block hands them, in the block's call form
    (``experts(hidden, ids, weights)``, in any order or by keyword).
    """

    def __init__(self, experts: Int4MoE) -> None:
        super().__init__()
        self.int4 = experts

    def forward(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``(..., D)`` through the int4 experts on the given ids and weights."""
        given = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        ids = [t for t in given if not t.is_floating_point()]
        weights = [t for t in given if t.is_floating_point()]
        if len(ids) != 1 or len(weights) != 1 or len(given) != len(args) + len(kwargs):
            msg = (
                "the block must call its experts with the hidden states, the top-k "
                f"ids and their weights, got {len(args)} more arguments and keywords "
                f"{sorted(kwargs)}"
            )
            raise _ProbeError(msg)
        flat_TD = hidden.reshape(-1, hidden.shape[-1])
        ids_TK = ids[0].reshape(flat_TD.shape[0], -1)
        weights_TX = weights[0].reshape(flat_TD.shape[0], -1)
        if weights_TX.shape != ids_TK.shape:  # dense (T, E) scores: the chosen ones
            weights_TX = weights_TX.gather(1, ids_TK.long())
        out_TD = self.int4(flat_TD, topk_weights=weights_TX, topk_ids=ids_TK)
        return out_TD.reshape(hidden.shape)


class _ProbeError(Exception):
    """The block calls its experts in a way ``_ProbeExperts`` cannot stand in for."""


_PROBE_TOKENS = 16
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
"""Relative L2 difference allowed between a block and its replacement on the same
int4 experts: float rounding in another order (and, with ``routing="config"``, the
router's weights recomputed in float32); a dropped term or factor is far above."""


def _router_weight(new: "Int4SparseMoeBlock") -> torch.Tensor | None:
    """The router's first parameter, where it holds float values (not meta) to probe."""
    router = new.get_submodule(new.router_name)
    weight = next(iter(router.parameters()), None)
    if weight is None or weight.is_meta or not weight.is_floating_point():
        return None
    return weight


def verify_block(name: str, original: nn.Module, new: "Int4SparseMoeBlock") -> None:
    """Refuse ``new`` unless it computes what ``original`` does with the int4 experts.

    ``original`` runs on a few random tokens with its experts stood in for by the
    int4 ones (``_ProbeExperts``), in eval mode, against ``new``: whatever the
    original block does around its experts that ``Int4SparseMoeBlock`` does not (a
    shared expert under another name, a norm, a scaling factor, a routing input kept
    on the block) shows as a difference, or as an error in either. Skipped where the
    router holds no values yet (meta tensors).

    Raises:
        ConfigError: naming the block and the difference or the error.
    """
    weight = _router_weight(new)
    if weight is None:
        return
    # The hidden states' dtype is the float experts' (a router may be kept in fp32).
    dtype = param(original.get_submodule("experts"), "gate_up_proj").dtype
    gen = torch.Generator().manual_seed(0)
    d = new.experts.config.hidden_size
    x = torch.randn(1, _PROBE_TOKENS, d, generator=gen).to(weight.device, dtype)
    floats = original.get_submodule("experts")
    modes = {m: m.training for m in (*original.modules(), *new.modules())}
    try:
        original.experts = _ProbeExperts(new.experts)
        original.eval()
        new.eval()
        with torch.no_grad():
            want = _run(name, "its forward", original, x)
            got = _run(name, "the int4 block's forward", new, x)
    finally:
        original.experts = floats
        for module, mode in modes.items():
            module.training = mode
    children = sorted(n for n, _ in original.named_children())
    _compare(name, want, got, _PROBE_TOLERANCE.get(dtype, 2e-2), children)


_EXPERT_PROBE_SCALES = (1.0, 30.0)
"""Input scales of ``verify_experts``' probes: the larger drives the experts' inputs
where a softcap or clamp of the gate or up projection bends the activation."""


def verify_experts(
    name: str, original: nn.Module, new: "Int4SparseMoeBlock", *, model_type: str
) -> None:
    """Refuse ``new`` unless the block's own experts compute what ``Int4MoE``'s do.

    ``verify_block`` runs the block with the int4 experts standing in for its own, so
    it cannot see what the block's experts module computes. Here the original block
    runs its own experts holding the dequantized int4 weights (written into its
    parameters one expert at a time, the originals restored after), against ``new``
    on the ``reference`` backend (float32 math on the int4 weights):
    an expert activation other than the config's (a softcap, a clamp, a norm inside
    the expert) shows as a difference. Skipped where the router or the experts hold
    no values yet (meta tensors).

    Raises:
        ConfigError: naming the block, its experts' class and the difference.
    """
    weight = _router_weight(new)
    experts = original.get_submodule("experts")
    gate_up = getattr(experts, "gate_up_proj", None)
    down = getattr(experts, "down_proj", None)
    if (
        weight is None
        or not isinstance(gate_up, torch.Tensor)
        or not isinstance(down, torch.Tensor)
        or gate_up.is_meta
        or down.is_meta
    ):
        return
    int4 = new.experts.weights
    saved = (gate_up.detach().clone(), down.detach().clone())
    # float32 math on the int4 weights, whatever backend runs the layer later (a
    # 16-bit backend's roundings would hide a small difference in an fp32 model).
    chosen = new.experts.backend
    new.experts.backend = "reference"
    modes = {m: m.training for m in (*original.modules(), *new.modules())}
    try:
        with torch.no_grad():
            _write_dequantized_into(
                gate_up, down, int4, name=name, model_type=model_type
            )
            original.eval()
            new.eval()
            results = _run_expert_probes(
                name, original, new, device=weight.device, dtype=gate_up.dtype
            )
    finally:
        new.experts.backend = chosen
        with torch.no_grad():
            gate_up.copy_(saved[0])
            down.copy_(saved[1])
        for module, mode in modes.items():
            module.training = mode
    tolerance = _PROBE_TOLERANCE.get(gate_up.dtype, 2e-2)
    _check_expert_probes(name, new, experts, results, tolerance=tolerance)


def _write_dequantized_into(
    gate_up: torch.Tensor,
    down: torch.Tensor,
    int4: QuantizedExpertWeights,
    *,
    name: str,
    model_type: str,
) -> None:
    """Each dequantized int4 expert into the block's ``gate_up`` / ``down``, in place.

    Raises:
        ConfigError: naming the block, for experts of another layout than the int4.
    """
    for e in range(int(int4.w13_qdata.shape[0])):
        w13, w2 = dequantize_expert(int4, e)  # float32 (2F, D), (D, F)
        if model_type == "gpt_oss":  # (D, 2F) gate/up interleaved, (F, D)
            w13 = torch.stack(w13.t().chunk(2, dim=-1), dim=-1).flatten(-2)
            w2 = w2.t()
        if gate_up[e].shape != w13.shape or down[e].shape != w2.shape:
            raise ConfigError(
                f"MoE block {name!r} must hold experts of the layout its int4 "
                f"experts come from, got gate_up_proj {tuple(gate_up.shape)} "
                f"and down_proj {tuple(down.shape)} against {tuple(w13.shape)} "
                f"and {tuple(w2.shape)} an expert"
            )
        gate_up[e].copy_(w13)
        down[e].copy_(w2)


def _run_expert_probes(
    name: str,
    original: nn.Module,
    new: "Int4SparseMoeBlock",
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> list[tuple[float, object, object]]:
    """``(scale, want, got)``: both blocks on the same random tokens, at each scale."""
    gen = torch.Generator().manual_seed(1)
    d = new.experts.config.hidden_size
    results: list[tuple[float, object, object]] = []
    for scale in _EXPERT_PROBE_SCALES:
        x = torch.randn(1, _PROBE_TOKENS, d, generator=gen) * scale
        x = x.to(device, dtype)
        want = _run(name, "its forward", original, x)
        got = _run(name, "the int4 block's forward", new, x)
        results.append((scale, want, got))
    return results


def _check_expert_probes(
    name: str,
    new: "Int4SparseMoeBlock",
    experts: nn.Module,
    results: list[tuple[float, object, object]],
    *,
    tolerance: float,
) -> None:
    """Each probe's ``(scale, want, got)`` within ``tolerance`` (relative L2).

    Raises:
        ConfigError: naming the block, its experts' class and the difference.
    """
    for scale, want, got in results:
        diff = _relative_difference(want, got)
        if not diff <= tolerance:
            raise ConfigError(
                f"MoE block {name!r} must have experts that compute what Int4MoE's do "
                f"(down(act(gate) * up), activation {new.experts.config.activation!r}), "
                f"got {type(experts).__name__} differing by {diff:.3g} (relative L2, "
                f"at most {tolerance:g}) on the same dequantized int4 weights, inputs "
                f"of scale {scale:g}: its experts compute something else (a softcap "
                "or clamp of their projections, say)"
            )


def _relative_difference(want: object, got: object) -> float:
    """Relative L2 difference of two outputs' first tensors (a block's output)."""
    a = want[0] if isinstance(want, tuple) else want
    b = got[0] if isinstance(got, tuple) else got
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return 0.0
    return _rel_l2(a, b)


def _rel_l2(want: torch.Tensor, got: torch.Tensor) -> float:
    """``|got - want| / |want|`` (L2, in float32)."""
    return float(
        (got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)
    )


def _run(name: str, what: str, block: nn.Module, x: torch.Tensor) -> object:
    try:
        out: object = block(x)
    except BackendUnavailableError:  # the backend asked for, not the block's layout
        raise
    except Exception as err:  # any other failure means: not this layout
        raise ConfigError(
            f"MoE block {name!r} must run on the hidden states alone with int4 "
            f"experts, got {what} raising {type(err).__name__}: {err}"
        ) from err
    return out


def _compare(
    name: str, want: object, got: object, tolerance: float, children: list[str]
) -> None:
    """Outputs of the same structure and values within ``tolerance`` (relative L2)."""
    wants = list(want) if isinstance(want, tuple) else [want]
    gots = list(got) if isinstance(got, tuple) else [got]
    if len(wants) != len(gots):
        raise ConfigError(
            f"MoE block {name!r} must return what Int4SparseMoeBlock returns, got "
            f"{len(wants)} outputs against {len(gots)}"
        )
    for i, (a, b) in enumerate(zip(wants, gots, strict=True)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if a.shape != b.shape:
            raise ConfigError(
                f"MoE block {name!r} output {i} must have shape {tuple(b.shape)} "
                f"as in Int4SparseMoeBlock, got {tuple(a.shape)}"
            )
        diff = _rel_l2(a, b)
        if not diff <= tolerance:
            raise ConfigError(
                f"MoE block {name!r} must compute what Int4SparseMoeBlock computes "
                f"(router, experts, shared experts), got output {i} differing by "
                f"{diff:.3g} (relative L2, at most {tolerance:g}) on the same int4 "
                f"experts: its forward does more than that (its children: {children})"
            )
