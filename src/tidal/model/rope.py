"""Rotary position embedding (HF Qwen3 "default" RoPE) from a per-position table.

The table holds cos and a sign-folded sin for every integer position, computed once in fp32 and
cast once per dtype; a forward looks its positions up with one gather instead of rebuilding the
angles (~10 small ops). It is a plain attribute, not a buffer, so casting a model to bf16 or
building it on the meta device cannot degrade it, and it is never saved.

Rotation: HF writes ``x * cos + rotate_half(x) * sin`` with rotate_half(x) = cat(-x2, x1). We
store sin_signed = cat(-sin1, sin2) and write ``x * cos + x.roll(D/2) * sin_signed``: x.roll(D/2)
= cat(x2, x1), and (-a) * b == a * (-b) exactly in IEEE arithmetic, so the result is bit-identical
with one op (roll) in place of three (slice, neg, cat).
"""

from __future__ import annotations

import torch


class RopeTable:
    """cos, sin_signed [positions, D] per (device, dtype), grown on demand to the longest position
    asked for (in powers of two, so a growing sequence rebuilds it a few times at most)."""

    def __init__(self, head_dim: int, theta: float):
        self.head_dim = head_dim
        self.theta = theta
        self._tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # [n, 2, D]

    def lookup(
        self, positions: torch.Tensor, dtype: torch.dtype, needed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin_signed [*positions.shape, D] for non-negative integer positions, all below
        ``needed`` (the caller knows the largest: it is checked against the cache or the length)."""
        both = self._table(positions.device, dtype, needed)[positions]  # [..., 2, D]
        return both[..., 0, :], both[..., 1, :]

    def span(
        self, start: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin_signed [length, D] of positions start .. start + length - 1 (a view)."""
        both = self._table(device, dtype, start + length)[start : start + length]
        return both[:, 0], both[:, 1]

    def _table(self, device: torch.device, dtype: torch.dtype, needed: int) -> torch.Tensor:
        key = (device, dtype)
        table = self._tables.get(key)
        if table is None or table.shape[0] < needed:
            table = self._tables[key] = self._build(device, needed).to(dtype)
        return table

    def _build(self, device: torch.device, needed: int) -> torch.Tensor:
        n = 1 << max(needed - 1, 0).bit_length()
        d = self.head_dim
        exponent = torch.arange(0, d, 2, dtype=torch.float, device=device) / d
        inv_freq = 1.0 / (self.theta**exponent)
        freqs = torch.arange(n, device=device).float()[:, None] * inv_freq  # [n, D/2]
        cos, sin = freqs.cos(), freqs.sin()
        return torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [..., D] rotated; cos/sin_signed broadcast against x (see the module docstring)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed
