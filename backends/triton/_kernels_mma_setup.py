# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-calls=False, disallow-untyped-decorators=False
"""The Gluon decode GEMMs' shared parts: a program's expert, rows, tokens, step loads.

``@gluon.jit`` only; shared by ``_kernels_mma.py`` and ``_kernels_wgmma.py``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from backends.triton._kernels_mma_steps import _load_words, _row_scales


@gluon.jit
def _program_ids(N, BLOCK_N: gl.constexpr):
    """``(pid_b, pid_n, pid_s)``: row block, column tile (row blocks fastest), K split."""
    pid = gl.program_id(0)
    blocks = gl.num_programs(0) // gl.cdiv(N, BLOCK_N)
    return pid % blocks, pid // blocks, gl.program_id(2)


@gluon.jit
def _weight_operands(
    b_ptr, scale_ptr, zero_ptr, e, expert_lo, pid_n, N, stride_be, stride_bn,
    stride_se, BLOCK_N: gl.constexpr, W_LAYOUT: gl.constexpr,
):  # fmt: skip
    """``(w_e, s_e, z_e, stride_wn, rows, row_mask, kw)``: the weights' operands.

    ``_expert_bases``, the words' row stride and ``_weight_rows``.
    """
    w_e, s_e, z_e = _expert_bases(
        b_ptr, scale_ptr, zero_ptr, e, expert_lo, stride_be, stride_se
    )
    rows, row_mask, kw = _weight_rows(pid_n, N, BLOCK_N, W_LAYOUT)
    return w_e, s_e, z_e, stride_bn // 4, rows, row_mask, kw


@gluon.jit
def _expert_bases(b_ptr, scale_ptr, zero_ptr, e, expert_lo, stride_be, stride_se):
    """Expert ``e``'s words, scales and zero points (``b_ptr``: experts from ``expert_lo``)."""
    w_e = b_ptr.to(gl.pointer_type(gl.int32)) + (e - expert_lo).to(gl.int64) * (
        stride_be // 4
    )
    s_e = scale_ptr + e.to(gl.int64) * stride_se
    z_e = zero_ptr + e.to(gl.int64) * stride_se
    return w_e, s_e, z_e


@gluon.jit
def _weight_rows(pid_n, N, BLOCK_N: gl.constexpr, W_LAYOUT: gl.constexpr):
    """``(rows, row_mask, kw)``: the tile's rows in the words' layout.

    Rows ``[BLOCK_N, 1]`` (int64), which exist, and a 128-column step's words ``[1, 16]``.
    """
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, W_LAYOUT))
    rows = gl.expand_dims(offs_n.to(gl.int64), 1)
    row_mask = gl.expand_dims(offs_n < N, 1)
    kw = gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, W_LAYOUT)), 0)
    return rows, row_mask, kw


@gluon.jit
def _token_rows(
    block_pairs_ptr, n_rows, stride_am,
    A_DIV: gl.constexpr, BLOCK_M: gl.constexpr, X_LAYOUT: gl.constexpr,
):  # fmt: skip
    """``(x_rows, x_mask_m, offs_kx)``: the row block's tokens in the input's layout.

    Input row offsets ``[BLOCK_M, 1]``, which exist, and a step's columns ``[1, 128]``.
    """
    offs_mx = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, X_LAYOUT))
    pairs_x = gl.load(block_pairs_ptr + offs_mx, mask=offs_mx < n_rows, other=0)
    x_rows = gl.expand_dims((pairs_x // A_DIV).to(gl.int64) * stride_am, 1)
    x_mask_m = gl.expand_dims(offs_mx < n_rows, 1)
    offs_kx = gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, X_LAYOUT)), 0)
    return x_rows, x_mask_m, offs_kx


