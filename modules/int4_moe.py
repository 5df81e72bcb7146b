"""Int4MoE: the nn.Module facade. Holds int4 buffers; the math is in core and backends.

    [route_topk] -> [group by expert] -> [w13 GEMM + act(gate)*up] -> [w2 GEMM]
        -> [weighted combine]        (all but routing inside the chosen backend)

May import core and backends. Shape legend: ``T`` tokens, ``D`` hidden, ``E`` experts.
"""

import math
import os
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch import nn

from backends.base import DeviceInfo, MoEBackend, PreparedExperts
from backends.registry import check_backend_name, is_known_backend, select_backend
from backends.triton import fused_router_for
from core.config import MoEConfig
from core.errors import ConfigError, DeviceError, DTypeError
from core.inputs import resolve_routing
from core.layout import CANONICAL_LAYOUT
from core.quantize import quantize_expert_weights
from core.scheme import INT4_SYM_G32, Int4Scheme
from core.validate import (
    ACTIVATION_DTYPES,
    check_activation_dtype,
    check_cast_fits,
    check_expert_weights,
    check_finite,
    check_float_expert_weights,
    check_hidden_states,
    check_loaded,
    check_scheme,
    check_shape,
    check_type,
)
from core.weights import QuantizedExpertWeights
from modules.backward import run_experts, wants_grad
from modules.buffers import (
    canonical_buffer_specs,
    check_expert_map,
    default_expert_map,
    expert_map_size,
    local_experts,
)
from modules.custom_op import STATE, describe_layer, forward_op, register_layer
from modules.prepared import PreparedCache, version

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; torch needs this package


