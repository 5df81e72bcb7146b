"""``PROBE_SET=25`` of ``bench/probe_mma.py``: the warpgroup kernel's input ring.

A GPU script's data, not library code: tiles built from the table's, keyed by label.
"""

import attrs

from backends.triton._tiles import MoETiles


def set_25(
    default: MoETiles, out: dict[str, MoETiles | None]
) -> dict[str, MoETiles | None]:
    """``PROBE_SET=25`` (the module docstring): the input ring of logical K order."""
    w13, w2 = default.w13, default.w2
    if not (w13.wgmma and w2.wgmma and w2.num_stages > 1):
        return out  # the table's form here is not the warpgroup ring
    out["registers"] = attrs.evolve(  # the input through registers, as before
        default,
        w13=attrs.evolve(w13, x_shared=False),
        w2=attrs.evolve(w2, x_shared=False),
    )
    out["x ring w2"] = attrs.evolve(default, w2=attrs.evolve(w2, x_shared=True))
    out["x ring both"] = attrs.evolve(
        default,
        w13=attrs.evolve(w13, x_shared=True),
        w2=attrs.evolve(w2, x_shared=True),
    )
    for stages, copy in ((2, 1), (3, 1), (4, 1), (2, 2), (3, 2)):
        ring = {"num_stages": stages, "copy_steps": copy, "x_shared": True}
        out[f"x ring both {stages}x{copy}"] = attrs.evolve(
            default,
            w13=attrs.evolve(w13, **ring),  # type: ignore[arg-type]
            w2=attrs.evolve(w2, **ring),  # type: ignore[arg-type]
        )
    out["auto again"] = None
    return out
