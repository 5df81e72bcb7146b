"""Compile, for sm_90 and without a GPU, every kernel launch ``fused_moe`` makes.

``python bench/compile_launches.py [--quick]`` runs ``fused_moe`` on CPU tensors with
every Triton and Gluon kernel of ``backends.triton`` replaced by a recorder and the
device checks (``ptx_target``, ``mma_target``, ``pdl_target``, ``tma_target``)
answering as on an H100/H200, so the launch code takes the paths and tiles it takes
there: the GEMV kernels with TMA and PDL, the Gluon decode GEMM with its rings, the
Triton GEMM on int32 words and on nibble halves, the alignment, the dequant prefill,
the split reductions, triton-emulation's 16-bit kernels; and fused routing
(``route_topk_fused``). Each distinct launch (a kernel, its argument types and its
meta-parameters) is then compiled with the installed Triton for
``GPUTarget("cuda", 90, 32)`` (Triton's wheel bundles ``ptxas``). A kernel that does not compile under this Triton (an API renamed between
releases, a layout it rejects) fails here, on a CPU, rather than in a user's first
forward on a GPU. It exits 1 if any launch fails to compile.

The weights are ``torch.empty`` (their pages are never touched: nothing reads them),
so real model shapes cost no memory. What it checks is that the kernels compile, not
what they compute or how fast: the GPU tests and the benchmark do that.
"""

# ruff: noqa: T201
# A command-line script: print is its output.

import contextlib
import importlib
import inspect
import os
import pkgutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # imported (tests/test_bench_scripts.py): leave it be
    os.environ["TRITON_INTERPRET"] = "0"  # the launch code as on a GPU (bf16 operands)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attrs
import torch

import backends.triton
from backends.triton._fused import fused_moe
from backends.triton._launch import ExpertMatrix
from backends.triton._route import route_topk_fused
from backends.triton._tiles import GemmTiles, MoETiles
from core.config import Activation, MoEConfig
from core.routing import Routing

TARGET_CAPABILITY = 90
_DTYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
    torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.int8: "i8",
}  # fmt: skip
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl", "maxnreg")


@attrs.frozen
class Launch:
    """One recorded ``kernel[grid](*args, **kwargs)``."""

    kernel: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _Recorder:
    """Stands in for a kernel: ``kernel[grid](...)`` records the launch."""

    def __init__(self, kernel: Any, launches: list[Launch]) -> None:
        self.kernel = kernel
        self.launches = launches

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.launches.append(Launch(self.kernel, args, kwargs))

        return record


def _is_kernel(value: object) -> bool:
    import triton

    return isinstance(value, triton.JITFunction) and value.fn.__name__.endswith(
        "_kernel"
    )


def install_recorders(launches: list[Launch]) -> None:
    """Kernels made recorders and device checks made an sm_90's.

    In every module of ``backends.triton``: the launch code imports both by name.
    """
    from backends.triton._launch import gluon_kernels

    gluon = gluon_kernels()  # before any kernel module is replaced below
    on_gpu: dict[str, Callable[..., Any]] = {
        "ptx_target": lambda a: True,
        "mma_target": lambda a: gluon,
        "pdl_target": lambda a: True,
        "tma_target": lambda a: True,
        "_capability": lambda device: TARGET_CAPABILITY // 10,
    }
    recorders: dict[int, _Recorder] = {}
    for info in pkgutil.iter_modules(backends.triton.__path__, "backends.triton."):
        try:
            module = importlib.import_module(info.name)
        except ImportError as error:  # the Gluon kernel before Triton 3.6
            print(f"not importable here, not launched: {info.name} ({error})")
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, _Recorder):  # installed by an earlier call: re-aim it
                value.launches = launches
            elif _is_kernel(value):
                recorder = recorders.setdefault(id(value), _Recorder(value, launches))
                setattr(module, name, recorder)
            elif name in on_gpu:
                setattr(module, name, on_gpu[name])


def _arg_type(value: object) -> str | None:
    """The Triton signature type of a runtime argument, or ``None`` for a constexpr."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, TensorDescriptor):
        block = ", ".join(str(b) for b in value.block_shape)
        return f"tensordesc<{_DTYPES[value.base.dtype]}[{block}]>"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def _aligned(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


def compile_launch(launch: Launch) -> tuple[str, Any]:
    """``(key, compiled kernel)``: the launch compiled for sm_90 by the installed Triton."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    kernel = launch.kernel
    params = list(inspect.signature(kernel.fn).parameters)
    constexpr = {p.name for p in kernel.params if p.is_constexpr}
    values = dict(zip(params, launch.args, strict=False))
    values |= {k: v for k, v in launch.kwargs.items() if k in params}
    options = {k: v for k, v in launch.kwargs.items() if k in _OPTIONS}
    unknown = set(launch.kwargs) - set(params) - set(_OPTIONS)
    if unknown:
        raise TypeError(f"{kernel.fn.__name__}: unknown launch keywords {unknown}")
    signature: dict[str, str] = {}
    constants: dict[str, object] = {}
    attrs_: dict[tuple[int, ...], list[list[object]]] = {}
    for i, name in enumerate(params):
        value = values[name]
        kind = None if name in constexpr else _arg_type(value)
        if kind is None:
            signature[name] = "constexpr"
            constants[name] = value
            continue
        signature[name] = kind
        if not kind.startswith("tensordesc") and _aligned(value):
            attrs_[(i,)] = [["tt.divisibility", 16]]
    gluon = type(kernel).__name__.startswith("Gluon")
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource

        source: Any = GluonASTSource(kernel, signature, constants, attrs_)
    else:
        by_index: dict[tuple[int, ...], object] = {
            (params.index(k),): v for k, v in constants.items()
        }
        source = ASTSource(kernel, signature, by_index, attrs_)
    key = repr(
        (
            kernel.fn.__name__,
            sorted(signature.items()),
            sorted(map(repr, constants.items())),
            sorted(options.items()),
        )
    )
    target = GPUTarget("cuda", TARGET_CAPABILITY, 32)
    return key, triton.compile(source, target=target, options=options)


@attrs.frozen
class Case:
    """One layer: sizes, scheme, options; run at each of ``tokens``."""

    e: int
    k: int
    d: int
    f: int
    tokens: tuple[int, ...]
    group: int = 128
    asym: bool = False
    dtype: torch.dtype = torch.bfloat16
    activation: Activation = "silu"
    on_input: bool = False
    bias: bool = False
    int4: bool = True
    tiles: MoETiles | None = None
    hopper: bool = True
    overlap: bool = False


