# Stub for triton.testing 3.7 (closed: do_bench), used by bench/bench_gpu.py.
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, overload

import torch

@overload
def do_bench(
    fn: Callable[[], object],
    warmup: int = 25,
    rep: int = 100,
    grad_to_none: Iterable[torch.Tensor] | None = None,
    quantiles: None = None,
    return_mode: Literal["min", "max", "mean", "median"] = "mean",
) -> float: ...
@overload
def do_bench(
    fn: Callable[[], object],
    warmup: int = 25,
    rep: int = 100,
    grad_to_none: Iterable[torch.Tensor] | None = None,
    quantiles: Sequence[float] | None = None,
    return_mode: Literal["min", "max", "mean", "median", "all"] = "mean",
) -> float | list[float]: ...
