"""Held-out pass@1: the fraction of held-out tasks solved by one sample at the run's sampler.

Averaged over ``samples_per_task`` independent samples per task (an unbiased estimate of pass@1
with lower variance than a single sample), with the same sampler settings before and after RL.
"""

from __future__ import annotations

from collections import Counter

from tidal.orchestrator.rollout import sample_and_grade
from tidal.tasks import Task


def heldout_pass1(engine, sandbox, tasks: list[Task], samples_per_task: int = 2) -> dict:
    trajs, stats = sample_and_grade(engine, sandbox, tasks, samples_per_task)
    by_level: dict[int, list[float]] = {}
    for t in trajs:
        by_level.setdefault(int(t.info["level"]), []).append(t.reward)
    return {
        "pass1": sum(t.reward for t in trajs) / len(trajs),
        "pass1_by_level": {lvl: sum(r) / len(r) for lvl, r in sorted(by_level.items())},
        "reasons": dict(Counter(t.reason for t in trajs)),
        "tasks": len(tasks),
        "samples": len(trajs),
        "tokens_per_s": stats.generated_tokens / max(stats.generate_s, 1e-9),
    }