def _matrix(c: "Case", rows: int, cols: int) -> ExpertMatrix:
    """One projection of every expert of ``c``, as ``torch.empty`` (never read)."""
    if not c.int4:
        return ExpertMatrix(data=torch.empty(c.e, rows, cols, dtype=c.dtype))
    g = cols if c.group == -1 else c.group
    return ExpertMatrix(
        data=torch.empty(c.e, rows, cols // 2, dtype=torch.uint8),
        scale=torch.empty(c.e, rows, cols // g, dtype=c.dtype),
        zero_point=(
            torch.empty(c.e, rows, cols // g, dtype=torch.uint8) if c.asym else None
        ),
        group_size=g,
        bias=torch.empty(c.e, rows, dtype=c.dtype) if c.bias else None,
    )


WGMMA = GemmTiles(
    block_n=128, block_k=128, num_warps=8, num_stages=1, swap_ab=True,
    int4_words=True, mma=True, wgmma=True,
)  # fmt: skip
"""The warpgroup kernel's tiles (``GemmTiles.wgmma``) in forms the table does not take
(it takes 64 x 128 on 4 warps in 32-row blocks, reached through the model cases):
compiled through explicit tiles, in 32-row blocks of 8 warps with a w2 split,
64-row ones on 4 warps, and 32-row ones on 4 warps with the words through a cp.async
ring (3 stages of one step for w13, 2 of 2-step groups for w2); then the input through
the ring too (``x_shared``: both GEMMs; w2 alone after an ``mma.sync`` w13)."""
WGMMA_TILES = (
    MoETiles(block_m=32, w13=WGMMA, w2=attrs.evolve(WGMMA, split_k=2), pdl=True),
    MoETiles(
        block_m=64,
        w13=attrs.evolve(WGMMA, block_n=64, num_warps=4),
        w2=attrs.evolve(WGMMA, block_n=64, num_warps=4),
    ),
    MoETiles(
        block_m=32,
        w13=attrs.evolve(WGMMA, block_n=64, num_warps=4, num_stages=3),
        w2=attrs.evolve(
            WGMMA, block_n=64, num_warps=4, num_stages=2, copy_steps=2, split_k=2
        ),
        pdl=True,
    ),
    MoETiles(  # the input through the ring in logical K order (x_shared), both GEMMs
        block_m=32,
        w13=attrs.evolve(
            WGMMA, block_n=64, num_warps=4, num_stages=3, copy_steps=2, x_shared=True
        ),
        w2=attrs.evolve(
            WGMMA, block_n=64, num_warps=4, num_stages=3, copy_steps=2, x_shared=True
        ),
        pdl=True,
    ),
    MoETiles(  # w2 alone, one-step groups, w13 on mma.sync writing it so
        block_m=16,
        w13=attrs.evolve(WGMMA, num_warps=4, num_stages=2, wgmma=False),
        w2=attrs.evolve(
            WGMMA, block_n=64, num_warps=4, num_stages=2, x_shared=True, split_k=2
        ),
    ),
)
REGISTERS = GemmTiles(
    block_n=128, block_k=128, num_warps=4, num_stages=1, swap_ab=True,
    int4_words=True, mma=True,
)  # fmt: skip
"""The ``mma.sync`` kernel without a ring (``num_stages`` 1: the words one step ahead in
registers), which the table does not take: its prologue allocates nothing, a form
Triton 3.6 once failed to compile (a helper returning ``None``) while 3.7 did."""
REGISTER_TILES = MoETiles(
    block_m=8, w13=REGISTERS, w2=attrs.evolve(REGISTERS, split_k=2)
)
MODEL_TOKENS = (1, 4, 16, 64, 300)
CASES = (
    # Mixtral-8x7B; 36: the warpgroup kernel's 16-row decode form; 2048: dequant
    Case(8, 2, 4096, 14336, (*MODEL_TOKENS, 36, 2048)),
    Case(128, 8, 2048, 768, (*MODEL_TOKENS, 1280)),  # Qwen3-30B-A3B; 1280: 80 pairs
    Case(256, 8, 7168, 2048, (1, 4, 16, 64, 288)),  # DeepSeek-V3
    Case(32, 4, 2880, 2880, (1, 5, 64), group=32, activation="swigluoai", bias=True),
    Case(
        16,
        1,
        512,
        256,
        (1, 5, 300, 4096),
        asym=True,
        on_input=True,
        dtype=torch.float16,
    ),
    Case(8, 2, 512, 384, (1, 37, 300), group=32, activation="gelu_tanh"),
    Case(8, 2, 512, 384, (1, 37), group=-1, asym=True, activation="gelu"),
    Case(8, 2, 100, 64, (1, 37), group=-1),  # K % 8 != 0: the byte kernels
    Case(8, 2, 96, 8, (1,), group=-1, asym=True),  # w2 groups of one word
    Case(8, 2, 4096, 14336, (1, 16, 300), int4=False),  # triton-emulation
    Case(128, 8, 2048, 768, (1, 16), int4=False, dtype=torch.float16),
    Case(8, 2, 4096, 14336, (64,), tiles=WGMMA_TILES[0]),
    Case(16, 1, 512, 256, (300,), asym=True, dtype=torch.float16, tiles=WGMMA_TILES[1]),
    Case(16, 4, 1536, 704, (5,), group=-1, asym=True, tiles=REGISTER_TILES),
    Case(8, 2, 4096, 14336, (64, 128), hopper=False),  # the rows the wgmma ones replace
    # the warpgroup kernel's async form: ringless tiles only (WGMMA_ASYNC)
    Case(8, 2, 4096, 14336, (64,), tiles=WGMMA_TILES[0], overlap=True),
    Case(8, 2, 4096, 14336, (64,), tiles=WGMMA_TILES[2]),  # its words' ring
    Case(8, 2, 4096, 14336, (64,), tiles=WGMMA_TILES[3]),  # and the input's
    Case(16, 1, 512, 256, (300,), asym=True, dtype=torch.float16, tiles=WGMMA_TILES[4]),
)
QUICK = tuple(CASES[i] for i in (1, 3, 4, 6, 8, 10, 12))  # every kernel, fewer forms
ROUTES = (  # route_topk_fused: Mixtral, Qwen3, DeepSeek-V3, Qwen3-Next, the most
    (MoEConfig(num_experts=8, top_k=2, hidden_size=8, intermediate_size=8), False),
    (
        MoEConfig(
            num_experts=128, top_k=8, hidden_size=8, intermediate_size=8,
            renormalize=False,
        ),
        False,
    ),
    (
        MoEConfig(
            num_experts=256, top_k=8, hidden_size=8, intermediate_size=8,
            scoring_func="sigmoid", num_expert_group=8, topk_group=4,
            routed_scaling_factor=2.5,
        ),
        True,
    ),
    (
        MoEConfig(num_experts=512, top_k=10, hidden_size=8, intermediate_size=8),
        False,
    ),  # Qwen3-Next
    (
        MoEConfig(num_experts=1024, top_k=8, hidden_size=8, intermediate_size=8),
        False,
    ),  # MAX_FUSED_EXPERTS
)  # fmt: skip
"""Routing configurations and whether they carry a correction bias."""


@contextlib.contextmanager
def _hopper_as(c: Case) -> Iterator[None]:
    """The case's Hopper answers for the duration of its forward.

    ``c.hopper`` False: the warpgroup kernel not importable (``gluon_hopper``), so the
    table and the launch take the rows and kernel of other sm_80+ GPUs; with
    ``c.overlap`` the warpgroup kernel's async form (``WGMMA_ASYNC``).
    """
    import backends.triton._launch as launch

    saved = launch.gluon_hopper, launch.WGMMA_ASYNC
    if not c.hopper:
        launch.gluon_hopper = lambda: False  # type: ignore[assignment]  # a stand-in
    launch.WGMMA_ASYNC = c.overlap
    try:
        yield
    finally:
        launch.gluon_hopper, launch.WGMMA_ASYNC = saved


def record(cases: tuple[Case, ...]) -> Iterator[Launch]:
    """The launches of every case at every token count (``install_recorders`` first)."""
    launches: list[Launch] = []
    install_recorders(launches)
    for c in cases:
        config = MoEConfig(
            num_experts=c.e, top_k=c.k, hidden_size=c.d, intermediate_size=c.f,
            activation=c.activation, apply_router_weight_on_input=c.on_input,
            expert_bias=c.bias,
        )  # fmt: skip
        w13 = _matrix(c, 2 * c.f, c.d)
        w2 = _matrix(c, c.d, c.f)
        for m in c.tokens:
            x = torch.empty(m, c.d, dtype=c.dtype)
            gen = torch.Generator().manual_seed(m)
            ids = torch.rand(m, c.e, generator=gen).topk(c.k).indices.to(torch.int32)
            weights = torch.full((m, c.k), 1.0 / c.k)
            routing = Routing(topk_weights=weights, topk_ids=ids)
            with _hopper_as(c):
                if c.tiles is None:
                    fused_moe(x, w13, w2, routing, config)
                else:
                    fused_moe(x, w13, w2, routing, config, tiles=c.tiles, path="gemm")
            yield from launches
            launches.clear()
    for route_config, biased in ROUTES:
        for m in (1, 64, 4096):
            bias = torch.empty(route_config.num_experts) if biased else None
            logits = torch.empty(m, route_config.num_experts)
            route_topk_fused(logits, route_config, correction_bias=bias)
            yield from launches
            launches.clear()


def main() -> int:
    """Record, compile, report; 1 if any launch failed to compile."""
    cases = QUICK if "--quick" in sys.argv[1:] else CASES
    import triton

    print(f"triton {triton.__version__}, sm_{TARGET_CAPABILITY}", flush=True)
    seen: set[str] = set()
    failed = 0
    for launch in record(cases):
        name = launch.kernel.fn.__name__
        start = time.perf_counter()
        try:
            key, _ = compile_launch(launch)
        except Exception as error:
            failed += 1
            last = "\n".join(traceback.format_exc().splitlines()[-6:])
            meta = {k: v for k, v in launch.kwargs.items() if not callable(v)}
            print(f"FAILED {name} {meta}: {type(error).__name__}\n{last}", flush=True)
            continue
        if key in seen:
            continue
        seen.add(key)
        print(f"ok {name} ({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{len(seen)} distinct launches compiled, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
