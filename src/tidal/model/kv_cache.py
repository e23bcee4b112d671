"""Per-slot key/value cache shared by the model (writes, reads) and the engine (owns slots), and
the plan of one forward's cache traffic (``make_plan``).

Layout: ``k[layer]`` and ``v[layer]`` are [num_slots, num_kv_heads, max_len, head_dim]. A slot
holds one sequence; position p of that sequence lives at index p. The engine assigns slots to
requests and frees them; the model writes the keys/values of the tokens it is given at the
positions it is given and attends, for a query at position p, to positions 0..p of the same slot.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class CachePlan:
    """How this forward's tokens go into the cache and what they attend to (built once, used by
    every layer).

    rows: the batch's cache rows: a slice (contiguous slots: read as a view) or slot ids [B].
    kv_len: keys read per row (longest position in the batch + 1).
    chunk_start: set when rows is a slice and every row holds positions chunk_start ..
        chunk_start + T - 1 (a decode step at one position, a fresh prefill of equal prompts):
        the new keys are written through one slice. None otherwise.
    causal_new: chunk_start == 0: the queries attend causally to the new keys alone, no cache
        read, no mask.
    write_slots/write_pos [N]: otherwise, cache slot and position of each written token, in
        row-major order (take None) or of the (row, column) pairs in ``take`` (padding skipped).
    mask [B, 1, T, kv_len] or None (chunks of one token, causal_new): True where a query may
        attend a cached key.
    rope_positions [B, T]: positions with padding clamped to 0 (its output is garbage anyway).
    """

    rows: slice | torch.Tensor
    kv_len: int
    chunk_start: int | None
    causal_new: bool
    write_slots: torch.Tensor | None
    write_pos: torch.Tensor | None
    take: tuple[torch.Tensor, torch.Tensor] | None
    mask: torch.Tensor | None
    rope_positions: torch.Tensor

    def through_cache(self, kc, vc, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new keys/values k, v [B, T, kv_heads, D] into one layer's cache kc, vc
        [slots, kv_heads, max_len, D]; return what the queries attend to [B, kv_heads, L, D]:
        the new keys themselves (causal_new) or each row's cache up to kv_len."""
        if self.chunk_start is None:
            if self.take is None:
                new_k, new_v = k.flatten(0, 1), v.flatten(0, 1)
            else:
                new_k, new_v = k[self.take], v[self.take]
            kc[self.write_slots, :, self.write_pos] = new_k.to(kc.dtype)
            vc[self.write_slots, :, self.write_pos] = new_v.to(vc.dtype)
            read_k, read_v = kc[self.rows, :, : self.kv_len], vc[self.rows, :, : self.kv_len]
            return read_k.to(k.dtype), read_v.to(v.dtype)
        # One strided copy per tensor into the window the queries then read (views, no gather).
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, kv_heads, T, D]
        first, count = self.rows.start, self.rows.stop - self.rows.start
        start, kv_len = self.chunk_start, self.kv_len
        read_k = kc.narrow(0, first, count).narrow(2, 0, kv_len)
        read_v = vc.narrow(0, first, count).narrow(2, 0, kv_len)
        read_k.narrow(2, start, kv_len - start).copy_(k)
        read_v.narrow(2, start, kv_len - start).copy_(v)
        if self.causal_new:
            return k, v
        if read_k.dtype != k.dtype:
            read_k, read_v = read_k.to(k.dtype), read_v.to(v.dtype)
        return read_k, read_v


def make_plan(cache: KVCache, slots: torch.Tensor | range | None, positions: torch.Tensor) -> CachePlan:
    """Validate slots/positions against the cache (clear errors) and plan the cache traffic."""
    b, t = positions.shape
    if isinstance(slots, range):
        if len(slots) != b or slots.step != 1 or slots.start < 0 or slots.stop > cache.num_slots:
            raise ValueError(
                f"slots {slots} must be {b} consecutive slots within [0, {cache.num_slots})"
            )
        rows: slice | torch.Tensor = slice(slots.start, slots.stop)
    else:
        if slots is None or slots.shape != (b,):
            got = None if slots is None else tuple(slots.shape)
            raise ValueError(f"a cache needs slots of shape [B] = {(b,)} (or a range), got {got}")
        if int(slots.min()) < 0 or int(slots.max()) >= cache.num_slots:
            raise ValueError(f"slots must lie in [0, {cache.num_slots}), got {slots.tolist()}")
        rows = slots
    low, high = (int(p) for p in torch.aminmax(positions))
    kv_len = max(high + 1, 1)
    if kv_len > cache.max_len:
        raise ValueError(
            f"position {kv_len - 1} does not fit the KV cache (max_len {cache.max_len})"
        )
    device = positions.device
    if isinstance(rows, slice) and low >= 0 and high - low == t - 1 and (
        t == 1 or torch.equal(positions, torch.arange(low, high + 1, device=device).expand(b, t))
    ):
        mask = None
        if t > 1 and low > 0:
            mask = torch.arange(kv_len, device=device) <= positions[0].view(t, 1)  # [T, kv_len]
        return CachePlan(rows, kv_len, low, low == 0, None, None, None, mask, positions)
    if isinstance(rows, slice):
        slot_ids = torch.arange(rows.start, rows.stop, device=device)
    else:
        slot_ids = rows
    if low >= 0:
        take = None
        write_slots = slot_ids.repeat_interleave(t) if t > 1 else slot_ids
        write_pos = positions.flatten()
        rope_positions = positions
    else:
        take = (positions >= 0).nonzero(as_tuple=True)
        write_slots, write_pos = slot_ids[take[0]], positions[take]
        rope_positions = positions.clamp(min=0)
    # Padding queries (position < 0) see key 0 so that softmax stays finite.
    key_pos = torch.arange(kv_len, device=device)
    mask = key_pos.view(1, 1, 1, -1) <= rope_positions.view(b, 1, t, 1)
    return CachePlan(rows, kv_len, None, False, write_slots, write_pos, take, mask, rope_positions)


