"""The fused MoE layer on the Triton kernels, and the rules that pick its path.

May import core; triton only inside functions. Three paths compute the same layer:

- ``gemv`` (decode): two pair-major GEMVs (w2's K split across programs when they
  are few) and the top-k sum, three launches; taken for a handful of pairs that
  rarely share an expert (``use_gemv``). On int4 the GEMVs read int32 words of 8
  codes and multiply in float16 pairs, two words of a group per chain (bytes where
  the weights are not whole words);
  on 16-bit weights (triton-emulation, up to 8 pairs of small experts) they read the
  weights as they are (``pick_gemv_tiles``).
- ``gemm``: align pairs to expert row blocks on the device, grouped GEMM for w13 with
  the activation, grouped GEMM for w2, top-k sum; int4 weights are dequantized in
  registers into the dot's register operand (the int4 table reads int32 words at
  decode, on CUDA sm_80+ by the Gluon kernel of ``_kernels_mma.py``, which loads
  each thread's ``mma.sync`` A fragment directly; above 16 pairs per expert it dots
  the low and high nibbles as two halves
  against a K-permuted input: ``permute_k`` for w13, and w13 writes its output
  permuted for w2), 16-bit weights (triton-emulation) are read as they are. Where
  the tiles split w13's K (``MoETiles``), w13 writes float32 partials and one more
  launch sums them and applies the activation (``launch_activate``).
- ``dequant`` (int4, prefill): the ``gemm`` path on 16-bit weights, with chunks of
  experts dequantized into a bounded scratch buffer just before their GEMMs;
  taken from ``DEQUANT_PAIRS_PER_EXPERT`` pairs per expert (``use_dequant``).

Every buffer is sized from host-known sizes, so each path can be captured in a CUDA
graph. Shape legend: ``T`` tokens, ``D`` hidden, ``F`` intermediate, ``E`` experts,
``K`` top_k, ``N`` = T*K routed pairs, ``S`` K-splits, ``C`` experts in a chunk.
"""

from typing import Literal

import torch

import backends.triton._configs as configs
from backends.triton._align import align_pairs_to_blocks
from backends.triton._configs import choose_tiles
from backends.triton._launch import (
    ExpertMatrix,
    buffer_dtype,
    device_name,
    gemm_form,
    int4_words_fit,
    is_interpreting,
    launch_gemm,
    mma_target,
    wgmma_target,
)
from backends.triton._launch_dequant import dequantize_experts
from backends.triton._launch_gemv import launch_gemv
from backends.triton._launch_reduce import launch_activate, reduce_topk
from backends.triton._tiles import GemmTiles, GemvTiles, MoETiles
from core.config import MoEConfig
from core.errors import DTypeError
from core.routing import Routing

Path = Literal["auto", "gemm", "gemv", "dequant"]


