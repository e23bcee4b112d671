"""The engine's prefill: feed consecutive slots' tokens into the KV cache in right-padded
forwards of at most ``max_prefill_tokens`` padded tokens each (pad positions = -1), starting
where each slot's cache already holds its prefix (chunked prefill: the cached forward writes and
reads by position, so this is bitwise a full prefill in deterministic mode).
"""

from __future__ import annotations

import torch
from torch import nn

from tidal.engine.config import EngineConfig
from tidal.engine.slots import SlotState


def prefill_forward(
    model: nn.Module, state: SlotState, cfg: EngineConfig, first_slot: int, lengths: list[int],
    want_experts: bool, starts: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Feed ``state.tokens[slot, start:length]`` of slots ``first_slot, first_slot + 1, ...``
    into the cache (``starts``: positions already cached, default 0), in right-padded groups
    of at most ``cfg.max_prefill_tokens`` padded tokens.

    Returns the logits [n, V] (and experts [n, layers, k] if asked) at each last position.
    With experts, the routing of every earlier prompt position is recorded too (slot index
    p + 1 holds position p's experts, as for completion tokens), so a trainer can replay the
    whole sequence.
    """
    device = state.device
    deterministic = cfg.numerics == "deterministic"
    starts = starts or [0] * len(lengths)
    spans = [n - s for n, s in zip(lengths, starts)]
    last_logits, last_experts = [], []
    for group in pack(spans, cfg.max_prefill_tokens):
        # Groups are consecutive runs of indices, so their slots are a range too.
        slots = range(first_slot + group[0], first_slot + group[-1] + 1)
        group_len = torch.tensor([lengths[i] for i in group], device=device)
        group_start = torch.tensor([starts[i] for i in group], device=device)
        width = max(spans[i] for i in group)
        steps = torch.arange(width, device=device) + group_start.unsqueeze(1)  # [n, width]
        positions = torch.where(steps < group_len.unsqueeze(1), steps, -1)
        rows = slice(slots.start, slots.stop)
        if any(starts[i] for i in group):
            input_ids = state.tokens[rows].gather(1, steps.clamp(max=cfg.max_seq_len - 1))
        else:
            input_ids = state.tokens[rows, :width]
        last = group_len - group_start - 1
        out = model(
            input_ids, positions=positions, cache=state.cache, slots=slots,
            return_experts=want_experts, logits_at=last, deterministic=deterministic,
        )
        logits, experts = out if want_experts else (out, None)
        last_logits.append(logits)
        if experts is not None:
            # Position p's routing goes to index p + 1; padding columns (position -1) land on
            # index 0, which holds nothing.
            slot_rows = torch.arange(slots.start, slots.stop, device=device).unsqueeze(1)
            state.experts[slot_rows, positions + 1] = experts.to(torch.int32)
            last_experts.append(experts[torch.arange(len(group), device=device), last])
    return torch.cat(last_logits), (torch.cat(last_experts) if last_experts else None)


def pack(lengths: list[int], budget: int) -> list[list[int]]:
    """Split indices 0..n-1 into consecutive groups whose padded size (count x longest) stays
    within ``budget``; a single over-budget item forms a group alone."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups
