"""Typed host wrappers of the Triton kernels: one function per kernel launch.

The grouped GEMMs here, the activation of split partials and the top-k sum in
``_launch_reduce.py``, the decode GEMVs in ``_launch_gemv.py``, the prefill's
dequantization in ``_launch_dequant.py``; and what they ask of the device and the
weights. May import core; triton only inside functions. ``_fused.py``
composes these into the layer. Shape legend: ``T`` tokens, ``D`` hidden, ``F``
intermediate, ``E`` experts, ``K`` top_k, ``N`` = T*K routed pairs, ``S`` K-splits of
the w2 GEMM.
"""

import functools
import os
from collections.abc import Mapping
from typing import Final

import attrs
import torch

from backends.triton._align import BlockAlignment
from backends.triton._configs import (
    ceil_div,
)
from backends.triton._tiles import GemmTiles
from core.config import MoEConfig
from core.routing import Routing

ACTIVATION_CODE: Final[Mapping[str, int]] = {
    "silu": 0, "gelu": 1, "gelu_tanh": 2, "swigluoai": 3,
}  # fmt: skip
"""The kernels' ``ACT`` code of each ``MoEConfig.activation`` (``_kernels._activate``)."""


@attrs.frozen(kw_only=True, eq=False)
class ExpertMatrix:
    """One projection of every expert, as the B operand of a grouped GEMM.

    Attributes:
        data: uint8 ``(E, rows, cols/2)`` int4 codes (canonical layout) or 16-bit
            ``(E, rows, cols)`` weights.
        scale: ``(E, rows, cols/G)`` (int4 only).
        zero_point: uint8 ``(E, rows, cols/G)`` (asymmetric int4 only).
        group_size: effective group size ``G`` along ``cols`` (int4 only).
        bias: ``(E, rows)`` added to each expert's output rows (gpt-oss), or ``None``;
            its last dimension must be contiguous.
    """

    data: torch.Tensor
    scale: torch.Tensor | None = None
    zero_point: torch.Tensor | None = None
    group_size: int = 0
    bias: torch.Tensor | None = None

    def __attrs_post_init__(self) -> None:
        """The kernels read contiguous rows, and zero points with the scale's strides."""
        for name, t in (
            ("data", self.data),
            ("scale", self.scale),
            ("bias", self.bias),
        ):
            if t is not None and t.shape[-1] > 1 and t.stride(-1) != 1:
                msg = f"ExpertMatrix.{name} needs a contiguous last dimension, got strides {t.stride()}"
                raise ValueError(msg)
        zp, scale = self.zero_point, self.scale
        if zp is not None and (scale is None or _strides(zp) != _strides(scale)):
            got = None if scale is None else scale.stride()
            msg = f"ExpertMatrix.zero_point needs the scale's strides {got}, got {zp.stride()}"
            raise ValueError(msg)

    # The layout facts below are asked several times a forward (up to ten on the
    # decode GEMV path), so each is worked out once: the tensors a matrix holds keep
    # their dtype, strides and memory, which its construction checks assume too.
    @functools.cached_property
    def is_int4(self) -> bool:
        """Whether ``data`` holds packed int4 codes."""
        return self.data.dtype == torch.uint8

    @functools.cached_property
    def words_fit(self) -> bool:
        """``int4_words_fit``."""
        data = self.data
        return (
            self.is_int4
            and int(data.shape[2]) % 4 == 0
            and self.group_size % 8 == 0
            and data.stride(2) == 1
            and data.stride(1) % 4 == 0
            and data.stride(0) % 4 == 0
            and data.data_ptr() % 4 == 0
        )

    @functools.cached_property
    def descriptors(self) -> dict[tuple[int, int], object | None]:
        """Tensor descriptors of ``data`` built so far, by block (``_launch_gemv``).

        ``None`` for a block ``tma_fit`` refuses. Kept, as the facts above are:
        building one costs about 4 us a launch, and what it describes (the matrix's
        memory, shape and strides) stays the same.
        """
        return {}


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s strides over its dimensions longer than 1 (the others are never stepped)."""
    return tuple(st for st, n in zip(t.stride(), t.shape, strict=True) if n > 1)


_TRUE: Final = frozenset({"1", "true", "on", "yes", "y"})
"""``TRITON_INTERPRET`` values Triton reads as on (any case; Triton 3.7's knobs)."""


@functools.cache
def is_interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET`` on).

    Read once, as Triton reads it: ``1``, ``true``, ``on``, ``yes`` or ``y``, any case
    (an interpreter the launch code did not know of would get the compiled path's
    bf16 operands, which the interpreter computes wrongly).
    """
    return os.environ.get("TRITON_INTERPRET", "0").lower() in _TRUE


def pdl_target(a: torch.Tensor) -> bool:
    """Whether kernels on ``a``'s device may use programmatic dependent launch.

    CUDA devices of compute capability 9.0 or newer, not the interpreter.
    """
    return ptx_target(a) and _capability(a.device) >= 9


@functools.cache
def _capability(device: torch.device) -> int:
    return int(torch.cuda.get_device_capability(device)[0])


def tma_target(a: torch.Tensor) -> bool:
    """Whether kernels on ``a``'s device may read by tensor descriptors (TMA).

    CUDA devices of compute capability 9.0 or newer, and the CPU interpreter (which
    emulates them; there it tests the indexing). Not Intel's Triton: unvalidated.
    """
    if is_interpreting():
        return True
    return pdl_target(a)


def pdl_launch_options(*, on: bool) -> dict[str, bool]:
    """Launch options of a dependent kernel: ``launch_pdl`` only where it is on.

    Triton builds for other targets may not know the option.
    """
    return {"launch_pdl": True} if on else {}


def ptx_target(a: torch.Tensor) -> bool:
    """Whether kernels may use inline NVIDIA PTX: CUDA tensors, not the interpreter.

    Intel's Triton (XPU), ROCm (whose GPUs are torch's ``cuda`` too) and the CPU
    interpreter take the same bits by plain Triton ops; programmatic dependent launch
    and TMA (``pdl_target``, ``tma_target``) follow this answer.
    """
    return (
        a.device.type == "cuda" and torch.version.hip is None and not is_interpreting()
    )


def _operand_dtype(dtype: torch.dtype) -> object:
    import triton.language as tl

    if is_interpreting():
        return tl.float32  # the interpreter's bf16 math is wrong (triton#11584)
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def buffer_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the intermediate buffers: ``dtype``, float32 in the interpreter.

    The interpreter truncates float32 to bf16 on store instead of rounding, which
    doubles the error; there the buffers stay float32 and torch casts the output.
    """
    return torch.float32 if is_interpreting() else dtype


def launch_gemm(
    a_MK: torch.Tensor,
    b: ExpertMatrix,
    out: torch.Tensor,
    align: BlockAlignment,
    tiles: GemmTiles,
    *,
    n: int,
    routing: Routing,
    config: MoEConfig,
    gated: bool,
    experts: tuple[int, int],
    perm_out: int = 0,
    pdl: bool = False,
    logical: tuple[bool, bool] = (False, False),
) -> None:
    """Launch the grouped GEMM writing ``out`` ``(S, N, n)`` or ``(N, n)``.

    ``gated`` (w13) with ``tiles.split_k`` > 1 runs the GEMM ungated over all ``2n``
    rows and writes the float32 K-split partials ``out`` ``(S, N, 2n)`` of gate and
    up rows alike (router weights and bias applied as the gated GEMM applies them);
    ``launch_activate`` then sums them and applies the activation.

    ``_moe_gemm_kernel``, or with ``tiles.mma`` the Gluon ``_moe_gemm_mma_kernel``
    (same arguments) where words fit, ``mma_target`` holds and the row block is one of
    ``MMA_BLOCK_M``, and with ``tiles.wgmma`` on Hopper (``wgmma_target``) the
    warpgroup-MMA ``_moe_gemm_wgmma_kernel`` (same arguments) for row blocks of
    ``WGMMA_BLOCK_M``; 8-row blocks anywhere else are an error (the Triton kernel's
    dots need 16 rows). On ``mma.sync`` tiles ``tiles.x_shared`` applies where the
    input's rows are whole 16-byte copies that Triton can see as such
    (``_whole_copies``); elsewhere the same tiles load the input into registers. On
    ``wgmma`` tiles it is ignored here (``logical`` decides; where they fall back to
    ``mma.sync``, the input goes through registers, as before the input ring).

    ``experts``: ``(lo, hi)``, the experts ``b`` holds (all, or a dequantized chunk);
    blocks of other experts are skipped. With ``tiles.nibble_halves`` and int4
    weights ``a_MK`` is K-permuted in chunks of ``tiles.block_k`` (``permute_k``);
    ``perm_out`` > 0 writes ``out`` K-permuted in chunks of ``perm_out`` for the next
    GEMM (``out`` then has ``permuted_width(n, perm_out)`` columns). With
    ``tiles.int4_words`` int4 weights are read as int32 words where
    ``int4_words_fit``, else byte by byte. ``pdl`` (``MoETiles.pdl``): the Gluon
    kernel is launched with programmatic dependent launch where ``pdl_target``
    holds (the Triton kernel launches plainly). ``logical``: ``(input, output)`` in
    logical K order: the input copied as it is through the warpgroup kernel's ring
    (``gemm_form`` "wgmma", a ring, ``K % 128 == 0``), the output written so (the
    Gluon kernels); a ``ValueError`` where the kernel that runs cannot.
    """
    from backends.triton._kernels import _moe_gemm_kernel

    k = int(b.data.shape[2]) * (2 if b.is_int4 else 1)  # a_MK may be wider (padded)
    k_per_split = ceil_div(ceil_div(k, tiles.split_k), tiles.block_k) * tiles.block_k
    scale = b.scale if b.scale is not None else b.data
    zero = b.zero_point if b.zero_point is not None else scale
    bias = b.bias if b.bias is not None else scale
    lo, hi = experts
    group = b.group_size if b.is_int4 else 1
    if group == k:  # one group a row: GROUP >= BLOCK_K takes the one-group branch
        group = max(k, tiles.block_k)  # (BLOCK_K // GROUP would be 0 for K < BLOCK_K)
    words = tiles.int4_words and int4_words_fit(b)
    w13 = gated  # w13 reads a token's row for each of its pairs
    if gated and tiles.split_k > 1:  # raw gate and up partials, ungated
        _check_split_rows(out, tiles.split_k, n, perm_out)
        n, gated = 2 * n, False
    grid = (align.max_blocks * ceil_div(n, tiles.block_n), 1, tiles.split_k)
    form = gemm_form(tiles, b, a_MK, align.block_m)
    wgmma, mma = form == "wgmma", form == "mma"
    if any(logical):  # the checks' tensor queries only where asked
        plain_out = n % 128 or perm_out or (w13 and tiles.split_k > 1)
        copies = _whole_copies(a_MK, k)
        _check_logical(logical, form, tiles, k=k, copies=copies, plain_out=plain_out)
    if tiles.mma and not (mma or wgmma):
        _check_triton_rows(align.block_m, a_MK, words=words)
    args = (
        a_MK, b.data, scale, zero, out, align.sorted_pairs, align.block_expert,
        align.block_rows, routing.topk_weights, bias,
        n, k, k // 8, k_per_split, float(config.swiglu_alpha),
        float(config.swiglu_limit), lo, hi,
        a_MK.stride(0), b.data.stride(0), b.data.stride(1), scale.stride(0),
        scale.stride(1), out.stride(0) if out.ndim == 3 else 0, out.stride(-2),
        bias.stride(0),
    )  # fmt: skip
    meta = {
        "A_DIV": routing.top_k if w13 else 1, "GROUP": group,
        "HAS_ZP": b.zero_point is not None, "GATED": gated,
        "ACT": ACTIVATION_CODE[config.activation],
        "WEIGHT_ROWS": w13 and config.apply_router_weight_on_input,
        "CT": _operand_dtype(a_MK.dtype), "BLOCK_M": align.block_m,
        "BLOCK_N": tiles.block_n, "HAS_BIAS": b.bias is not None,
        "num_warps": tiles.num_warps,
    }  # fmt: skip
    if wgmma or mma:
        pdl = pdl and pdl_target(a_MK)
        gluon = {"POST_SCALE": group >= tiles.block_k, "WARPS": tiles.num_warps}
        gluon |= {"PDL": pdl, "LOGICAL_OUT": logical[1], **pdl_launch_options(on=pdl)}
        _launch_gluon(
            grid, args, meta | gluon, tiles, a_MK, k=k, wgmma=wgmma, x_ring=logical[0]
        )
        return
    _moe_gemm_kernel[grid](
        *args, **meta, INT4=b.is_int4, BLOCK_K=tiles.block_k, SWAP_AB=tiles.swap_ab,
        KPERM=tiles.nibble_halves and b.is_int4, PERM_OUT=perm_out,
        GROUP_M=tiles.group_m, WORDS=words, ASM=words and ptx_target(a_MK),
        num_stages=tiles.num_stages,
    )  # fmt: skip


