"""Int4MoEState: an Int4MoE's buffers, and what allocates, moves, casts or checks them.

``Int4MoE`` (modules/int4_moe.py) adds the constructors, the backend and forward.
May import core and modules (not modules.int4_moe). ``E`` experts, ``D`` hidden.
"""

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from core.config import MoEConfig
from core.errors import DeviceError, NotLoadedError
from core.scheme import Int4Scheme
from core.validate import (
    check_device,
    check_expert_weights,
    check_finite,
    check_loaded,
    check_shape,
)
from core.weights import QuantizedExpertWeights
from modules.buffers import (
    CODE_BUFFERS,
    FLOAT_BUFFERS,
    REQUIRED_BUFFERS,
    canonical_buffer_specs,
    check_expert_map,
    default_expert_map,
    expert_map_size,
    frozen_copy,
    unloaded_buffer,
)
from modules.casts import check_cast
from modules.prepared import PreparedCache, version
from modules.state_checks import check_loaded_state

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; torch needs this package


class Int4MoEState(nn.Module):
    """The state of an ``Int4MoE`` (its buffers, listed there) and its prepared form.

    Allocates the buffers (NaN where floating until loaded), adopts given weights,
    checks them before a backend reads them, refuses states and casts that would
    garble them, keeps the router float32 and drops the prepared form whenever the
    tensors it was built from may have changed.

    Args:
        config: layer sizes, routing and activation.
        scheme: int4 scheme of the experts.
        device: where to allocate the (empty) buffers.
        dtype: the scale (and expert bias) dtype.
        with_gate: allocate a float32 router ``gate_weight``.
        with_correction_bias: allocate ``e_score_correction_bias``.
        num_local_experts: experts held here (allocates ``expert_map``), or ``None``.
    """

    # What strict checkers see (nn.Module's __getattr__ says ``Tensor | Module``).
    # Zero points and expert biases hold tensors only where the scheme or config has
    # them, and read as ``None`` elsewhere (a ``None`` buffer: not in ``state_dict``).
    w13_qdata: torch.Tensor
    w13_scale: torch.Tensor
    w13_zero_point: torch.Tensor | None
    w2_qdata: torch.Tensor
    w2_scale: torch.Tensor
    w2_zero_point: torch.Tensor | None
    w13_bias: torch.Tensor | None
    w2_bias: torch.Tensor | None
    gate_weight: nn.Parameter | None
    e_score_correction_bias: torch.Tensor | None
    expert_map: torch.Tensor | None

    def __init__(
        self,
        config: MoEConfig,
        scheme: Int4Scheme,
        *,
        device: torch.device | str | int | None,
        dtype: torch.dtype,
        with_gate: bool,
        with_correction_bias: bool,
        num_local_experts: int | None,
    ) -> None:
        super().__init__()
        where = (
            None if device is None else check_device("device", device, allow_meta=True)
        )
        self.config = config
        self.scheme = scheme
        self._prepared: PreparedCache | None = None
        # The expert_map last checked, its memory and its version counter.
        self._checked_map: tuple[torch.Tensor, int, int] | None = None
        local = expert_map_size(config, num_local_experts)
        specs = canonical_buffer_specs(config, scheme, local, dtype)
        for name in (*CODE_BUFFERS, *FLOAT_BUFFERS):  # absent ones read as None
            spec = specs.get(name)
            self.register_buffer(
                name, None if spec is None else unloaded_buffer(*spec, where)
            )
        e, d = config.num_experts, config.hidden_size
        self.gate_weight = (  # float32: the top-k is sensitive to router rounding
            nn.Parameter(
                unloaded_buffer((e, d), torch.float32, where), requires_grad=False
            )
            if with_gate
            else None
        )
        bias = unloaded_buffer((e,), torch.float32, where)
        self.register_buffer(
            "e_score_correction_bias", bias if with_correction_bias else None
        )
        emap = (
            None if num_local_experts is None else default_expert_map(e, local, where)
        )
        self.register_buffer("expert_map", emap)
        self._absent_buffers_last()
        # torch leaves these public hook APIs unannotated.
        self.register_load_state_dict_pre_hook(_check_loaded_state)  # type: ignore[no-untyped-call]
        self.register_load_state_dict_post_hook(_invalidate_after_load)  # type: ignore[no-untyped-call]

    def _adopt(
        self,
        weights: QuantizedExpertWeights,
        gate_weight: torch.Tensor | None,
        correction_bias: torch.Tensor | None,
        expert_map: torch.Tensor | None,
    ) -> None:
        for name, tensor in weights.tensors().items():
            # the given tensor itself; detached (same storage) if it carries history
            self.register_buffer(
                name, tensor.detach() if tensor.requires_grad else tensor
            )
        device = weights.device
        e, d = self.config.num_experts, self.config.hidden_size
        if gate_weight is not None:  # copies: the caller's tensors stay theirs
            check_shape("gate_weight", gate_weight, (e, d))
            check_finite("gate_weight", gate_weight, allow_meta=True)
            _check_copyable("gate_weight", gate_weight, device)
            self.gate_weight = nn.Parameter(
                frozen_copy(gate_weight, torch.float32, device), requires_grad=False
            )
        if correction_bias is not None:
            check_shape("e_score_correction_bias", correction_bias, (e,))
            check_finite("e_score_correction_bias", correction_bias, allow_meta=True)
            _check_copyable("e_score_correction_bias", correction_bias, device)
            self.register_buffer(
                "e_score_correction_bias",
                frozen_copy(correction_bias, torch.float32, device),
            )
        if expert_map is not None:
            self.register_buffer(
                "expert_map", expert_map.to(device=device, dtype=torch.int32)
            )
        self._absent_buffers_last()

    def _absent_buffers_last(self) -> None:
        """Reorder ``_buffers``: the tensors first, the absent (``None``) ones after.

        ``torch.export``'s non-strict trace (torch 2.13) maps its buffer inputs by
        position among all of ``_buffers``, ``None`` entries counted, so a ``None``
        before a tensor shifted the map past the end (``IndexError``) when the layer
        with its own router was exported as the root module. State keys are unchanged.
        """
        ordered = sorted(self._buffers.items(), key=lambda item: item[1] is None)
        self._buffers.clear()
        self._buffers.update(ordered)

    @property
    def weights(self) -> QuantizedExpertWeights:
        """The canonical int4 weights (the buffers themselves, not copies).

        Raises:
            NotLoadedError: a code or scale buffer was set to ``None``, deleted or made
                an ``nn.Parameter`` (which torch moves out of the buffers).
        """
        for name in REQUIRED_BUFFERS:
            self._buffer(name)
        return QuantizedExpertWeights.from_tensors(self._buffers, self.scheme)

    def _buffer(self, name: str) -> torch.Tensor:
        """The buffer ``name``, which every layer holds (codes and scales).

        Raises:
            NotLoadedError: it was set to ``None``, deleted or made a parameter.
        """
        tensor = self._optional_buffer(name)
        if tensor is None:
            if name in self._parameters:
                how = (
                    "an nn.Parameter; Int4MoE keeps it as a buffer: del the parameter, "
                    f"then register_buffer({name!r}, tensor)"
                )
            elif name in self._buffers:
                how = f"None; assign the tensor back (layer.{name} = tensor)"
            else:
                how = f"none (deleted); register_buffer({name!r}, tensor) restores it"
            raise NotLoadedError(
                f"{name} must be a tensor buffer of Int4MoE, got {how}"
            )
        return tensor

    def _optional_buffer(self, name: str) -> torch.Tensor | None:
        tensor = self._buffers.get(name)
        return tensor

    @property
    def backend_name(self) -> str | None:
        """The backend of the prepared form that forwards run on.

        ``None`` until a forward prepares one; again after ``.to``, casts,
        ``load_state_dict``, ``invalidate_prepared`` or setting ``backend``.
        """
        return None if self._prepared is None else self._prepared.backend.name

    def invalidate_prepared(self) -> None:
        """Drop the backend's prepared form.

        In-place edits of buffers made under ``torch.inference_mode`` need it (they
        keep no version counter); other edits are seen without it.
        """
        self._prepared = None

    def _check_device(self, hidden_states: torch.Tensor) -> None:
        device = self._buffer("w13_qdata").device
        if device.type == "meta":
            raise DeviceError(
                "Int4MoE must hold its weights to run, got buffers on the meta device "
                "(materialize them first, for example with to_empty and load_state_dict)"
            )
        if hidden_states.device != device:
            raise DeviceError(
                f"hidden_states must be on the module's device {device}, "
                f"got {hidden_states.device}"
            )

    def _check_map_if_new(self) -> None:
        """Check ``expert_map`` when it is another tensor than the one last checked.

        The prepared form does not depend on the map, so replacing it (expert-parallel
        rebalancing) costs this check, not a prepare. A new tensor, new memory
        (``expert_map.data = ...``) and in-place edits (``expert_map[2] = 7``, seen by
        the tensor's version counter) are all seen.
        """
        emap = self._optional_buffer("expert_map")
        if emap is None:
            return
        mark = (emap, emap.data_ptr(), version(emap))
        seen = self._checked_map
        if seen is not None and seen[0] is emap and seen[1:] == mark[1:]:
            return
        check_expert_map(
            emap,
            num_experts=self.config.num_experts,
            num_local_experts=self._buffer("w13_qdata").shape[0],
        )
        self._checked_map = mark

    def _checked_weights(self) -> QuantizedExpertWeights:
        """The buffers as weights, checked before a backend reads them.

        Buffers may have been reassigned, loaded with ``strict=False`` or made by
        ``to_empty`` since they were last checked: a wrong shape would be read out of
        bounds by a kernel, and an uninitialized ``expert_map`` would route anywhere.
        Runs when the prepared form is rebuilt, not on every call.
        """
        weights = self.weights
        for name in FLOAT_BUFFERS:
            check_loaded(name, self._optional_buffer(name))
        check_loaded("gate_weight", self.gate_weight)
        check_loaded(
            "e_score_correction_bias", self._optional_buffer("e_score_correction_bias")
        )
        local = int(weights.w13_qdata.shape[0])
        check_expert_weights(weights, self.config, num_experts=local)
        for name, router in (
            ("gate_weight", self.gate_weight),
            (
                "e_score_correction_bias",
                self._optional_buffer("e_score_correction_bias"),
            ),
        ):
            if router is not None:
                check_finite(name, router.detach(), allow_meta=True)
        self._checked_map = None  # checked again, against these weights' expert count
        self._check_map_if_new()
        return weights

    def to_empty(
        self, *, device: torch.device | str | int | None, recurse: bool = True
    ) -> "Self":
        """``nn.Module.to_empty``, leaving the layer as a new one is.

        NaN in the floating buffers and the router (``NotLoadedError`` until loaded, as
        after construction) and the default ``expert_map``, not uninitialized memory
        that a partial load would leave read as weights.
        """
        super().to_empty(device=device, recurse=recurse)
        with torch.no_grad():
            for name in (*FLOAT_BUFFERS, "e_score_correction_bias"):
                tensor = self._optional_buffer(name)
                if tensor is not None:
                    tensor.fill_(math.nan)
            if self.gate_weight is not None:
                self.gate_weight.fill_(math.nan)
            emap = self._optional_buffer("expert_map")
            if emap is not None:
                local = int(self._buffer("w13_qdata").shape[0])
                emap.copy_(
                    default_expert_map(self.config.num_experts, local, emap.device)
                )
        self.invalidate_prepared()
        return self

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> "Self":  # noqa: FBT001, FBT002  # nn.Module's signature
        """``nn.Module._apply`` (``.to``, ``.half()``, ...), the router kept float32.

        A dtype cast would round the float32 router (and the correction bias), which
        moves tokens to other experts; they follow device moves only. The prepared
        form is dropped at once (it holds the old tensors).

        Raises:
            DTypeError: before anything moves, for a cast that would leave the scales
                in a dtype no backend reads (``.double()``), or that would convert the
                integer buffers (``.type(torch.float16)``).
            ShapeError: before anything moves, for a cast that scales or expert
                biases do not fit (values overflowing; for scales also nonzero ones
                rounding to 0, as bf16 scales below fp16's range do under
                ``.half()``).
        """
        check_cast(fn, self._buffers)  # raises before anything moves
        kept = {  # detached: a parameter's .data is swapped in place by _apply
            name: tensor.detach()
            for name, tensor in (
                ("gate_weight", self.gate_weight),
                (
                    "e_score_correction_bias",
                    self._optional_buffer("e_score_correction_bias"),
                ),
            )
            if tensor is not None
        }
        gate_grad = (  # detached too: _apply swaps the gradient's .data in place
            None
            if self.gate_weight is None or self.gate_weight.grad is None
            else self.gate_weight.grad.detach()
        )
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # torch leaves _apply unannotated
        for name, before in kept.items():
            after = getattr(self, name)
            if after.dtype != torch.float32:
                after.data = before.detach().to(
                    device=after.device, dtype=torch.float32
                )
        if self.gate_weight is not None and gate_grad is not None:
            # a trained router's gradient stays float32 too, the values from before
            # the cast (a round trip through fp16 would flush or overflow them)
            grad = self.gate_weight.grad
            if grad is not None and grad.dtype != torch.float32:
                self.gate_weight.grad = gate_grad.to(
                    device=grad.device, dtype=torch.float32
                )
        self._prepared = None
        return self