class Int4MoE(nn.Module):
    """A Mixture-of-Experts layer whose experts are stored as int4 weights (W4A16).

    Buffers (the whole state): ``w13_qdata`` uint8 ``(E, 2F, D/2)``, ``w13_scale``
    ``(E, 2F, D/G)``, ``w13_zero_point`` (asymmetric only), ``w2_qdata`` ``(E, D, F/2)``,
    ``w2_scale`` ``(E, D, F/G)``, ``w2_zero_point``; optionally the float router
    ``gate_weight`` ``(E, D)`` (a parameter), ``e_score_correction_bias`` ``(E,)`` and
    ``expert_map`` ``(E,)`` (global to local expert id, ``-1`` for experts held
    elsewhere; then the int4 buffers hold ``num_local_experts`` experts).

    The backend is chosen on first use for the device and dtype of the input and its
    prepared form is cached; it is rebuilt after ``load_state_dict``, device or dtype
    moves, reassigning a weight buffer or setting ``backend``, and is never saved
    (``state_dict``, pickling and ``torch.save(module)`` leave it out).

    Args:
        config: layer sizes, routing and activation.
        scheme: int4 scheme of the experts.
        backend: `auto` or a registered backend name (``backends.available_backends()``);
            also settable later as ``moe.backend``, which is checked the same way.
        device: where to allocate the (empty) buffers.
        dtype: the scale (and expert bias) dtype, normally the activation dtype; the
            router ``gate_weight`` is float32 whatever it is.
        with_gate: allocate a float32 router ``gate_weight`` (a checkpoint's bf16 or
            fp16 router loads into it exactly).
        with_correction_bias: allocate ``e_score_correction_bias`` (DeepSeek-V3).
        num_local_experts: experts held here under expert parallelism (allocates
            ``expert_map``, at first the first ``num_local_experts`` experts and
            ``-1`` for the rest, until a map is loaded); ``None`` holds all
            ``config.num_experts``.

    Raises:
        BackendUnavailableError: for a backend name that is not registered.
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
    op_spec: str
    """The layer's config, scheme and backend as ``int4_moe::forward`` takes them."""
    check_topk_ids: bool
    """Range-check given ``topk_ids`` on every call (default ``True``).

    On CUDA the check is a few small kernels with no host sync (about 2-3 us a call
    in a replayed CUDA graph on an H200); set ``False`` only where the ids come from
    a top-k over this layer's experts, as ``replace_moe_blocks``' ``routing="model"``
    blocks do. An id out of range then reads outside the weights."""

    def __init__(
        self,
        config: MoEConfig,
        *,
        scheme: Int4Scheme = INT4_SYM_G32,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.bfloat16,
        with_gate: bool = False,
        with_correction_bias: bool = False,
        num_local_experts: int | None = None,
    ) -> None:
        super().__init__()
        check_type("config", config, MoEConfig)
        check_type("scheme", scheme, Int4Scheme)
        check_scheme(scheme, config)
        check_activation_dtype("dtype", dtype)
        self.config = config
        self.scheme = scheme
        self._prepared: PreparedCache | None = None
        self.check_topk_ids = True
        # The expert_map last checked, its memory and its version counter.
        self._checked_map: tuple[torch.Tensor, int, int] | None = None
        local = expert_map_size(config, num_local_experts)
        specs = canonical_buffer_specs(config, scheme, local, dtype)
        for name in (*_CODE_BUFFERS, *_FLOAT_BUFFERS):  # absent ones read as None
            spec = specs.get(name)
            self.register_buffer(
                name, None if spec is None else _unloaded(*spec, device)
            )
        e, d = config.num_experts, config.hidden_size
        self.gate_weight = (  # float32: the top-k is sensitive to router rounding
            nn.Parameter(_unloaded((e, d), torch.float32, device), requires_grad=False)
            if with_gate
            else None
        )
        bias = _unloaded((e,), torch.float32, device)
        self.register_buffer(
            "e_score_correction_bias", bias if with_correction_bias else None
        )
        emap = (
            None if num_local_experts is None else default_expert_map(e, local, device)
        )
        self.register_buffer("expert_map", emap)
        self._absent_buffers_last()
        self.backend = backend  # checked against the buffers' device
        # torch leaves these public hook APIs unannotated.
        self.register_load_state_dict_pre_hook(_check_loaded_state)  # type: ignore[no-untyped-call]
        self.register_load_state_dict_post_hook(_invalidate_after_load)  # type: ignore[no-untyped-call]
        register_layer(self)  # findable by the compiled graphs' op, once whole

    if TYPE_CHECKING:

        def __call__(
            self,
            hidden_states: torch.Tensor,
            router_logits: torch.Tensor | None = None,
            *,
            topk_weights: torch.Tensor | None = None,
            topk_ids: torch.Tensor | None = None,
        ) -> torch.Tensor:
            """Typed twin of ``forward`` so strict mypy sees ``Tensor``."""
            ...

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_quantized(
        cls,
        weights: QuantizedExpertWeights,
        *,
        config: MoEConfig,
        backend: str = "auto",
        gate_weight: torch.Tensor | None = None,
        e_score_correction_bias: torch.Tensor | None = None,
        expert_map: torch.Tensor | None = None,
    ) -> "Self":
        """Wrap weights already in the canonical layout, without copying them.

        Args:
            weights: canonical int4 experts; the buffers become these very tensors.
            config: layer configuration (``num_experts`` is global under EP).
            backend: `auto` or a registered backend name.
            gate_weight: optional float router ``(E, D)``, kept in float32.
            e_score_correction_bias: optional ``(E,)`` selection bias.
            expert_map: optional ``(E,)`` integer global-to-local map, ``-1`` elsewhere.

        Raises:
            ShapeError, DTypeError, DeviceError, ConfigError: on malformed input.
            BackendUnavailableError: for a backend name that is not registered
                (reported for the weights' device).
        """
        check_type("weights", weights, QuantizedExpertWeights)
        check_type("config", config, MoEConfig)
        _check_optional_tensors(
            gate_weight=gate_weight,
            e_score_correction_bias=e_score_correction_bias,
            expert_map=expert_map,
        )
        local = local_experts(config, weights, expert_map)
        check_expert_weights(weights, config, num_experts=local)
        module = cls(
            config,
            scheme=weights.scheme,
            device="meta",
            dtype=weights.scale_dtype,
            with_gate=gate_weight is not None,
            with_correction_bias=e_score_correction_bias is not None,
            num_local_experts=local if expert_map is not None else None,
        )
        module._adopt(weights, gate_weight, e_score_correction_bias, expert_map)
        module.backend = backend  # checked on the weights' device, not meta
        return module

    @classmethod
    def from_float(
        cls,
        *,
        w13_weight: torch.Tensor,
        w2_weight: torch.Tensor,
        config: MoEConfig,
        scheme: Int4Scheme = INT4_SYM_G32,
        backend: str = "auto",
        gate_weight: torch.Tensor | None = None,
        e_score_correction_bias: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> "Self":
        """Quantize float experts (round to nearest) and build the module.

        Args:
            w13_weight: ``(E, 2F, D)``: gate rows ``[0:F]``, up rows ``[F:2F]``.
            w2_weight: ``(E, D, F)``.
            config: layer configuration.
            scheme: int4 scheme.
            backend: `auto` or a registered backend name.
            gate_weight: optional ``(E, D)`` router, kept in float32 (as every
                ``Int4MoE`` router: exact for bf16/fp16 ones).
            e_score_correction_bias: optional ``(E,)`` DeepSeek-style selection bias.
            dtype: dtype of the scales and expert biases (inputs of any float dtype
                are accepted); defaults to ``w13_weight.dtype`` when that is fp16 or
                bf16, else bf16.
            w13_bias: ``(E, 2F)`` expert biases of w13 (needs ``config.expert_bias``).
            w2_bias: ``(E, D)`` expert biases of w2 (needs ``config.expert_bias``).

        Raises:
            ShapeError: on wrong shapes, NaN/inf weights, or weights whose group
                scales ``dtype`` cannot hold (e.g. 1e6 or 1e-8 with fp16).
            BackendUnavailableError: for a backend name that is not registered.
        """
        check_type("config", config, MoEConfig)
        check_type("scheme", scheme, Int4Scheme)
        check_type("w13_weight", w13_weight, torch.Tensor)
        check_type("w2_weight", w2_weight, torch.Tensor)
        _check_optional_tensors(w13_bias=w13_bias, w2_bias=w2_bias)
        check_scheme(scheme, config)
        check_float_expert_weights(w13_weight, w2_weight, config)
        if dtype is None:
            half = (torch.float16, torch.bfloat16)
            dtype = w13_weight.dtype if w13_weight.dtype in half else torch.bfloat16
        check_activation_dtype("dtype", dtype)
        weights = attrs.evolve(
            quantize_expert_weights(w13_weight, w2_weight, scheme, scale_dtype=dtype),
            w13_bias=None if w13_bias is None else _frozen(w13_bias, dtype),
            w2_bias=None if w2_bias is None else _frozen(w2_bias, dtype),
        )
        return cls.from_quantized(
            weights,
            config=config,
            backend=backend,
            gate_weight=gate_weight,
            e_score_correction_bias=e_score_correction_bias,
        )

    @classmethod
    def from_checkpoint(
        cls,
        source: "str | os.PathLike[str] | Mapping[str, torch.Tensor]",
        *,
        prefix: str,
        config: MoEConfig,
        format: str = "auto",
        quantization_config: Mapping[str, object] | None = None,
        backend: str = "auto",
        device: torch.device | str = "cpu",
    ) -> "Self":
        """Read one MoE layer from GPTQ, AWQ or compressed-tensors files or a state dict.

        Args:
            source: a safetensors file, a folder of shards (with or without
                ``model.safetensors.index.json``), or an in-memory state dict.
            prefix: the layer's tensor-name prefix, e.g.
                ``model.layers.0.block_sparse_moe``.
            config: layer configuration; sizes must match the checkpoint.
            format: `auto` detects it from ``quantization_config`` and tensor names;
                or `gptq`, `awq`, `compressed-tensors` (case and ``_``/``-`` ignored;
                anything else raises ``ConfigError``).
            quantization_config: the model's ``quantization_config``; read from the
                ``config.json`` beside the files when not given.
            backend: `auto` or a registered backend name.
            device: where the tensors are loaded.

        Raises:
            ConfigError: on a format mismatch or missing / unexpected tensors (named).

        See ``modules.checkpoint.load_experts``; only this layer's tensors are read.
        """
        from modules.checkpoint import load_experts  # it imports this module

        loaded = load_experts(
            source,
            prefix=prefix,
            config=config,
            format=format,
            quantization_config=quantization_config,
            device=device,
        )
        return cls.from_quantized(
            loaded.weights,
            config=config,
            backend=backend,
            gate_weight=loaded.gate_weight,
            e_score_correction_bias=loaded.e_score_correction_bias,
        )

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
            self.gate_weight = nn.Parameter(
                _frozen(gate_weight, torch.float32, device), requires_grad=False
            )
        if correction_bias is not None:
            check_shape("e_score_correction_bias", correction_bias, (e,))
            check_finite("e_score_correction_bias", correction_bias, allow_meta=True)
            self.register_buffer(
                "e_score_correction_bias",
                _frozen(correction_bias, torch.float32, device),
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

    # ------------------------------------------------------------------ state
    @property
    def weights(self) -> QuantizedExpertWeights:
        """The canonical int4 weights (the buffers themselves, not copies)."""
        return QuantizedExpertWeights.from_tensors(self._buffers, self.scheme)

    def _buffer(self, name: str) -> torch.Tensor:
        tensor = self._optional_buffer(name)
        assert tensor is not None, name
        return tensor

    def _optional_buffer(self, name: str) -> torch.Tensor | None:
        tensor = self._buffers.get(name)
        return tensor

    @property
    def backend(self) -> str:
        """`auto` or the registered backend name asked for.

        Setting it checks the name (``BackendUnavailableError`` for an unknown one,
        with every backend's verdict on the weights' device) and drops the prepared
        form, so the next call selects again.
        """
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        if not is_known_backend(name):  # explain every backend's verdict, then raise
            scale = self._buffer("w13_scale")
            where = DeviceInfo.of(scale.device)
            check_backend_name(name, self.config, self.scheme, where, dtype=scale.dtype)
        self._backend = name
        self.op_spec = describe_layer(self.config, self.scheme, name)
        self.invalidate_prepared()

    @property
    def backend_name(self) -> str | None:
        """Name of the backend serving the last forward (``None`` before the first)."""
        return None if self._prepared is None else self._prepared.backend.name

    def invalidate_prepared(self) -> None:
        """Drop the backend's prepared form.

        In-place edits of buffers made under ``torch.inference_mode`` need it (they
        keep no version counter); other edits are seen without it.
        """
        self._prepared = None

    def __getstate__(self) -> dict[str, Any]:
        # Machine-specific and derived: pickles and copies prepare again.
        state = dict(self.__dict__)
        state["_prepared"] = None
        state["_checked_map"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled and deep-copied layers are findable too (``custom_op.py``)."""
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        if "op_spec" not in state:  # pickled before the op took a spec
            self.op_spec = describe_layer(self.config, self.scheme, self._backend)
        self._checked_map = None  # pickled before it existed, or dropped on pickling
        self.__dict__.setdefault("check_topk_ids", True)  # pickled before it existed
        register_layer(self)

    def op_state(self) -> list[torch.Tensor | None]:
        """The state tensors ``int4_moe::forward`` takes (``custom_op.STATE``)."""
        return [
            self.gate_weight if name == "gate_weight" else self._buffers.get(name)
            for name in STATE
        ]

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None = None,
        *,
        topk_weights: torch.Tensor | None = None,
        topk_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Route and run the experts.

        Args:
            hidden_states: ``(..., D)`` in fp32, fp16 or bf16.
            router_logits: ``(..., E)`` logits; leave out when routing comes from
                ``topk_weights``/``topk_ids`` or from the module's ``gate_weight``.
            topk_weights: ``(..., K)`` routing weights computed elsewhere.
            topk_ids: ``(..., K)`` global expert ids matching ``topk_weights``.

        Returns:
            ``(..., D)`` in the dtype of ``hidden_states``.

        One prepared form is cached, for the input device and the dtypes it serves
        (``PreparedExperts.serves``): a call in a dtype it does not serve prepares
        again and replaces it. The input and the router weights get
        gradients where autograd asks (``modules/backward.py``; the experts are frozen).
        Under ``torch.compile`` an inference graph holds the layer as one custom op
        (``modules/custom_op.py``); where a gradient is wanted it runs behind a break.
        """
        check_type("hidden_states", hidden_states, torch.Tensor)
        for name, given in (
            ("router_logits", router_logits),
            ("topk_weights", topk_weights),
            ("topk_ids", topk_ids),
        ):
            if given is not None:
                check_type(name, given, torch.Tensor)
        if torch.compiler.is_compiling():
            # Dynamo cannot trace the attrs Routing nor every backend's kernels.
            if not wants_grad(
                hidden_states, router_logits, topk_weights, self.gate_weight
            ):
                out: torch.Tensor = forward_op(
                    hidden_states, router_logits, topk_weights, topk_ids,
                    self.op_state(), self.op_spec,
                )  # fmt: skip
                return out
            # Made here, not at import: ``disable`` imports Dynamo (seconds).
            eager: Callable[..., torch.Tensor] = torch.compiler.disable(  # type: ignore[no-untyped-call]  # torch leaves disable unannotated
                Int4MoE.forward_eager
            )
            return eager(self, hidden_states, router_logits, topk_weights, topk_ids)
        return self.forward_eager(hidden_states, router_logits, topk_weights, topk_ids)

    def forward_eager(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        topk_weights: torch.Tensor | None,
        topk_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """``forward`` outside ``torch.compile`` (the custom op's body there).

        Autocast is turned off inside: the router and the reference backend promise
        float32 math, and the backends pick their own compute dtype.
        """
        device_type = hidden_states.device.type
        autocast_on = torch.amp.is_autocast_available(
            device_type
        ) and torch.is_autocast_enabled(device_type)
        with (
            torch.autocast(device_type, enabled=False) if autocast_on else nullcontext()
        ):
            check_hidden_states(hidden_states, self.config)
            self._check_device(hidden_states)
            hidden_TD = hidden_states.reshape(-1, self.config.hidden_size)
            routing = resolve_routing(
                hidden_TD,
                self.config,
                router_logits=router_logits,
                topk_weights=topk_weights,
                topk_ids=topk_ids,
                gate_weight=self.gate_weight,
                correction_bias=self._optional_buffer("e_score_correction_bias"),
                expert_map=self._optional_buffer("expert_map"),
                token_shape=tuple(hidden_states.shape[:-1]),
                check_topk_ids=self.check_topk_ids,
                router=fused_router_for(hidden_TD.device),
            )
            # Prepared (and so checked: NotLoadedError) even for 0 tokens.
            backend, prepared = self._ready(hidden_TD.dtype)
            if hidden_TD.shape[0] == 0 and not wants_grad(
                hidden_TD, routing.topk_weights
            ):
                # Contiguous, like every other output (and the custom op's fake).
                return hidden_states.new_empty(hidden_states.shape)
            out_TD = run_experts(backend, prepared, hidden_TD, routing)
            return out_TD.reshape(hidden_states.shape)

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

    def _ready(self, dtype: torch.dtype) -> tuple[MoEBackend, PreparedExperts]:
        qdata = self._buffer("w13_qdata")
        key = (qdata.device, dtype)
        cache = self._prepared
        self._check_map_if_new()
        if cache is not None and cache.is_current(key, self._buffers):
            return cache.backend, cache.prepared
        backend = select_backend(
            self.config,
            self.scheme,
            CANONICAL_LAYOUT,
            DeviceInfo.of(qdata.device),
            dtype=dtype,
            prefer=self.backend,
        )
        if (
            cache is not None
            and cache.backend.name == backend.name
            and cache.has_weights(qdata.device, self._buffers)
            and cache.prepared.serves(dtype)
        ):  # another dtype the same prepared form serves: no second prepare
            self._prepared = cache.serving(dtype)
            return cache.backend, cache.prepared
        prepared = backend.prepare(self._checked_weights(), self.config, dtype=dtype)
        if (
            torch._guards.detect_fake_mode() is None
        ):  # a fake one would poison later calls
            self._prepared = PreparedCache.from_buffers(
                self._buffers, key=key, backend=backend, prepared=prepared
            )
        return backend, prepared

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
        for name in _FLOAT_BUFFERS:
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
            for name in (*_FLOAT_BUFFERS, "e_score_correction_bias"):
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
                biases do not fit (values overflowing, or nonzero ones rounding to 0,
                as bf16 scales below fp16's range do under ``.half()``).
        """
        scale = self._buffer("w13_scale")
        for codes in (torch.uint8, torch.int64):  # int4 codes, zero points; expert_map
            moved = fn(torch.empty(0, dtype=codes, device=scale.device))
            if isinstance(moved, torch.Tensor) and moved.dtype != codes:
                raise DTypeError(
                    f"Int4MoE cannot be cast by a function that turns its {codes} "
                    f"buffers (int4 codes, zero points, expert_map) into {moved.dtype}, "
                    "as Module.type(dtype) does; use .to(dtype), .half() or "
                    ".bfloat16(), which cast only floating-point tensors (this layer "
                    "was not cast)"
                )
        probe = fn(torch.empty(0, dtype=scale.dtype, device=scale.device))
        if isinstance(probe, torch.Tensor) and probe.dtype != scale.dtype:
            if probe.dtype not in ACTIVATION_DTYPES:
                raise DTypeError(
                    f"Int4MoE cannot be cast to {probe.dtype}: its scales (w13_scale, "
                    "w2_scale) must stay float32, float16 or bfloat16; this layer was "
                    "not cast (modules cast before it in the same call were)"
                )
            for name in _FLOAT_BUFFERS:  # before anything moves
                tensor = self._optional_buffer(name)
                if tensor is not None:
                    check_cast_fits(
                        f"{name} (cast to {probe.dtype}; this layer was not cast)",
                        tensor,
                        probe.dtype,
                    )
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

    def extra_repr(self) -> str:
        """Sizes, scheme, group size, the scales' dtype, activation and backend.

        ``num_local_experts`` too where an ``expert_map`` shards the experts.
        """
        c = self.config
        chosen = self.backend_name
        backend = self.backend if chosen is None else f"{self.backend} -> {chosen}"
        local = int(self._buffer("w13_qdata").shape[0])
        held = f", num_local_experts={local}" if local != c.num_experts else ""
        scale = self._buffer("w13_scale").dtype
        return (
            f"num_experts={c.num_experts}{held}, top_k={c.top_k}, hidden_size="
            f"{c.hidden_size}, intermediate_size={c.intermediate_size}, scheme="
            f"{self.scheme.name}, group_size={self.scheme.group_size}, scale_dtype="
            f"{str(scale).removeprefix('torch.')}, activation={c.activation}, "
            f"backend={backend}"
        )


def _check_optional_tensors(**tensors: object) -> None:
    """Each named argument is a tensor or ``None``."""
    for name, tensor in tensors.items():
        if tensor is not None:
            check_type(name, tensor, torch.Tensor)


_CODE_BUFFERS = ("w13_qdata", "w2_qdata", "w13_zero_point", "w2_zero_point")
_FLOAT_BUFFERS = ("w13_scale", "w2_scale", "w13_bias", "w2_bias")


def _frozen(
    t: torch.Tensor, dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """A detached copy of ``t`` in ``dtype`` (on ``device``).

    No autograd history and no storage shared with the caller's tensor.
    """
    return t.detach().to(device=device or t.device, dtype=dtype, copy=True)


def _unloaded(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str | None
) -> torch.Tensor:
    """A buffer before loading: NaN where floating (``check_loaded`` tells), else empty.

    Int4 codes have no value that could mark them; a state loaded without them fails
    ``load_state_dict``'s strict key check, and one loaded ``strict=False`` without
    the scales fails ``check_loaded``.
    """
    if dtype.is_floating_point:
        return torch.full(shape, math.nan, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _check_loaded_state(
    module: nn.Module, state_dict: Mapping[str, Any], prefix: str, *_: object
) -> None:
    """Refuse loaded tensors that torch's copy into the buffers would garble.

    ``load_state_dict`` casts each tensor to its buffer's dtype: int32 codes would
    wrap into uint8 and large fp32 scales overflow fp16 to inf, silently. Also
    refuses an ``expert_map`` naming experts this module does not hold, and a state
    of another scheme (zero points present or not, scales of another group size: the
    state does not record its scheme), with or without ``strict`` (a zero point left
    out would be read as garbage). Torch hands its hooks ``strict=True`` whatever the
    caller asked, so router tensors this module lacks are left to its key report.
    """
    if not isinstance(module, Int4MoE):
        return
    _check_state_scheme(module, state_dict, prefix)
    for name in (*_CODE_BUFFERS, *_FLOAT_BUFFERS):
        loaded, buffer = state_dict.get(prefix + name), module._optional_buffer(name)
        if not isinstance(loaded, torch.Tensor) or buffer is None:
            continue  # torch reports missing and unexpected keys
        if name in _CODE_BUFFERS and loaded.dtype != torch.uint8:
            raise DTypeError(
                f"state_dict {prefix + name} must be uint8 (int4 codes, as saved), "
                f"got dtype {loaded.dtype}"
            )
        if name in _FLOAT_BUFFERS:  # torch's copy casts to the buffer's dtype
            check_cast_fits(f"state_dict {prefix + name}", loaded, buffer.dtype)
    emap = state_dict.get(prefix + "expert_map")
    if emap is None:
        return
    if module._optional_buffer("expert_map") is None:
        return  # torch reports the unexpected key
    check_expert_map(
        emap,
        num_experts=module.config.num_experts,
        num_local_experts=module._buffer("w13_qdata").shape[0],
    )


def _check_state_scheme(
    module: "Int4MoE", state_dict: Mapping[str, Any], prefix: str
) -> None:
    scheme = module.scheme
    if not isinstance(state_dict.get(prefix + "w13_qdata"), torch.Tensor):
        return  # not this layer's state (torch reports the missing keys)
    has_zero = isinstance(state_dict.get(prefix + "w13_zero_point"), torch.Tensor)
    if has_zero != scheme.has_zero_point:
        got = "has zero points" if has_zero else "has no zero points"
        kind = "asymmetric" if scheme.has_zero_point else "symmetric"
        raise ConfigError(
            f"state_dict must match this Int4MoE's {kind} scheme {scheme.name}, got "
            f"a state that {got} ({prefix}w13_zero_point): build the module with the "
            "scheme the state was saved with (Int4MoE(config, scheme=...))"
        )
    c = module.config
    for name in ("w13_qdata", "w2_qdata"):  # sizes first: a group count follows them
        loaded, buffer = state_dict.get(prefix + name), module._optional_buffer(name)
        if (
            isinstance(loaded, torch.Tensor)
            and buffer is not None
            and loaded.shape[-2:] != buffer.shape[-2:]
        ):
            raise ConfigError(
                f"state_dict {prefix}{name} must have rows x packed columns "
                f"{tuple(buffer.shape[-2:])} for this Int4MoE (hidden_size="
                f"{c.hidden_size}, intermediate_size={c.intermediate_size}), got "
                f"{tuple(loaded.shape[-2:])}: build the module with the config the "
                "state was saved with"
            )
    for name, size in (
        ("w13_scale", module.config.hidden_size),
        ("w2_scale", module.config.intermediate_size),
    ):
        loaded, buffer = state_dict.get(prefix + name), module._optional_buffer(name)
        if (
            isinstance(loaded, torch.Tensor)
            and buffer is not None
            and loaded.ndim == buffer.ndim
            and loaded.shape[:-1] == buffer.shape[:-1]
            and loaded.shape[-1] != buffer.shape[-1]
            and loaded.shape[-1] > 0
        ):
            groups = int(loaded.shape[-1])
            group = "-1 (one group per row)" if groups == 1 else str(size // groups)
            raise ConfigError(
                f"state_dict {prefix}{name} must have {buffer.shape[-1]} groups a row "
                f"for this Int4MoE's scheme {scheme.name} (group_size "
                f"{scheme.group_size}), got {groups}, as group_size {group} gives: "
                "build the module with the scheme the state was saved with"
            )


def _invalidate_after_load(module: nn.Module, incompatible: Any) -> None:
    del incompatible
    if isinstance(module, Int4MoE):
        module.invalidate_prepared()
        # load_state_dict(assign=True) takes the state's tensors as they are: frozen
        # here (a state tensor that required grad would make the int4 weights train).
        for name in (*_CODE_BUFFERS, *_FLOAT_BUFFERS, "e_score_correction_bias"):
            buffer = module._optional_buffer(name)
            if buffer is not None and buffer.requires_grad:
                module.register_buffer(name, buffer.detach())
        for name in ("gate_weight", "e_score_correction_bias"):
            tensor = getattr(module, name)
            if tensor is not None and tensor.dtype != torch.float32:
                tensor.data = tensor.detach().float()