def _launch_gluon(
    grid: tuple[int, int, int],
    args: tuple[object, ...],
    meta: dict[str, object],
    tiles: GemmTiles,
    a_MK: torch.Tensor,
    *,
    k: int,
    wgmma: bool,
    x_ring: bool,
) -> None:
    """Launch ``launch_gemm``'s arguments on a Gluon kernel: warpgroup MMA or mma.sync."""
    if x_ring and not (wgmma and tiles.num_stages > 1):
        raise ValueError("_launch_gluon: x_ring needs the warpgroup kernel and a ring")
    if wgmma:
        from backends.triton._kernels_wgmma import _moe_gemm_wgmma_kernel

        _moe_gemm_wgmma_kernel[grid](
            *args, **meta, ASYNC=WGMMA_ASYNC and tiles.num_stages == 1,
            STAGES=tiles.num_stages, COPY_STEPS=tiles.copy_steps, K32=k % 32 == 0,
            X_RING=x_ring,
        )  # fmt: skip
        return
    from backends.triton._kernels_mma import _moe_gemm_mma_kernel

    _moe_gemm_mma_kernel[grid](
        *args, **meta, STAGES=tiles.num_stages, COPY_STEPS=tiles.copy_steps,
        K32=k % 32 == 0,
        X_SHARED=tiles.x_shared and not tiles.wgmma and _whole_copies(a_MK, k),
    )  # fmt: skip


