"""The variants ``bench/probe_mma.py`` times, by ``PROBE_SET`` (its docstring lists them).

A GPU script's data, not library code: tiles built from the table's, keyed by label.
"""

import os

import attrs
from probe_mma_ring import set_25

from backends.triton._configs_mma import (
    MMA_RING_STAGES,
    MMA_TILES,
    WGMMA_TILES,
    wgmma_decode_tiles,
    wgmma_tiles,
)
from backends.triton._tiles import GemmTiles, MoETiles


def words(
    t: GemmTiles, *, mma: bool, block_n: int | None = None, warps: int | None = None
) -> GemmTiles:
    """``t`` reading int32 words, by the Gluon kernel if ``mma``, at 128 columns.

    Copy groups are kept only on the Gluon kernel's ring.
    """
    return attrs.evolve(
        t, int4_words=True, nibble_halves=False, swap_ab=True, block_k=128,
        block_n=block_n or t.block_n, num_warps=warps or t.num_warps, mma=mma,
        copy_steps=t.copy_steps if mma and t.num_stages > 1 else 1,
    )  # fmt: skip


SHAPES = {8: [(64, 4), (128, 4), (128, 8)], 16: [(64, 4), (128, 4), (128, 8), (256, 8)]}
"""Row block: (column tile, warps) of the Gluon kernel, for w13 and w2 alike
(``PROBE_SET=2``: ``SHAPES_2``)."""
SHAPES_2 = {8: [(128, 4), (64, 2), (32, 1)], 16: [(128, 4), (64, 2)]}
STAGES = (1, 2, 3, 4)
"""``PROBE_SET=3``: the table's tiles at these ``num_stages`` (1: words one step ahead
in registers; more: a cp.async ring), in 8- and 16-row blocks."""

COPY_GROUPS = {
    "bm8 ring2 copy2": (8, 2, 2),
    "bm8 ring3 copy2": (8, 3, 2),
    "bm8 ring3 copy1": (8, 3, 1),
    "bm16 ring2 copy2": (16, 2, 2),
    "bm16 ring3 copy2": (16, 3, 2),
    "bm16 ring2 copy4": (16, 2, 4),
}
"""``PROBE_SET=5``: label: (row block, ring stages, steps a copy group holds
(``GemmTiles.copy_steps``)), for w13 and w2 alike."""


def with_splits(
    default: MoETiles, splits: list[tuple[int, int]]
) -> dict[str, MoETiles | None]:
    """``default`` with each ``(w13 split, w2 split)``, keyed by the two."""
    return {
        f"w13 split {a} w2 split {b}": attrs.evolve(
            default,
            w13=attrs.evolve(default.w13, split_k=a),
            w2=attrs.evolve(default.w2, split_k=b),
        )
        for a, b in splits
    }


def variants(default: MoETiles) -> dict[str, MoETiles | None]:
    """``None``: the layer as the table runs it (``path="auto"``, GEMV where chosen)."""
    out: dict[str, MoETiles | None] = {"auto": None, "table gemm": default}
    chosen = _SETS.get(os.environ.get("PROBE_SET", ""), _set_shapes)
    return chosen(default, out)