def use_gemv(
    num_pairs: int,
    w13: ExpertMatrix,
    w2: ExpertMatrix | None = None,
    *,
    enabled: bool = configs.GEMV_BY_DEFAULT,
) -> bool:
    """Decode rule: few pairs, seldom two on one expert.

    int4 of whole aligned words (``int4_words_fit``): <= ``GEMV_MAX_PAIRS`` pairs and <=
    one per expert; where the GEMM would run the Gluon kernel (``mma_runs``; ``w2``: as
    ``w13`` if not given) <= ``GEMV_MAX_PAIRS_MMA`` and <= one per two experts, or on
    the GPUs of ``GEMV_WIDE_GPUS`` (by device name) with at least
    ``GEMV_WIDE_MIN_EXPERTS`` experts up to ``GEMV_WIDE_PAIRS_PER_EXPERT`` a expert and
    ``GEMV_WIDE_MAX_PAIRS`` (``_gemv_wide``). Other
    int4 (the byte GEMV) and 16-bit weights (emulation): <= ``GEMV_FEW_PAIRS`` and <=
    one pair per two experts; 16-bit only for experts below
    ``GEMV_16BIT_MAX_EXPERT`` (see ``GEMV_16BIT``), and up to ``GEMV_16BIT_TINY_PAIRS``
    below ``GEMV_16BIT_TINY_EXPERT``. The pair-major GEMV reads a used expert's weights
    once per pair (1.6 times on average at one pair per expert under
    uniform routing, 1.3 at one per two), without the GEMM's 16-row minimum or its
    alignment launch.
    """
    experts = int(w13.data.shape[0])
    if not enabled:
        return False
    if w13.is_int4 and int4_words_fit(w13):
        if mma_runs(w13, w13 if w2 is None else w2):
            most = min(configs.GEMV_MAX_PAIRS_MMA, experts // 2)
            if _gemv_wide(w13, experts):
                wide = int(experts * configs.GEMV_WIDE_PAIRS_PER_EXPERT)
                most = max(most, min(wide, configs.GEMV_WIDE_MAX_PAIRS))
            return num_pairs <= most
        return num_pairs <= min(configs.GEMV_MAX_PAIRS, experts)
    if 2 * num_pairs > experts:
        return False
    if w13.is_int4:
        return num_pairs <= configs.GEMV_FEW_PAIRS
    size = _expert_size(w13)
    if size < configs.GEMV_16BIT_TINY_EXPERT:
        return num_pairs <= configs.GEMV_16BIT_TINY_PAIRS
    return num_pairs <= configs.GEMV_FEW_PAIRS and size < configs.GEMV_16BIT_MAX_EXPERT


def _gemv_wide(w13: ExpertMatrix, experts: int) -> bool:
    """Whether ``GEMV_WIDE_PAIRS_PER_EXPERT`` applies to ``w13``.

    At least ``GEMV_WIDE_MIN_EXPERTS`` experts, groups of two words or more (the
    paired integer GEMV), on a CUDA device named in ``GEMV_WIDE_GPUS``.
    """
    if experts < configs.GEMV_WIDE_MIN_EXPERTS or w13.group_size < 16:
        return False
    name = device_name(w13.data)
    return any(gpu in name for gpu in configs.GEMV_WIDE_GPUS)


def _expert_size(w13: ExpertMatrix) -> int:
    """``hidden * intermediate`` of ``w13`` ``(E, 2F, D/2)`` int4 or ``(E, 2F, D)``."""
    rows, cols = int(w13.data.shape[1]), int(w13.data.shape[2])
    return rows * cols if w13.is_int4 else rows * cols // 2


def use_dequant(num_pairs: int, w13: ExpertMatrix) -> bool:
    """Prefill rule: int4 weights and ``DEQUANT_PAIRS_PER_EXPERT`` pairs per expert."""
    per_expert = num_pairs / int(w13.data.shape[0])
    return w13.is_int4 and per_expert >= configs.DEQUANT_PAIRS_PER_EXPERT


def mma_runs(w13: ExpertMatrix, w2: ExpertMatrix) -> bool:
    """Whether the int4 GEMM runs the Gluon MMA kernel on these weights.

    int4 of whole int32 words (``int4_words_fit``) on a CUDA sm_80+ device
    (``mma_target``).
    """
    return (
        w13.is_int4
        and mma_target(w13.data)
        and int4_words_fit(w13)
        and int4_words_fit(w2)
    )


def pick_tiles(
    num_pairs: int, w13: ExpertMatrix, w2: ExpertMatrix, *, dequant: bool = False
) -> MoETiles:
    """The tile table's entry for these sizes (small tiles in the interpreter).

    The GEMMs read 16-bit weights for triton-emulation and on the ``dequant`` path.
    The int4 decode row takes the Gluon MMA kernel where it runs (``mma_target``)
    on weights of whole int32 words (``int4_words_fit``), and on Hopper
    (``wgmma_target``) the warpgroup kernel where the table gives it sizes.
    """
    if is_interpreting():
        return configs.INTERPRETER
    sixteen_bit = dequant or not w13.is_int4
    mma = not sixteen_bit and mma_runs(w13, w2)
    return choose_tiles(
        num_pairs=num_pairs,
        num_experts=int(w13.data.shape[0]),
        hidden_size=int(w2.data.shape[1]),
        intermediate_size=int(w13.data.shape[1]) // 2,
        sixteen_bit=sixteen_bit,
        mma=mma,
        wgmma=mma and wgmma_target(w13.data),  # asked only where it can matter
    )


def pick_gemv_tiles(num_pairs: int, w13: ExpertMatrix) -> GemvTiles:
    """GEMV tiles: ``GEMV_16BIT``, or for int4 int32 words or bytes.

    int4: where w13 reads as whole aligned words (``int4_words_fit``) the paired word
    GEMV: ``GEMV_PAIRED`` (TMA reads) where its w13 grid fills the GPU (at least
    ``GEMV_PROGRAMS_PER_SM`` programs per multiprocessor of an H200, the GPU the table
    was measured on), else ``GEMV_PAIRED_FEW``
    (loads one step ahead, which start sooner in short grids); else the byte kernel's
    ``GEMV_FEW`` (``use_gemv`` then allows <= ``GEMV_FEW_PAIRS`` pairs). Groups of one
    word (``G = 8``) run those tiles on the one-word kernel, and a w2 that is not whole
    words runs the byte kernel with them (``launch_gemv``).
    """
    if is_interpreting():
        return configs.GEMV_INTERPRETER
    if not w13.is_int4:
        return configs.GEMV_16BIT
    if not int4_words_fit(w13):
        return configs.GEMV_FEW
    rows = int(w13.data.shape[1]) // 2
    programs = num_pairs * -(-rows // configs.GEMV_PAIRED.block_n)
    if programs < configs.GEMV_PROGRAMS_PER_SM * configs.NUM_SMS_H200:
        return configs.GEMV_PAIRED_FEW
    return configs.GEMV_PAIRED


def gemv_w2_split(tiles: GemvTiles, num_pairs: int, d: int, f: int) -> int:
    """K splits of the w2 GEMV: ``tiles.w2_split``, else ``gemv_split_for`` on its grid.

    ``d`` hidden size (w2's rows), ``f`` intermediate size (its K); the grid is that of
    the tiles the w2 GEMV runs (``tiles.w2_tiles`` or ``tiles``).
    """
    if tiles.w2_split is not None:
        return tiles.w2_split
    tiles2 = tiles.w2_tiles or tiles
    programs = num_pairs * -(-d // tiles2.block_n)
    return configs.gemv_split_for(programs, f, tiles2.block_k)


def _gemv_moe(
    x_TD: torch.Tensor,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    routing: Routing,
    config: MoEConfig,
    *,
    tiles: GemvTiles | None,
) -> torch.Tensor:
    """The ``gemv`` path: two pair-major GEMVs (int4 or 16-bit) and the top-k sum."""
    num_pairs, d = routing.topk_ids.numel(), int(x_TD.shape[1])
    f = int(w13.data.shape[1]) // 2
    chosen = tiles if tiles is not None else pick_gemv_tiles(num_pairs, w13)
    dtype = buffer_dtype(x_TD.dtype)
    inter_NF = torch.empty(num_pairs, f, dtype=dtype, device=x_TD.device)
    launch_gemv(
        x_TD, w13, inter_NF, n=f, routing=routing, config=config, gated=True,
        tiles=chosen,
    )  # fmt: skip
    tiles2 = chosen.w2_tiles or chosen
    split = gemv_w2_split(chosen, num_pairs, d, f)
    part_dtype = torch.float32 if split > 1 else dtype
    part_SND = torch.empty(split, num_pairs, d, dtype=part_dtype, device=x_TD.device)
    launch_gemv(
        inter_NF, w2, part_SND, n=d, routing=routing, config=config, gated=False,
        tiles=tiles2, split=split,
    )  # fmt: skip
    weighted = not config.apply_router_weight_on_input
    return reduce_topk(
        part_SND, routing, weighted=weighted, dtype=x_TD.dtype, pdl=tiles2.pdl
    )


def _dequant_scratch(
    w13: ExpertMatrix, w2: ExpertMatrix, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, int]:
    """The ``dequant`` path's scratch and experts per chunk (<= DEQUANT_SCRATCH_BYTES).

    One expert's larger matrix has ``2 * numel`` 16-bit values (two codes a byte).
    """
    per_expert = 2 * max(int(w13.data[0].numel()), int(w2.data[0].numel()))
    fits = configs.DEQUANT_SCRATCH_BYTES // (2 * per_expert)
    step = max(1, min(int(w13.data.shape[0]), fits))
    return torch.empty(step * per_expert, dtype=dtype, device=device), step


def _gemm_moe(
    x_TD: torch.Tensor,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    routing: Routing,
    config: MoEConfig,
    *,
    tiles: MoETiles,
    dequant: bool,
) -> torch.Tensor:
    """The ``gemm`` path, or with ``dequant`` the ``dequant`` path (chunk by chunk)."""
    num_experts = int(w13.data.shape[0])
    num_pairs, d = routing.topk_ids.numel(), int(x_TD.shape[1])
    f = int(w13.data.shape[1]) // 2
    pdl = tiles.pdl  # each launch checks pdl_target
    align = align_pairs_to_blocks(routing.topk_ids, num_experts, block_m=tiles.block_m)
    dtype = buffer_dtype(x_TD.dtype)
    halves13 = tiles.w13.nibble_halves and not dequant and w13.is_int4
    halves2 = tiles.w2.nibble_halves and not dequant and w2.is_int4
    a_TD = permute_k(x_TD, tiles.w13.block_k) if halves13 else x_TD
    in13, in2 = (False, False)
    if not (dequant or halves13 or halves2):
        in13, in2 = _logical_inputs(x_TD, w13, w2, tiles)
    if in13:
        a_TD = permute_logical(x_TD)
    perm_out = tiles.w2.block_k if halves2 else 0
    width = permuted_width(f, perm_out) if halves2 else f
    inter_NF = torch.empty(num_pairs, width, dtype=dtype, device=x_TD.device)
    split = tiles.w2.split_k
    part_dtype = torch.float32 if split > 1 else dtype
    part_SND = torch.empty(split, num_pairs, d, dtype=part_dtype, device=x_TD.device)
    split13 = tiles.w13.split_k
    part13 = None
    if split13 > 1:  # w13's K-split partials, summed and activated by launch_activate
        part13 = torch.empty(split13, num_pairs, 2 * f, device=x_TD.device)
    scratch, step = None, num_experts
    if dequant:
        scratch, step = _dequant_scratch(w13, w2, dtype, x_TD.device)
    for lo in range(0, num_experts, step):
        hi = min(lo + step, num_experts)
        b13 = w13 if scratch is None else _dequantized(w13, lo, hi, scratch)
        launch_gemm(
            a_TD, b13, inter_NF if part13 is None else part13, align, tiles.w13, n=f,
            routing=routing, config=config, gated=True, experts=(lo, hi),
            perm_out=perm_out, pdl=pdl, logical=(in13, in2),
        )  # fmt: skip
        if part13 is not None:
            launch_activate(
                part13, routing, config, inter_NF, experts=(lo, hi), pdl=pdl
            )
        b2 = w2 if scratch is None else _dequantized(w2, lo, hi, scratch)
        launch_gemm(
            inter_NF, b2, part_SND, align, tiles.w2, n=d, routing=routing,
            config=config, gated=False, experts=(lo, hi), pdl=pdl, logical=(in2, False),
        )  # fmt: skip
    weighted = not config.apply_router_weight_on_input
    return reduce_topk(part_SND, routing, weighted=weighted, dtype=x_TD.dtype, pdl=pdl)


def _logical_inputs(
    x_TD: torch.Tensor, w13: ExpertMatrix, w2: ExpertMatrix, tiles: MoETiles
) -> tuple[bool, bool]:
    """Which GEMMs copy their input in logical K order through the ring: (w13, w2).

    Where ``x_shared`` tiles run the warpgroup kernel with a ring on whole 128-column
    steps (``gemm_form``): w13's input is then ``permute_logical(x)``, and w2's is
    w13's output written so (w13 unsplit, on a Gluon kernel).
    """
    block_m, f, d = tiles.block_m, int(w13.data.shape[1]) // 2, int(x_TD.shape[1])
    form13 = gemm_form(tiles.w13, w13, x_TD, block_m)

    def ring(t: GemmTiles, form: str, k: int) -> bool:
        return t.x_shared and form == "wgmma" and t.num_stages > 1 and k % 128 == 0

    form2 = gemm_form(tiles.w2, w2, x_TD, block_m)
    in2 = ring(tiles.w2, form2, f) and tiles.w13.split_k == 1 and form13 != "triton"
    return ring(tiles.w13, form13, d), in2


def permuted_width(k: int, chunk: int) -> int:
    """Columns of a K-permuted buffer: ``k`` rounded up to whole chunks."""
    return -(-k // chunk) * chunk


def permute_k(x_MK: torch.Tensor, chunk: int) -> torch.Tensor:
    """``x`` with each ``chunk`` of columns reordered: even columns, then odd ones.

    The layout ``nibble_halves`` GEMMs read: an int4 byte's low nibble multiplies
    column ``k0 + i`` and its high nibble ``k0 + chunk/2 + i``. The last chunk is
    zero-padded to full width.
    """
    m, k = x_MK.shape
    width = permuted_width(k, chunk)
    if width != k:
        x_MK = torch.nn.functional.pad(x_MK, (0, width - k))
    chunks = x_MK.reshape(m, width // chunk, chunk // 2, 2)
    return chunks.transpose(2, 3).reshape(m, width)


def permute_logical(x_MK: torch.Tensor) -> torch.Tensor:
    """``x`` with each 128 columns in logical K order (``K % 128 == 0``).

    Real column ``32c + 8r + 4h + 2i1 + i0`` goes to ``32r + 16i1 + 8i0 + 2c + h``:
    the order in which the Gluon kernels' words meet the activation
    (``_kernels_mma.py``).
    """
    m, k = x_MK.shape
    v = x_MK.reshape(m, k // 128, 4, 4, 2, 2, 2)  # [m, step, c, r, h, i1, i0]
    return v.permute(0, 1, 3, 5, 6, 2, 4).reshape(m, k)


def _dequantized(
    b: ExpertMatrix, lo: int, hi: int, scratch: torch.Tensor
) -> ExpertMatrix:
    """Experts ``lo .. hi-1`` of ``b`` dequantized into the front of ``scratch``."""
    rows, cols = int(b.data.shape[1]), 2 * int(b.data.shape[2])
    out = scratch[: (hi - lo) * rows * cols].view(hi - lo, rows, cols)
    dequantize_experts(b, lo, hi, out)
    return ExpertMatrix(data=out, bias=b.bias)  # bias rows are indexed by global expert


def fused_moe(
    hidden_TD: torch.Tensor,
    w13: ExpertMatrix,
    w2: ExpertMatrix,
    routing: Routing,
    config: MoEConfig,
    *,
    tiles: MoETiles | None = None,
    path: Path = "auto",
    gemv_tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """The MoE layer: routed experts' gated MLPs, weighted and summed per token.

    Args:
        hidden_TD: ``(T, D)`` bf16 or fp16 activations.
        w13: gate and up rows ``(E, 2F, D)`` (packed or 16-bit), optional ``(E, 2F)``
            bias added before the activation.
        w2: down rows ``(E, D, F)`` (packed or 16-bit), optional ``(E, D)`` bias added
            before the router weight.
        routing: ``(T, K)`` float32 weights and ids (``-1`` contributes zero).
        config: activation and ``apply_router_weight_on_input``.
        tiles: GEMM tile override (benchmark sweeps); default from the tile table.
        path: ``gemv``, ``gemm``, ``dequant`` (see the module doc) or ``auto``:
            ``gemv`` where ``use_gemv``, ``dequant`` where ``use_dequant``, else
            ``gemm`` (always ``gemm`` with ``tiles``). ``gemv`` and ``dequant`` need
            int4 weights.
        gemv_tiles: GEMV tile override (benchmark sweeps).

    Returns:
        ``(T, D)`` in the dtype of ``hidden_TD``.
    """
    if hidden_TD.dtype not in (torch.bfloat16, torch.float16):
        raise DTypeError(
            f"hidden_states must be bfloat16 or float16, got {hidden_TD.dtype}"
        )
    t, d = hidden_TD.shape
    if t == 0:
        return hidden_TD.new_empty((0, d))
    routing = Routing(
        topk_weights=routing.topk_weights.float().contiguous(),
        topk_ids=routing.topk_ids.contiguous(),
    )
    x_TD = hidden_TD.contiguous()
    num_pairs = routing.topk_ids.numel()
    if path == "auto" and tiles is None:
        path = "gemm"
        if use_gemv(num_pairs, w13, w2):
            path = "gemv"
        elif use_dequant(num_pairs, w13):
            path = "dequant"
    if path == "gemv":
        return _gemv_moe(x_TD, w13, w2, routing, config, tiles=gemv_tiles)
    if path == "dequant" and not (w13.is_int4 and w2.is_int4):
        raise DTypeError(
            "the dequant path needs int4 (uint8) weights, got 16-bit weights"
        )
    dequant = path == "dequant"
    chosen = (
        tiles if tiles is not None else pick_tiles(num_pairs, w13, w2, dequant=dequant)
    )
    return _gemm_moe(x_TD, w13, w2, routing, config, tiles=chosen, dequant=dequant)
