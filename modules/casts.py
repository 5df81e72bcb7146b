"""What ``.to``, ``.half()`` and the like may do to Int4MoE's buffers (``_apply``).

May import core and modules.buffers.
"""

from collections.abc import Callable, Mapping
from typing import Any

import torch

from core.errors import DTypeError
from core.validate import ACTIVATION_DTYPES, check_cast_fits
from modules.buffers import FLOAT_BUFFERS


def check_cast(
    fn: Callable[..., Any], buffers: Mapping[str, torch.Tensor | None]
) -> None:
    """Raise, before anything moves, for a cast ``fn`` the buffers cannot take.

    Raises:
        DTypeError: for a cast that would leave the scales in a dtype no backend
            reads (``.double()``), or that would convert the integer buffers
            (``.type(torch.float16)``).
        ShapeError: for a cast that scales or expert biases do not fit (values
            overflowing; for scales also nonzero ones rounding to 0, as bf16 scales
            below fp16's range do under ``.half()``).
    """
    scale = buffers["w13_scale"]
    assert scale is not None  # every layer has scales
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
    if not isinstance(probe, torch.Tensor) or probe.dtype == scale.dtype:
        return
    if probe.dtype not in ACTIVATION_DTYPES:
        raise DTypeError(
            f"Int4MoE cannot be cast to {probe.dtype}: its scales (w13_scale, "
            "w2_scale) must stay float32, float16 or bfloat16; this layer was "
            "not cast (modules cast before it in the same call were)"
        )
    for name in FLOAT_BUFFERS:
        tensor = buffers.get(name)
        if tensor is not None:
            check_cast_fits(
                f"{name} (cast to {probe.dtype}; this layer was not cast)",
                tensor,
                probe.dtype,
                underflow=not name.endswith("_bias"),  # a bias rounding to 0 is moot
            )
