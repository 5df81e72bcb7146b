"""GPTQ and AWQ packers and dequantizers written from the published format descriptions.

Independent of core.formats: plain Python integers, one element at a time (so slow; tiny
shapes only). GPTQ (AutoGPTQ ``QuantLinear.pack``): qweight ``[K/8, N]``, element
``8i + j`` of column n at bits ``4j`` of word ``(i, n)``; qzeros ``[K/G, N/8]`` packed
along N holding ``z - 1`` (v1). AWQ (AutoAWQ ``WQLinear_GEMM.from_linear``): qweight
``[K, N/8]``, nibble ``i`` of word ``(k, c)`` holds column ``8c + [0,2,4,6,1,3,5,7][i]``;
qzeros ``[K/G, N/8]`` the same way, storing ``z``.
"""

import torch

from core.formats import Int4Projection
from core.quantize import dequantize_packed
from core.scheme import Int4Mapping, Int4Scheme
from core.weights import QParams

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _to_int32(words: list[list[int]]) -> torch.Tensor:
    signed = [[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words]
    return torch.tensor(signed, dtype=torch.int32)


def _nibble(word: int, i: int) -> int:
    return ((word & 0xFFFFFFFF) >> (4 * i)) & 0xF


def gptq_pack(
    codes_KN: torch.Tensor, zeros_SN: torch.Tensor, *, v1: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """qweight from codes ``[K, N]`` (0..15) and qzeros from zero points ``[S, N]``."""
    q = codes_KN.tolist()
    k, n = len(q), len(q[0])
    qweight = [
        [sum(q[8 * i + j][c] << (4 * j) for j in range(8)) for c in range(n)]
        for i in range(k // 8)
    ]
    z = [[v - 1 if v1 else v for v in row] for row in zeros_SN.tolist()]
    qzeros = [
        [
            sum((row[8 * c + j] & 0xF) << (4 * j) for j in range(8))
            for c in range(n // 8)
        ]
        for row in z
    ]
    return _to_int32(qweight), _to_int32(qzeros)


def gptqmodel_v1_qzeros(qzeros_v2: torch.Tensor) -> torch.Tensor:
    """v2 ``qzeros`` to v1 as GPTQModel writes it: ``0x11111111`` subtracted from each
    whole word modulo 2^32, so a zero point of 0 borrows from the nibble above."""
    return _to_int32(
        [[(w - 0x11111111) % (1 << 32) for w in row] for row in qzeros_v2.tolist()]
    )


def gptq_dequantize(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    qzeros: torch.Tensor,
    g_idx: list[int],
    *,
    v1: bool = True,
) -> torch.Tensor:
    """``W[k, n] = scales[g, n] * (q - z)`` with ``g = g_idx[k]``, in the scale dtype."""
    words, zwords = qweight.tolist(), qzeros.tolist()
    k, n = 8 * len(words), len(words[0])
    q = [[_nibble(words[r // 8][c], r % 8) for c in range(n)] for r in range(k)]
    z = [
        [_nibble(row[c // 8], c % 8) + (1 if v1 else 0) for c in range(n)]
        for row in zwords
    ]
    q_t = torch.tensor(q, dtype=scales.dtype)
    z_t = torch.tensor(z, dtype=scales.dtype)[g_idx]
    return (q_t - z_t) * scales[g_idx]


def awq_pack(
    codes_KN: torch.Tensor, zeros_SN: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """qweight ``[K, N/8]`` and qzeros ``[S, N/8]``, interleaved."""

    def pack(rows: list[list[int]]) -> list[list[int]]:
        n = len(rows[0])
        return [
            [
                sum(row[8 * c + AWQ_ORDER[i]] << (4 * i) for i in range(8))
                for c in range(n // 8)
            ]
            for row in rows
        ]

    return _to_int32(pack(codes_KN.tolist())), _to_int32(pack(zeros_SN.tolist()))


def awq_dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``W[k, n] = (q - z) * s`` in the scale dtype, ``[K, N]``."""

    def unpack(rows: list[list[int]]) -> list[list[int]]:
        out = []
        for row in rows:
            vals = [0] * (8 * len(row))
            for c, word in enumerate(row):
                for i in range(8):
                    vals[8 * c + AWQ_ORDER[i]] = _nibble(word, i)
            out.append(vals)
        return out

    q = torch.tensor(unpack(qweight.tolist()), dtype=scales.dtype)
    z = torch.tensor(unpack(qzeros.tolist()), dtype=scales.dtype)
    z = z.repeat_interleave(group_size, dim=0)
    return (q - z) * scales.repeat_interleave(group_size, dim=0)


def dequantize_projection(proj: Int4Projection, dtype: torch.dtype) -> torch.Tensor:
    """Our dequantization of an imported projection, ``(..., N, K)`` in ``dtype``."""
    group = -1 if proj.group_size == proj.in_features else proj.group_size
    mapping = (
        Int4Mapping.SYMMETRIC if proj.zero_point is None else Int4Mapping.ASYMMETRIC
    )
    scheme = Int4Scheme(mapping=mapping, group_size=group)
    qparams = QParams(scale=proj.scale, zero_point=proj.zero_point)
    return dequantize_packed(proj.qdata, qparams, scheme, dtype=dtype)