@gluon.jit
def _load_x(a_ptr, x_rows, x_mask_m, offs_kx, k0, k_end):
    """The activation's step at ``k0`` in real K order (zero past ``k_end``)."""
    cols = k0 + offs_kx
    return gl.load(a_ptr + x_rows + cols, mask=x_mask_m & (cols < k_end), other=0.0)


@gluon.jit
def _output_rows(pid_n, N, BLOCK_N: gl.constexpr, ACC_LAYOUT: gl.constexpr):
    """``(offs_nc, n_mask, rows_c)``: the tile's rows in the accumulator's layout."""
    offs_nc = pid_n * BLOCK_N + gl.arange(
        0, BLOCK_N, layout=gl.SliceLayout(1, ACC_LAYOUT)
    )
    return offs_nc, offs_nc < N, offs_nc.to(gl.int64)


@gluon.jit
def _first_step(
    w, k0, N, stride_sn,
    GROUP: gl.constexpr, HAS_ZP: gl.constexpr, CT: gl.constexpr,
    POST_SCALE: gl.constexpr, GATED: gl.constexpr, RING: gl.constexpr,
):  # fmt: skip
    """The first step's words, scales and biases, gate (or only) rows then up rows.

    ``w``: ``(w_e, s_e, z_e, rows, row_mask, kw, rows_c, n_mask, k_end, w_end,
    stride_wn)``; ``RING``: the words come through shared memory (``_load_words``).
    """
    w_e, s_e, z_e, rows, row_mask, kw, rows_c, n_mask, k_end, w_end, stride_wn = w
    wd, s_b, bias = _load_words(
        w_e, s_e, z_e, rows, row_mask, kw, k0, k_end, w_end, stride_wn, stride_sn,
        GROUP, HAS_ZP, CT, POST_SCALE, RING,
    )  # fmt: skip
    sc = _row_scales(s_e, rows_c, n_mask, k0, k_end, stride_sn, GROUP)
    wd_up, s_up, bias_up = _load_words(
        w_e, s_e, z_e, rows + N, row_mask & GATED, kw, k0, k_end, w_end, stride_wn,
        stride_sn, GROUP, HAS_ZP, CT, POST_SCALE, RING,
    )  # fmt: skip
    sc_up = _row_scales(s_e, rows_c + N, n_mask & GATED, k0, k_end, stride_sn, GROUP)
    return wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up


@gluon.jit
def _next_step(
    w, k0, N, stride_sn, sc, sc_up,
    GROUP: gl.constexpr, HAS_ZP: gl.constexpr, CT: gl.constexpr,
    POST_SCALE: gl.constexpr, GATED: gl.constexpr, RING: gl.constexpr,
):  # fmt: skip
    """``_first_step`` at ``k0`` for the loop.

    Scales only with ``POST_SCALE`` (else ``sc`` and ``sc_up`` as given), up rows only
    where ``GATED``.
    """
    w_e, s_e, z_e, rows, row_mask, kw, rows_c, n_mask, k_end, w_end, stride_wn = w
    wd, s_b, bias = _load_words(
        w_e, s_e, z_e, rows, row_mask, kw, k0, k_end, w_end, stride_wn, stride_sn,
        GROUP, HAS_ZP, CT, POST_SCALE, RING,
    )  # fmt: skip
    if POST_SCALE:
        sc = _row_scales(s_e, rows_c, n_mask, k0, k_end, stride_sn, GROUP)
    wd_up, s_up, bias_up = wd, s_b, bias  # unread unless GATED
    if GATED:
        wd_up, s_up, bias_up = _load_words(
            w_e, s_e, z_e, rows + N, row_mask, kw, k0, k_end, w_end, stride_wn,
            stride_sn, GROUP, HAS_ZP, CT, POST_SCALE, RING,
        )  # fmt: skip
        if POST_SCALE:
            sc_up = _row_scales(s_e, rows_c + N, n_mask, k0, k_end, stride_sn, GROUP)
    return wd, s_b, bias, sc, wd_up, s_up, bias_up, sc_up
