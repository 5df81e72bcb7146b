"""The dequant path with its chunks overlapped on a side stream, against serial chunks.

Run on the GPU from the repository root: ``python bench/probe_dequant_overlap.py
[model ...]`` (``PROBE_M=1024,4096`` for other sizes; default 1024 and 4096). For
each model shape and M it times ``fused_moe(path="dequant")`` eagerly (as
``bench_gpu.py`` times prefill cells: ``triton.testing.do_bench``, median ms), each
output checked against the float32 reference first: serial chunks in one 1 GiB
buffer (``DEQUANT_OVERLAP`` off, the path before it), the next chunk dequantized on
a side stream into a second buffer while this chunk's GEMMs run (``DEQUANT_OVERLAP``,
two buffers of 512 MiB), the same with the side stream at high priority, the same
with two buffers of 1 GiB, and the first two again.
"""

# ruff: noqa: D103
# A GPU script, not library code: print is its output.

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import probe_inputs, probe_models, probe_variant

import backends.triton._configs as configs
from backends.triton._fused import fused_moe

GIB = 1 << 30
VARIANTS: dict[str, tuple[bool, int, int]] = {  # overlap, scratch bytes, priority
    "serial 1 GiB": (False, GIB, 0),
    "overlap 2 x 512 MiB": (True, GIB, 0),
    "overlap high priority": (True, GIB, -1),
    "overlap 2 x 1 GiB": (True, 2 * GIB, 0),
    "serial again": (False, GIB, 0),
    "overlap again": (True, GIB, 0),
}


def cell(name: str, m: int, layer: tuple[Any, ...], bw: float, tag: str = "") -> None:
    """Every variant of one model and M on one routing draw."""
    cfg, _, w13, w2 = layer
    x, r, fl, ref = probe_inputs(name, m, layer, bw)
    for key, setting in VARIANTS.items():

        def run(chosen: tuple[bool, int, int] = setting) -> torch.Tensor:
            overlap, scratch, priority = chosen
            configs.DEQUANT_OVERLAP = overlap  # type: ignore[misc]  # a probe's switch
            configs.DEQUANT_SCRATCH_BYTES = scratch  # type: ignore[misc]
            configs.DEQUANT_STREAM_PRIORITY = priority  # type: ignore[misc]
            return fused_moe(x, w13, w2, r, cfg, path="dequant")

        probe_variant(f"{name:15s} M={m:5d}{tag}", key, run, ref, fl, replay=False)


def main() -> None:
    probe_models(cell, "1024,4096")


if __name__ == "__main__":
    main()
