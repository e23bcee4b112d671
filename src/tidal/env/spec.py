"""EnvironmentSpec: what ``load_environment(**kwargs)`` returns — how to make episodes and tasks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tidal.env.base import Environment


class EnvTask(Protocol):
    """What the harness and orchestrator need of a task; environments add their own fields."""

    task_id: str
    prompt: str


@dataclass
class EnvironmentSpec:
    """A loaded environment.

    name: for logs and metrics.
    make: a fresh Environment for one episode (called once per episode; episodes run at once).
    sample_tasks: ``(n, seed, heldout) -> list[task]``, deterministic in its arguments; training
        (heldout=False) and held-out tasks never overlap.
    build_corpus: optional ``(n_docs, seed) -> list[str]``: mid-training documents from the
        training split (``tidal pretrain`` uses it when no corpus files are given).
    corpus_version: bump when the corpus text changes (part of the pretrain cache key).
    """

    name: str
    make: Callable[[], Environment]
    sample_tasks: Callable[[int, int, bool], list[Any]]
    build_corpus: Callable[[int, int], list[str]] | None = None
    corpus_version: int = 0