def _set_16(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=16`` (the module docstring)."""
    w2 = default.w2
    blocks = (32, 64) if default.block_m > 16 else (16, 32)
    for bm in blocks:
        for bn, warps in ((64, 4), (128, 8)):
            form = attrs.evolve(
                MMA_TILES, block_n=bn, num_warps=warps, num_stages=1,
                copy_steps=1, wgmma=True,
            )  # fmt: skip
            for split2 in sorted({w2.split_k, max(1, w2.split_k // 2)}):
                key = f"wgmma bm{bm} {bn} w{warps} w2 split {split2}"
                if os.environ.get("WGMMA_SYNC") == "1":
                    key += " sync"
                out[key] = MoETiles(
                    block_m=bm,
                    w13=attrs.evolve(form, split_k=1),
                    w2=attrs.evolve(form, split_k=split2),
                    pdl=default.pdl,
                )
    out["table gemm again"] = default
    return out


WGMMA_RINGS = ((1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (3, 2))
"""``PROBE_SET=18``: (ring stages, steps a copy group holds) of the warpgroup kernel's
words in 32-row blocks (16-row ones: three of them); ``(1, 1)``: one step ahead in
registers, the table's form before the ring."""


def _wgmma_rings(
    default: MoETiles,
    out: dict[str, MoETiles | None],
    forms: list[tuple[int, int, int]],
) -> dict[str, MoETiles | None]:
    """The warpgroup kernel (64 x 128, 4 warps, each MMA waited for) at ``forms``.

    Each form is ``(row block, ring stages, steps a copy group holds)``; w13 unsplit,
    the w2 split and PDL as ``default``'s.
    """
    for bm, stages, copy in forms:
        form = attrs.evolve(
            MMA_TILES, block_n=64, num_warps=4, num_stages=stages, copy_steps=copy,
            wgmma=True,
        )  # fmt: skip
        out[f"wgmma bm{bm} st{stages}x{copy} sync"] = MoETiles(
            block_m=bm,
            w13=attrs.evolve(form, split_k=1),
            w2=attrs.evolve(form, split_k=default.w2.split_k),
            pdl=default.pdl,
        )
    out["table gemm again"] = default
    return out


def _set_18(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=18`` (the module docstring): the warpgroup kernel's words' ring."""
    forms = [(32, stages, copy) for stages, copy in WGMMA_RINGS]
    forms += [(16, 1, 1), (16, 3, 1), (16, 2, 2)]
    return _wgmma_rings(default, out, forms)


WGMMA_GROUPS = ((32, 2, 2), (32, 3, 2), (32, 2, 4), (16, 2, 2), (16, 2, 4))
"""``PROBE_SET=19``: (row block, ring stages, steps a copy group holds) of the warpgroup
kernel, after ``PROBE_SET=18`` found 2-step copy groups ahead (one row's two steps,
128 bytes, copied back to back)."""


def _set_19(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=19`` (the module docstring): the warpgroup kernel's copy groups."""
    return _wgmma_rings(default, out, list(WGMMA_GROUPS))


def _set_20(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=20`` (the module docstring): the table's own warpgroup rows anywhere.

    Both decode forms (``wgmma_decode_tiles``, large and small experts, the w2 split
    as ``default``'s) and ``wgmma_tiles``, for the pairs per expert the table has not
    measured them at (9-15; 65-127 for experts below 2^25 weights).
    """
    split = default.w2.split_k
    out["wgmma decode large"] = wgmma_decode_tiles(split=split, large=True)
    out["wgmma decode small"] = wgmma_decode_tiles(split=split, large=False)
    out["wgmma tiles"] = wgmma_tiles(split=1, pdl=False)
    out["table gemm again"] = default
    return out


WGMMA_SMALL_FORMS = ((16, 2, 2), (16, 3, 2), (16, 3, 1), (32, 3, 2))
"""``PROBE_SET=21``: (row block, ring stages, steps a copy group holds) of the warpgroup
kernel at 9-16 pairs an expert, after ``PROBE_SET=20`` found the 16-row decode form
ahead of the table at Mixtral M = 36-60."""


def _set_21(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=21`` (the module docstring): 16-row warpgroup forms at 9-16 pairs."""
    return _wgmma_rings(default, out, list(WGMMA_SMALL_FORMS))


def _set_22(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=22`` (the module docstring): the 32-row decode form's w2 split."""
    for stages in (3, 4):
        form = attrs.evolve(
            MMA_TILES, block_n=64, num_warps=4, num_stages=stages, copy_steps=2,
            wgmma=True,
        )  # fmt: skip
        for split in (1, 2, 4):
            out[f"wgmma bm32 st{stages}x2 w2 split {split}"] = MoETiles(
                block_m=32, w13=form, w2=attrs.evolve(form, split_k=split), pdl=True
            )
    out["table gemm again"] = default
    return out


def _set_23(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=23`` (the module docstring): the 32-row gated w13 at 128 registers.

    A key with ``nreg128`` launches its gated w13 with ``maxnreg=128`` (``probe_mma.py``
    patches the launch): at 2 stages 4 programs a multiprocessor instead of 3 (164
    registers), at the cost of 128 bytes of spills (offline sm_90); at 3 stages the
    ring's 64 KB of shared memory still allows only 3 (the spills' cost alone). w2 as ``default``'s where it is
    the warpgroup kernel's, else the 32-row decode form's.
    """
    w2 = default.w2 if default.w2.wgmma else attrs.evolve(WGMMA_TILES, split_k=1)
    for stages in (2, 3):
        w13 = attrs.evolve(WGMMA_TILES, num_stages=stages)
        tiles = MoETiles(block_m=32, w13=w13, w2=w2, pdl=default.pdl)
        out[f"wgmma bm32 w13 st{stages}"] = tiles
        out[f"wgmma bm32 w13 st{stages} nreg128"] = tiles
    out["table gemm again"] = default
    return out


def _set_24(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=24`` (the module docstring): w2 in 128-row tiles of 8 warps.

    Two warpgroups share a step's activation staging: 246 SASS a 64-code step against
    278 for 64 x 128 on 4 warps (offline sm_90). The rest as ``default``'s, where its
    w2 is the warpgroup kernel's.
    """
    if default.w2.wgmma:
        wide = attrs.evolve(default.w2, block_n=128, num_warps=8)
        out["wgmma w2 128x8"] = attrs.evolve(default, w2=wide)
    out["table gemm again"] = default
    return out


def _set_17(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=17`` (the module docstring)."""
    for bm in (16, 32):
        for bn, warps in ((64, 4), (128, 8)):
            form = attrs.evolve(
                MMA_TILES, block_n=bn, num_warps=warps, num_stages=1,
                copy_steps=1, wgmma=True,
            )  # fmt: skip
            tiles = MoETiles(
                block_m=bm,
                w13=attrs.evolve(form, split_k=1),
                w2=attrs.evolve(form, split_k=default.w2.split_k),
                pdl=default.pdl,
            )
            out[f"wgmma bm{bm} {bn} w{warps}"] = tiles
            out[f"wgmma bm{bm} {bn} w{warps} sync"] = tiles
    out["table gemm again"] = default
    return out


def _set_15(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=15`` (the module docstring)."""
    out |= with_splits(default, [(a, b) for a in (1, 2, 3) for b in (2, 3, 4, 5, 6, 8)])
    out["table gemm again"] = default
    return out


def _set_14(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=14`` (the module docstring)."""
    w2 = default.w2
    for bm, stages, copy in ((16, 2, 2), (32, 2, 2), (32, 3, 1)):
        form = attrs.evolve(
            MMA_TILES, block_n=64, num_stages=stages, copy_steps=copy,
            x_shared=True,
        )  # fmt: skip
        for split2 in sorted({w2.split_k, max(1, w2.split_k // 2)}):
            out[f"xs bm{bm} n64 ring{stages}x{copy} w2 split {split2}"] = MoETiles(
                block_m=bm,
                w13=attrs.evolve(form, split_k=1),
                w2=attrs.evolve(form, split_k=split2),
                pdl=default.pdl,
            )
    out["table gemm again"] = default
    return out


def _set_13(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=13`` (the module docstring)."""
    pdl = attrs.evolve(default, pdl=not default.pdl)
    key = "table gemm " + ("without pdl" if default.pdl else "with pdl")
    out[key] = pdl
    out["table gemm again"] = default
    out[key + " again"] = pdl
    return out


def _set_12(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=12`` (the module docstring)."""
    w13, w2 = default.w13, default.w2
    form = attrs.evolve(MMA_TILES, num_stages=2, copy_steps=2, x_shared=True)
    out["xs bm16 ring2x2"] = MoETiles(
        block_m=16,
        w13=attrs.evolve(form, split_k=w13.split_k),
        w2=attrs.evolve(form, split_k=w2.split_k),
    )
    out["table gemm again"] = default
    return out


def _set_11(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=11`` (the module docstring)."""
    w13, w2 = default.w13, default.w2
    for bm, stages, copy in (
        (8, 2, 2),
        (16, 3, 1),
        (16, 2, 2),
        (32, 2, 2),
        (32, 3, 1),
    ):
        form = attrs.evolve(
            MMA_TILES, num_stages=stages, copy_steps=copy, x_shared=True
        )
        for split13 in (1, w13.split_k) if w13.split_k > 1 else (1,):
            out[f"xs bm{bm} ring{stages}x{copy} w13 split {split13}"] = MoETiles(
                block_m=bm,
                w13=attrs.evolve(form, split_k=split13),
                w2=attrs.evolve(form, split_k=w2.split_k),
            )
    out["auto again"] = None
    return out


def _set_9(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=9`` (the module docstring)."""
    w2 = default.w2
    ring16 = attrs.evolve(MMA_TILES, num_stages=MMA_RING_STAGES, copy_steps=1)
    for bm, form in ((8, MMA_TILES), (16, ring16)):
        for split13 in (1, 2, 4):
            for factor in (1, 2):
                split2 = min(8, w2.split_k * factor)
                out[f"bm{bm} w13 split {split13} w2 split {split2}"] = MoETiles(
                    block_m=bm,
                    w13=attrs.evolve(form, split_k=split13),
                    w2=attrs.evolve(form, split_k=split2),
                )
    out["auto again"] = None
    return out


def _set_8(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=8`` (the module docstring)."""
    w2 = default.w2
    splits2 = {min(8, w2.split_k * factor) for factor in (1, 2, 4)}
    out |= with_splits(default, [(a, b) for a in (1, 2, 4) for b in sorted(splits2)])
    out["auto again"] = None
    return out


def _set_7(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=7`` (the module docstring)."""
    w13, w2 = default.w13, default.w2
    for bn, warps, copy in ((64, 4, 2), (64, 4, 4), (64, 2, 2), (64, 2, 4)):
        out[f"bm8 {bn}x128 w{warps} ring2 copy{copy}"] = MoETiles(
            block_m=8,
            w13=attrs.evolve(
                w13, block_n=bn, num_warps=warps, num_stages=2, copy_steps=copy
            ),
            w2=attrs.evolve(
                w2, block_n=bn, num_warps=warps, num_stages=2, copy_steps=copy
            ),
        )
    out["auto again"] = None
    return out


def _set_6(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=6`` (the module docstring)."""
    w13, w2 = default.w13, default.w2
    ring = {"num_stages": 2, "copy_steps": 2}
    for label, factor in (("", 1), (" w2 split x2", 2), (" w2 split /2", 0)):
        split = w2.split_k * factor if factor else max(1, w2.split_k // 2)
        if factor == 0 and split == w2.split_k:
            continue
        out[f"bm8 ring2 copy2{label}"] = MoETiles(
            block_m=8,
            w13=attrs.evolve(w13, **ring),  # type: ignore[arg-type]
            w2=attrs.evolve(w2, split_k=split, **ring),  # type: ignore[arg-type]
        )
    out["auto again"] = None
    return out


def _set_5(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=5`` (the module docstring)."""
    w13, w2 = default.w13, default.w2
    for label, (bm, stages, copy) in COPY_GROUPS.items():
        out[label] = MoETiles(
            block_m=bm,
            w13=attrs.evolve(w13, num_stages=stages, copy_steps=copy),
            w2=attrs.evolve(w2, num_stages=stages, copy_steps=copy),
        )
    out["auto again"] = None
    return out


def _set_3(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=3`` (the module docstring)."""
    w13, w2 = default.w13, default.w2
    for bm in (8, 16):
        for stages in STAGES:
            out[f"mma bm{bm} stages {stages}"] = MoETiles(
                block_m=bm,
                w13=attrs.evolve(w13, num_stages=stages, copy_steps=1),
                w2=attrs.evolve(w2, num_stages=stages, copy_steps=1),
            )
    out["auto again"] = None
    return out


def _set_shapes(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """No ``PROBE_SET`` (or 2): the Gluon kernel's column tiles and warps."""
    w13, w2 = default.w13, default.w2
    second = os.environ.get("PROBE_SET") == "2"
    shapes = SHAPES_2 if second else SHAPES
    if default.block_m > 16 and not second:
        shapes = {**shapes, default.block_m: [(128, 4)]}
    for bm, tiles in shapes.items():
        for bn, warps in tiles:
            out[f"mma bm{bm} {bn} w{warps}"] = MoETiles(
                block_m=bm,
                w13=words(w13, mma=True, block_n=bn, warps=warps),
                w2=words(w2, mma=True, block_n=bn, warps=warps),
            )
            if second and (bn, warps) == (128, 4):
                out[f"mma bm{bm} {bn} w{warps} w2 split x2"] = MoETiles(
                    block_m=bm,
                    w13=words(w13, mma=True, block_n=bn, warps=warps),
                    w2=attrs.evolve(
                        words(w2, mma=True, block_n=bn, warps=warps),
                        split_k=2 * w2.split_k,
                    ),
                )
    out["auto again"] = None
    return out


_SETS = {
    "25": set_25,
    "24": _set_24,
    "23": _set_23,
    "22": _set_22,
    "21": _set_21,
    "20": _set_20,
    "19": _set_19,
    "18": _set_18,
    "17": _set_17,
    "16": _set_16,
    "15": _set_15,
    "14": _set_14,
    "13": _set_13,
    "12": _set_12,
    "11": _set_11,
    "9": _set_9,
    "8": _set_8,
    "7": _set_7,
    "6": _set_6,
    "5": _set_5,
    "3": _set_3,
}
"""``PROBE_SET``: the function that adds its variants (others: ``_set_shapes``)."""
