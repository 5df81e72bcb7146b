"""Int4MoE: the nn.Module facade. Holds int4 buffers; the math is in core and backends.

    [route_topk] -> [group by expert] -> [w13 GEMM + act(gate)*up] -> [w2 GEMM]
        -> [weighted combine]        (all but routing inside the chosen backend)

May import core and backends. Shape legend: ``T`` tokens, ``D`` hidden, ``E`` experts.
"""

import os
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import attrs
import torch

from backends.base import DeviceInfo, MoEBackend, PreparedExperts
from backends.registry import check_backend_name, is_known_backend, select_backend
from backends.triton import fused_router_for
from core.config import MoEConfig
from core.inputs import resolve_routing
from core.layout import CANONICAL_LAYOUT
from core.quantize import quantize_expert_weights
from core.scheme import INT4_SYM_G32, Int4Scheme
from core.validate import (
    check_activation_dtype,
    check_expert_weights,
    check_float_expert_weights,
    check_hidden_states,
    check_scheme,
    check_type,
)
from core.weights import QuantizedExpertWeights
from modules.backward import run_experts, wants_grad
from modules.buffers import check_optional_tensors, fitting_copy, local_experts
from modules.custom_op import STATE, describe_layer, forward_op, register_layer
from modules.layer_state import (
    Int4MoEState,
    _check_loaded_state as _check_loaded_state,  # layers pickled before the
    _invalidate_after_load as _invalidate_after_load,  # split name their hooks here
)
from modules.prepared import PreparedCache

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; torch needs this package


class Int4MoE(Int4MoEState):
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
        DeviceError: for a ``device`` torch does not parse or this machine lacks.
    """

    # The buffers and their annotations: ``Int4MoEState`` (modules/layer_state.py).
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
        device: torch.device | str | int | None = None,
        dtype: torch.dtype = torch.bfloat16,
        with_gate: bool = False,
        with_correction_bias: bool = False,
        num_local_experts: int | None = None,
    ) -> None:
        check_type("config", config, MoEConfig)
        check_type("scheme", scheme, Int4Scheme)
        check_scheme(scheme, config)
        check_activation_dtype("dtype", dtype)
        super().__init__(
            config,
            scheme,
            device=device,
            dtype=dtype,
            with_gate=with_gate,
            with_correction_bias=with_correction_bias,
            num_local_experts=num_local_experts,
        )
        self.check_topk_ids = True
        self.backend = backend  # checked against the buffers' device
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
        check_optional_tensors(
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
                scales (or expert biases) ``dtype`` cannot hold (e.g. 1e6 or 1e-8
                with fp16).
            BackendUnavailableError: for a backend name that is not registered.
        """
        check_type("config", config, MoEConfig)
        check_type("scheme", scheme, Int4Scheme)
        check_type("w13_weight", w13_weight, torch.Tensor)
        check_type("w2_weight", w2_weight, torch.Tensor)
        check_optional_tensors(w13_bias=w13_bias, w2_bias=w2_bias)
        check_scheme(scheme, config)
        check_float_expert_weights(w13_weight, w2_weight, config)
        if dtype is None:
            half = (torch.float16, torch.bfloat16)
            dtype = w13_weight.dtype if w13_weight.dtype in half else torch.bfloat16
        check_activation_dtype("dtype", dtype)
        weights = attrs.evolve(
            quantize_expert_weights(w13_weight, w2_weight, scheme, scale_dtype=dtype),
            w13_bias=fitting_copy("w13_bias", w13_bias, dtype),
            w2_bias=fitting_copy("w2_bias", w2_bias, dtype),
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
            ConfigError: on a format mismatch, missing / unexpected tensors or
                unreadable files (named); DeviceError for a device not present.

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

    # ------------------------------------------------------------------ state
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

    def extra_repr(self) -> str:
        """Sizes, scheme, group size, the scales' dtype, activation and backend.

        ``num_local_experts`` too where an ``expert_map`` shards the experts.
        """
        c = self.config
        chosen = self.backend_name
        backend = self.backend if chosen is None else f"{self.backend} -> {chosen}"
        # Never raises (print(model) must work on a layer missing a buffer).
        qdata = self._optional_buffer("w13_qdata")
        scales = self._optional_buffer("w13_scale")
        local = c.num_experts if qdata is None else int(qdata.shape[0])
        held = f", num_local_experts={local}" if local != c.num_experts else ""
        scale = "missing" if scales is None else scales.dtype
        return (
            f"num_experts={c.num_experts}{held}, top_k={c.top_k}, hidden_size="
            f"{c.hidden_size}, intermediate_size={c.intermediate_size}, scheme="
            f"{self.scheme.name}, group_size={self.scheme.group_size}, scale_dtype="
            f"{str(scale).removeprefix('torch.')}, activation={c.activation}, "
            f"backend={backend}"
        )
