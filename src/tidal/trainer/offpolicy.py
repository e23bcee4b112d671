"""Off-policy corrections: per-token loss weights from the behaviour/proximal importance ratio.

    w_t = pi_prox(token t) / pi_behaviour(token t)     (detached; pi_behaviour = the engine's)

Each correction turns w into a weight rho_t that multiplies the token's PPO-clip term (the PPO
ratio itself is pi_theta / pi_prox: decoupled PPO). trainer/config.py's OffPolicyConfig defines
the choices; the formulas are here, each checked against a hand-computed case in
tests/test_offpolicy.py.
"""

from __future__ import annotations

import torch

from tidal.trainer.config import OffPolicyConfig
from tidal.trainer.stats import OffPolicyStats


def behaviour_weights(
    prox_lp: torch.Tensor, behaviour_lp: torch.Tensor, mask: torch.Tensor, cfg: OffPolicyConfig
) -> tuple[torch.Tensor, OffPolicyStats]:
    """rho [B, T] (0 where mask is 0) and counts over the masked-in tokens: ``is_masked_tokens``
    (rho set to 0 by the correction), ``is_truncated_tokens`` (w capped), ``is_weight_mean``
    (mean rho). prox_lp, behaviour_lp, mask: [B, T]; rows are sequences (segments)."""
    if cfg.kind == "none":
        raise ValueError("behaviour_weights needs a correction; off_policy.kind is 'none'")
    mask = mask.float()
    with torch.no_grad():
        log_w = (prox_lp.detach() - behaviour_lp) * mask
        w = torch.exp(log_w)
        keep = mask > 0
        truncated = torch.zeros_like(keep)
        if cfg.kind == "decoupled":
            rho = w
        elif cfg.kind == "truncated_is":
            truncated = keep & (w > cfg.is_cap)
            rho = w.clamp(max=cfg.is_cap)
        elif cfg.kind == "masked_is":
            keep = keep & (w >= cfg.mask_low) & (w <= cfg.mask_high)
            rho = w
        else:  # geo_mask
            tokens = mask.sum(dim=1, keepdim=True)
            geo_mean = torch.exp(log_w.sum(dim=1, keepdim=True) / tokens.clamp(min=1.0))
            keep = keep & (geo_mean >= cfg.geo_low) & (geo_mean <= cfg.geo_high)
            truncated = keep & (w > cfg.is_cap)
            rho = w.clamp(max=cfg.is_cap)
        rho = rho * keep.float()
        n = mask.sum().clamp(min=1.0)
        stats = OffPolicyStats(
            is_masked_tokens=float((mask.bool() & ~keep).sum()),
            is_truncated_tokens=float(truncated.sum()),
            is_weight_mean=float(rho.sum() / n),
        )
    return rho, stats
