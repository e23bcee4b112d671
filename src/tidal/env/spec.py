"""EnvironmentSpec: what ``load_environment(...)`` returns — how to make episodes, tasks, a
mid-training corpus, and what counts as solving a task."""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from tidal.env.base import Environment


class EnvTask(Protocol):
    """What the harness and orchestrator need of a task; environments add their own fields."""

    task_id: str
    prompt: str


class OutsideEpisodes(Protocol):
    """Episodes run by an outside program (an extension such as tidal.gateway plugs in here):
    ``serve`` is opened once around a rollout call's episodes, on the engine client the harness
    runner built; what it yields makes each episode: ``(env, index, seed) -> episode`` with an
    ``async run(task) -> harness EpisodeResult``, ``env`` only grading what the program left."""

    def serve(self, client: Any, tokenizer: Any, engine_cfg: Any, window: int,
              no_experts: list[list[int]] | None) -> AbstractAsyncContextManager[Any]: ...


def reward_reaches_one(reward: float, info: dict[str, Any]) -> bool:
    """The default success rule: the episode's reward is at least 1.0."""
    return reward >= 1.0


@dataclass
class EnvironmentSpec:
    """A loaded environment.

    name: for logs and metrics.
    make: a fresh Environment for one episode (called once per episode; episodes run at once).
    sample_tasks: ``(n, seed, heldout) -> list[task]``, deterministic in its arguments; training
        (heldout=False) and held-out tasks never overlap.
    build_corpus: ``(n_docs, seed) -> list[str]``: mid-training documents from the training
        split, read by ``tidal pretrain`` and by ``tidal train`` before RL (unless
        ``pretrain.corpus`` names files); None = the environment has no corpus of its own.
    corpus_version: bump when the corpus text changes: it is part of the pretrain cache key.
    success: ``(reward, info) -> bool``: whether an episode solved its task (``info``: the
        episode's merged StepResult infos). Read once when an episode ends into
        ``Trajectory.solved``; every pass rate (held-out pass@1, a step's pass_rate, by level)
        counts it. Default: reward >= 1.0; override when the reward carries bonus or partial
        terms.
    outside: an outside program runs each episode (OutsideEpisodes; ``env.name = "harness"``:
        tidal.gateway serves it an OpenAI-compatible endpoint) and ``make``'s environment only
        grades its answer. None = tidal's own multi-turn loop drives ``make``'s environment.
    make_canary: ``(task, rng) -> task``: an impossible version of ``task`` (its visible tests
        contradict its specification, so any pass is cheating by construction), with
        ``canary = True`` and an id starting ``canary-``; what integrity checking mixes into
        training at its configured rate. None = the environment makes no canaries.
    tools: the environment speaks OpenAI chat messages and function calls (these tools, OpenAI's
        {"type": "function", "function": {...}} dicts): ``reset`` returns messages, ``step`` gets
        the assistant message (content and parsed ``tool_calls``) and returns its tool results as
        "tool" messages; gateway.tool_episode runs it through the chat template with the tools,
        as the gateway serves an outside harness. None = text turns (harness.episode).
    """

    name: str
    make: Callable[[], Environment]
    sample_tasks: Callable[[int, int, bool], list[Any]]
    build_corpus: Callable[[int, int], list[str]] | None = None
    corpus_version: int = 0
    success: Callable[[float, dict[str, Any]], bool] = reward_reaches_one
    make_canary: Callable[[Any, random.Random], Any] | None = None
    outside: OutsideEpisodes | None = None
    tools: list[dict] | None = None
