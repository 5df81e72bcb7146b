"""Triton kernel of routing: scores, (grouped) top-k and the weights in one launch.

``@triton.jit`` functions only; the typed host wrapper is ``_route.py``. The same
math as ``core.routing.route_topk``, one program per ``BLOCK_T`` tokens, a token's
``E`` logits in registers::

    s = softmax(x) or sigmoid(x)                 # float32, the weights' source
    c = s + bias                                 # the choice (bias: DeepSeek-V3)
    c = +inf where NaN, max(c, -FLT_MAX)         # torch.topk's order; -inf: no lane
    if GROUPS: keep the TOPK_GROUP best groups of c (max, or sum of the best two),
               others -inf
    TOP_K times: i = argmax(c) (lowest index on ties); ids[k] = i; w[k] = s[i];
                 c[i] = -inf
    w = w / max(sum(w), tiny) if RENORM; w = w * scale
"""

import triton
import triton.language as tl

_LOWEST: tl.constexpr = tl.constexpr(-3.4028234663852886e38)
"""-FLT_MAX: the floor of a real lane's choice (padded and taken lanes are -inf)."""


@triton.jit
def _argmax_hit(values, offs):  # type: ignore[no-untyped-def]  # a Triton function
    """``(BLOCK_T, BLOCK_X)`` one-hot of each row's argmax (lowest index on ties)."""
    best = tl.argmax(values, axis=1, tie_break_left=True)
    return offs[None, :] == best[:, None]


@triton.jit
def _best_groups(  # type: ignore[no-untyped-def]  # a Triton function
    choice,
    offs_e,
    group_size,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    GROUPS: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOP2_SUM: tl.constexpr,
):
    """``choice`` with the lanes outside each row's ``TOPK_GROUP`` best groups at -inf.

    A group's score is its best lane (``TOP2_SUM``: the sum of its best two).
    """
    neg_inf = float("-inf")
    gid = offs_e // group_size  # padded lanes fall past the last group
    lane_score = tl.full([BLOCK_T, BLOCK_E], neg_inf, tl.float32)
    for g in tl.static_range(GROUPS):
        in_g = (gid == g)[None, :]
        vals = tl.where(in_g, choice, neg_inf)
        best = tl.max(vals, axis=1)
        if TOP2_SUM:
            second = tl.where(_argmax_hit(vals, offs_e), neg_inf, vals)
            best = best + tl.max(second, axis=1)
        # -FLT_MAX + -FLT_MAX is -inf: a real group stays above padded lanes.
        best = tl.maximum(best, _LOWEST)
        lane_score = tl.where(in_g, best[:, None], lane_score)
    keep = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.int1)
    for _ in tl.static_range(TOPK_GROUP):
        # The best group left: the one of the lowest lane with the best score.
        lane = tl.argmax(lane_score, axis=1, tie_break_left=True)
        chosen = gid[None, :] == (lane // group_size)[:, None]
        keep = keep | chosen
        lane_score = tl.where(chosen, neg_inf, lane_score)
    return tl.where(keep, choice, neg_inf)


@triton.jit
def _route_topk_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    # pointers
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    # sizes
    T,
    E,
    group_size,
    # strides
    stride_lt,
    stride_le,
    # scalars
    scale,
    # meta-parameters
    TOP_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORM: tl.constexpr,
    GROUPS: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOP2_SUM: tl.constexpr,
):
    """``weights``/``ids`` ``(T, TOP_K)`` of the ``(T, E)`` logits; ``GROUPS`` 0: no groups."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.arange(0, BLOCK_E)
    t_mask = offs_t < T
    e_mask = offs_e < E
    lanes = t_mask[:, None] & e_mask[None, :]
    x = tl.load(
        logits_ptr
        + offs_t.to(tl.int64)[:, None] * stride_lt
        + offs_e.to(tl.int64)[None, :] * stride_le,
        mask=lanes,
        other=0.0,
    ).to(tl.float32)
    neg_inf = float("-inf")
    if SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-x))
    else:
        x = tl.where(e_mask[None, :], x, neg_inf)
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
    choice = scores
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_e, mask=e_mask, other=0.0).to(tl.float32)
        choice = scores + bias[None, :]
    # The order torch.topk gives: NaN above every number. Real lanes are kept above
    # -inf (at -FLT_MAX or more), so padded lanes, lanes of dropped groups and lanes
    # already taken (all -inf) are never chosen before them: ids stay distinct and
    # below E whatever the logits (inf - inf is NaN under softmax).
    choice = tl.where(choice != choice, float("inf"), choice)
    choice = tl.maximum(choice, _LOWEST)
    choice = tl.where(e_mask[None, :], choice, neg_inf)
    if GROUPS > 0:
        choice = _best_groups(
            choice, offs_e, group_size, BLOCK_T, BLOCK_E, GROUPS, TOPK_GROUP, TOP2_SUM
        )
    offs_k = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int64)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(choice, axis=1, tie_break_left=True)
        hit = offs_e[None, :] == best[:, None]
        w = tl.sum(tl.where(hit, scores, 0.0), axis=1)
        slot = (offs_k == k)[None, :]
        top_w = tl.where(slot, w[:, None], top_w)
        top_i = tl.where(slot, best.to(tl.int64)[:, None], top_i)
        choice = tl.where(hit, neg_inf, choice)
    if RENORM:
        denom = tl.maximum(tl.sum(top_w, axis=1), 1.1754943508222875e-38)
        top_w = top_w / denom[:, None]
    top_w = top_w * scale
    out = offs_t.to(tl.int64)[:, None] * TOP_K + offs_k[None, :]
    out_mask = t_mask[:, None] & (offs_k < TOP_K)[None, :]
    tl.store(weights_ptr + out, top_w, mask=out_mask)
    tl.store(ids_ptr + out, top_i, mask=out_mask)