def _check_copyable(name: str, tensor: torch.Tensor, device: torch.device) -> None:
    """``tensor`` has values to copy onto the weights' ``device`` (or both are meta)."""
    if tensor.is_meta and device.type != "meta":
        raise DeviceError(
            f"{name} must hold values to copy beside the weights on {device}, got a "
            "tensor on the meta device"
        )


def _check_loaded_state(
    module: nn.Module, state_dict: Mapping[str, Any], prefix: str, *_: object
) -> None:
    """``load_state_dict``'s pre-hook: ``check_loaded_state`` on the layer's buffers."""
    if isinstance(module, Int4MoEState):
        check_loaded_state(
            module.config, module.scheme, module._buffers, state_dict, prefix
        )


def _invalidate_after_load(module: nn.Module, incompatible: Any) -> None:
    del incompatible
    if isinstance(module, Int4MoEState):
        module.invalidate_prepared()
        # load_state_dict(assign=True) takes the state's tensors as they are: frozen
        # here (a state tensor that required grad would make the int4 weights train).
        for name in (*CODE_BUFFERS, *FLOAT_BUFFERS, "e_score_correction_bias"):
            buffer = module._optional_buffer(name)
            if buffer is not None and buffer.requires_grad:
                module.register_buffer(name, buffer.detach())
        for name in ("gate_weight", "e_score_correction_bias"):
            tensor = getattr(module, name)
            if tensor is not None and tensor.dtype != torch.float32:
                tensor.data = tensor.detach().float()
