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
        training split. Not read yet: ``tidal pretrain`` (``pretrain.loop.corpus_documents``)
        still builds the funcs family's corpus whatever ``env.name`` says; the ledger
        benchmark mid-trains on its own demonstrations.
    corpus_version: bump when the corpus text changes (meant for the pretrain cache key, which
        today uses the funcs family's GENERATOR_VERSION).
    """

    name: str
    make: Callable[[], Environment]
    sample_tasks: Callable[[int, int, bool], list[Any]]
    build_corpus: Callable[[int, int], list[str]] | None = None
    corpus_version: int = 0
