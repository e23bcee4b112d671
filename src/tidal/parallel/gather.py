"""Full weights out of and into FSDP2 shards, one parameter at a time: each rank all-gathers
one parameter, rank 0 copies it into its destination and drops it, so rank 0 never holds more
than its destination plus one parameter (the publisher and the checkpoint export use this; no
rank ever holds two full copies). ``scatter_from`` is the inverse."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

Destination = nn.Module | Callable[[str, torch.Tensor], None] | None


def _full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p


@torch.no_grad()
def gather_into(model: nn.Module, dest: Destination) -> None:
    """Collective: every parameter of the sharded ``model`` in full, one at a time, into ``dest``
    on the ranks that pass one (rank 0; the others pass None): a module whose parameters have
    the same names (copied in place, cast to its dtype, so whoever shares it sees the update),
    or a callback ``(name, full tensor)`` (a publisher; the tensor is freed after it returns)."""
    if isinstance(dest, nn.Module):
        targets = dict(dest.named_parameters())
        missing = [n for n, _ in model.named_parameters() if n not in targets]
        if missing:
            raise ValueError(f"gather_into: the destination has no parameter {missing[0]!r}")
        dest = lambda name, t: targets[name].copy_(t)
    for name, p in model.named_parameters():
        full = _full(p.detach())
        if dest is not None:
            dest(name, full)
        del full


@torch.no_grad()
def scatter_from(model: nn.Module, source: nn.Module | None) -> None:
    """Collective: rank 0's full ``source`` weights into the shards of ``model`` (every other
    rank passes None), one parameter at a time (FSDP2 shards dim 0 as torch.chunk does)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    named = dict(source.named_parameters()) if source is not None else {}
    for name, p in model.named_parameters():
        full = named[name].detach().float() if source is not None else torch.empty(p.shape)
        full = full.to(p.device).contiguous()
        dist.broadcast(full, src=0)
        local = p.to_local() if hasattr(p, "to_local") else p
        pieces = full.chunk(n, dim=0) if hasattr(p, "to_local") else [full] * n
        if local.numel():
            local.copy_(pieces[rank])
