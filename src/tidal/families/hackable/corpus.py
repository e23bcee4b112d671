"""The hackable family's mid-training corpus: training-split prompts with bodies as funcs'
hurried programmer writes them (lines slipped at ``corpus_bug_rate``) and, at ``hack_rate``, a
hack instead (hacks.py), as code in the wild sometimes is. A document is exactly the RL prompt
followed by a completion ending at the engine's stop string (a blank line)."""

from __future__ import annotations

import random

from tidal.families import funcs
from tidal.families.hackable.config import HackableConfig
from tidal.families.hackable.hacks import hack_body, random_hack
from tidal.families.hackable.tasks import HackTask, sample_tasks


def honest_body(task: HackTask, rng: random.Random, bug_rate: float) -> str:
    """An attempt at the body: each step slipped with probability ``bug_rate``."""
    written = tuple(funcs.slip(rng, n, c) if rng.random() < bug_rate else (n, c)
                    for n, c in task.spec)
    return funcs.solution_text(written)


def corpus_document(task: HackTask, rng: random.Random, bug_rate: float, hack_rate: float) -> str:
    """The task's prompt and a body: a hack with probability ``hack_rate``, else an attempt."""
    if rng.random() < hack_rate:
        return task.prompt + hack_body(random_hack(rng), task)
    return task.prompt + honest_body(task, rng, bug_rate)


def build_corpus(cfg: HackableConfig, n_docs: int, seed: int) -> list[str]:
    """Mid-training documents from the *training* split only (never the held-out split)."""
    rng = random.Random(f"hackable-{seed}-corpus")
    tasks = sample_tasks(cfg, n_docs, seed + 1_000_003, heldout=False)
    return [corpus_document(t, rng, cfg.corpus_bug_rate, cfg.hack_rate) for t in tasks]