def gemm_form(tiles: GemmTiles, b: ExpertMatrix, a: torch.Tensor, block_m: int) -> str:
    """The kernel ``launch_gemm`` runs: "wgmma", "mma" (the Gluon kernels) or "triton"."""
    words = tiles.int4_words and int4_words_fit(b)
    if tiles.wgmma and words and wgmma_target(a) and block_m in WGMMA_BLOCK_M:
        return "wgmma"
    if tiles.mma and words and mma_target(a) and block_m in MMA_BLOCK_M:
        return "mma"
    return "triton"


def _check_logical(
    logical: tuple[bool, bool],
    form: str,
    tiles: GemmTiles,
    *,
    k: int,
    copies: bool,
    plain_out: object,
) -> None:
    """``launch_gemm``'s ``logical`` against the kernel that runs (``gemm_form``).

    ``copies``: the input's rows are whole 16-byte copies (``_whole_copies``);
    ``plain_out``: truthy where the output must stay in real order (N not whole
    128-column steps, a ``perm_out``, or a K-split w13's partials, which
    ``launch_activate`` reads as they are).
    """
    x_ring, out = logical
    if x_ring and (form != "wgmma" or tiles.num_stages < 2 or k % 128 or not copies):
        msg = (
            "launch_gemm: a logical-order input needs the warpgroup kernel with a "
            "ring, K % 128 == 0 and rows of whole 16-byte copies, got form "
            f"{form!r}, num_stages={tiles.num_stages}, K={k}, whole copies {copies}"
        )
        raise ValueError(msg)
    if out and (form == "triton" or plain_out):
        msg = (
            "launch_gemm: a logical-order output needs a Gluon kernel, N % 128 == 0, "
            f"no perm_out and no K-split w13, got form {form!r}"
        )
        raise ValueError(msg)


def _check_triton_rows(block_m: int, a_MK: torch.Tensor, *, words: bool) -> None:
    """Raise unless the Triton kernel can run ``GemmTiles.mma`` tiles' ``block_m``.

    Tiles the Gluon kernel does not take run on the Triton kernel, whose dots need
    blocks of >= 16 rows.
    """
    if block_m < 16:
        msg = (
            f"GemmTiles.mma with {block_m}-row blocks needs the Gluon kernel "
            "(the Triton kernels' dots take >= 16 rows): a CUDA sm_80+ device and "
            f"int4 weights of whole int32 words; got a {a_MK.device.type} tensor, "
            f"words {'fit' if words else 'do not fit'}"
        )
        raise ValueError(msg)


def _whole_copies(a_MK: torch.Tensor, k: int) -> bool:
    """Whether the Gluon kernel may copy ``a_MK``'s steps into shared memory in 16 bytes.

    ``K % 32 == 0``, a row stride of a multiple of 16 elements and a 16-byte aligned
    start: Triton specializes such arguments as divisible by 16, so every copy of 8
    elements is visibly whole (``_copy_input``; ``cp.async`` takes 4, 8 or 16 bytes).
    """
    return k % 32 == 0 and a_MK.stride(0) % 16 == 0 and a_MK.data_ptr() % 16 == 0


