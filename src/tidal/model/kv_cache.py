"""Per-slot key/value cache shared by the model (writes, reads) and the engine (owns slots).

Layout: ``k[layer]`` and ``v[layer]`` are [num_slots, num_kv_heads, max_len, head_dim]. A slot
holds one sequence; position p of that sequence lives at index p. The engine assigns slots to
requests and frees them; the model writes the keys/values of the tokens it is given at the
positions it is given and attends, for a query at position p, to positions 0..p of the same slot.
"""

from __future__ import annotations

import torch

from tidal.numerics.ops import KEY_BLOCK


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        shape = (num_slots, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots
        self.max_len = max_len

    @classmethod
    def for_model(cls, model_cfg, num_slots: int, max_len: int, dtype=None, device="cpu") -> "KVCache":
        """A cache for ``max_len`` positions, rounded up to whole key blocks: the deterministic
        forward reads keys in blocks of ``tidal.numerics.ops.KEY_BLOCK``."""
        dt = dtype or getattr(torch, model_cfg.dtype)
        blocks = -(-max_len // KEY_BLOCK)
        return cls(
            model_cfg.num_hidden_layers, num_slots, model_cfg.num_key_value_heads,
            blocks * KEY_BLOCK, model_cfg.head_dim, dt, device,
        )
