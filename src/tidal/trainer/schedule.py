"""The RL learning-rate schedule: linear warm-up, then constant, cosine or linear decay.

A pure function of (config, optimizer step), so a resumed run continues on the same curve and
the schedule is tested without a model. Decay matters for RL more than for pre-training: late in
a run most groups are solved or hopeless, the few informative ones pull hard, and a constant
rate lets a sharpened policy step out of the region where its samples are valid code (issue 17:
a constant 3e-4 run collapsed after step 140).
"""

from __future__ import annotations

import math


def lr_at(cfg, version: int) -> float:
    """cfg.lr (a TrainerConfig) at optimizer step ``version`` (0-based): ramps linearly over
    cfg.warmup_steps, then follows cfg.lr_schedule over cfg.decay_steps down to
    cfg.lr * cfg.min_lr_ratio and stays there; cfg.decay_steps 0 keeps cfg.lr."""
    decay_steps = cfg.decay_steps
    if version < cfg.warmup_steps:
        return cfg.lr * (version + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant" or decay_steps <= 0:
        return cfg.lr
    progress = min(1.0, (version - cfg.warmup_steps) / decay_steps)
    if cfg.lr_schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape)