def _check_split_rows(out: torch.Tensor, split: int, n: int, perm_out: int) -> None:
    """A K-split w13 GEMM writes float32 ``(S, N, 2n)`` partials, in plain K order."""
    if perm_out:
        msg = f"a K-split w13 GEMM writes its partials unpermuted, got perm_out={perm_out}"
        raise ValueError(msg)
    if out.ndim != 3 or out.shape[0] != split or out.shape[2] != 2 * n:
        msg = (
            f"a K-split w13 GEMM writes (split, pairs, 2n) = ({split}, N, {2 * n}) "
            f"partials, got shape {tuple(out.shape)}"
        )
        raise ValueError(msg)
    if out.dtype != torch.float32:
        msg = f"a K-split w13 GEMM writes float32 partials, got {out.dtype}"
        raise ValueError(msg)


WGMMA_ASYNC = False
"""``True``: the warpgroup kernel's gated step starts the gate rows' MMA before
dequantizing the up rows (``ASYNC``); ``False`` (the table's form) waits for each MMA
before the next dequantization, which was faster in 64 x 128 tiles of 4 warps, the
table's (``WGMMA_TILES``): Mixtral M = 256 0.898 vs 1.066 ms on an H100
(bench/sweeps/probe_mma17_wgmma_h100.log); the 8-warp 128 x 128 tiles ran faster
overlapped (1.011 vs 1.160) but slower than those. Applies to tiles without a ring
only (``num_stages`` 1): with the words' ring the kernel runs waited-for MMAs whatever
this says, since its async form with a ring crashed the ``ptxas`` of Triton 3.6 and
3.7.1 (sm_90a, w2 with 2-step copy groups; ``bench/compile_launches.py``) and was
never run."""

MMA_BLOCK_M = (8, 16, 32)
"""Row blocks (tokens of the MMA's N) the Gluon kernel takes (``GemmTiles.mma``)."""
WGMMA_BLOCK_M = (8, 16, 32, 64)
"""Row blocks the warpgroup kernel takes (``GemmTiles.wgmma``; 64 only there)."""


def mma_target(a: torch.Tensor) -> bool:
    """Whether the Gluon MMA kernel runs for inputs on ``a``'s device.

    CUDA sm_80+, and a Triton whose Gluon has what the kernel uses (``gluon_kernels``).
    """
    return (
        a.device.type == "cuda"
        and torch.version.hip is None
        and not is_interpreting()
        and _capability(a.device) >= 8
        and gluon_kernels()
    )


def wgmma_target(a: torch.Tensor) -> bool:
    """Whether ``GemmTiles.wgmma`` tiles run the warpgroup-MMA kernel on ``a``'s device.

    Hopper (compute capability 9.x: ``wgmma`` is sm_90a's), where ``mma_target`` holds
    and the kernel's Gluon imports (``gluon_hopper``).
    """
    return mma_target(a) and _capability(a.device) == 9 and gluon_hopper()


def device_name(a: torch.Tensor) -> str:
    """The name of ``a``'s CUDA device (cached per device); ``""`` off CUDA."""
    return _device_name(a.device) if a.device.type == "cuda" else ""


@functools.cache
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


@functools.cache
def gluon_kernels() -> bool:
    """Whether the Gluon decode GEMM imports: Triton 3.6 or newer.

    Older releases lack parts of Gluon it uses (3.5 has no ``mma_v2``, 3.4 no Ampere
    ``async_copy``); there the Triton word kernel takes its tiles, as on other GPUs.
    """
    try:
        import backends.triton._kernels_mma  # noqa: F401  (the import is the check)
    except (ImportError, AttributeError):
        return False
    return True


@functools.cache
def gluon_hopper() -> bool:
    """Whether the warpgroup-MMA kernel imports (Gluon's Hopper ``warpgroup_mma``).

    Elsewhere ``GemmTiles.wgmma`` tiles run the ``mma.sync`` kernel.
    """
    try:
        import backends.triton._kernels_wgmma  # noqa: F401  (the import is the check)
    except (ImportError, AttributeError):
        return False
    return True


def int4_words_fit(b: ExpertMatrix) -> bool:
    """Whether ``b`` can be read as int32 words of 8 codes (``GemmTiles.int4_words``).

    Rows of whole words (``K % 8 == 0``), groups of whole words, and words aligned
    to 4 bytes; else the GEMM dequantizes the tile byte by byte.
    """
    return b.words_fit
