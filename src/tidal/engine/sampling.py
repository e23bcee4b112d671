"""Batched temperature + nucleus (top-p) sampling; every row has its own temperature and top_p.

Logprob convention (the trainer relies on it):

    recorded logprob = log_softmax(logits / T)[token]      T > 0
                     = log_softmax(logits)[token]          T = 0 (greedy: token = argmax)

Both go through ``tidal.numerics.ops.scaled_log_softmax``, the op the trainer scores tokens with.

Top-p truncation only changes *which* tokens can be drawn; the recorded logprob is still that of
the temperature-scaled *full* distribution, not of the renormalised nucleus. With the default
top_p = 1 the two coincide. We record the full-distribution value because it is what a trainer
can recompute from its own logits without knowing the nucleus, so the importance ratio
new/old compares like with like; a run with top_p < 1 is slightly off-policy by design.
"""

from __future__ import annotations

import torch

from tidal.numerics.ops import scaled_log_softmax


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.

    logits: [B, V] float; temperature: [B] (0 = greedy); top_p: [B] in (0, 1]; uniforms: [B]
    in [0, 1), each row's random number (the engine reads them from each request's own stream).
    Returns (tokens [B] int64, logprobs [B] float32) per the convention in the module docstring.
    """
    logits = logits.float()
    greedy = temperature == 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = scaled_log_softmax(logits, scale.unsqueeze(1))  # [B, V]
    if bool(greedy.all()):
        tokens = logits.argmax(dim=-1)
    else:
        probs = logp.exp()
        if bool((top_p < 1).any()):
            probs = _nucleus(probs, top_p)
        tokens = _draw(probs, uniforms)
        tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample`` for a batch whose rows are all greedy (T = 0), without the per-row temperature
    and top-p machinery or its device sync: tokens = argmax, logprobs = log_softmax at them."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    logp = scaled_log_softmax(logits, 1.0)
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)


def request_stream(seed: int, length: int) -> torch.Tensor:
    """The random numbers [length] (float32 in [0, 1)) of a request seeded ``seed``: position p
    of its sequence samples with the p-th. A generator per request (~6 us at 256 positions, once
    per request) so that a request's draws are its own, whatever else runs beside it."""
    return torch.rand(length, generator=torch.Generator().manual_seed(seed))


def _draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of unnormalised probs [B, V] by inverse CDF of that row's uniform [B].

    ~8x faster than torch.multinomial on CPU (which this replaces) at the same distribution.
    Searching with right=True lands only on tokens of positive probability, except when
    rounding puts u at the very top; the clamp to the last positive token handles that.
    """
    cdf = probs.cumsum(dim=-1)
    u = uniforms.unsqueeze(1) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(1)
    positive = torch.arange(probs.shape[1], device=probs.device) * (probs > 0)
    return torch.minimum(tokens, positive.amax(dim=-1))


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every token outside the smallest top set whose mass reaches top_p (row-wise).

    The most likely token is always kept, so a row never ends up empty.
    """
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # [B, V]
    drop_sorted = mass_before >= top_p.unsqueeze(1)
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return probs.masked_fill(drop, 0.0)
