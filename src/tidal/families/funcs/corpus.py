"""The funcs family's mid-training corpus: training-split prompts with solutions as a hurried
programmer writes them (some lines slipped), so RL has correctness left to learn."""

from __future__ import annotations

import random

from tidal.families.funcs.config import FuncsConfig
from tidal.families.funcs.tasks import Task, sample_tasks, slip, solution_text


def corpus_document(task: Task, rng: random.Random, bug_rate: float) -> str:
    """The task's prompt and a solution as a hurried programmer would write it."""
    written = tuple(slip(rng, n, c) if rng.random() < bug_rate else (n, c) for n, c in task.spec)
    return task.prompt + solution_text(written)


def build_corpus(cfg: FuncsConfig, n_docs: int, seed: int) -> list[str]:
    """Mid-training documents from the *training* split only (never the held-out split)."""
    rng = random.Random(f"{seed}-corpus")
    tasks = sample_tasks(cfg, n_docs, seed + 1_000_003, heldout=False)
    return [corpus_document(t, rng, cfg.corpus_bug_rate) for t in tasks]
