"""A rollout worker: an engine and an environment that turn an Assignment into Trajectories.

Plain class (unit tests drive it directly); ``pool.py`` places copies of it in threads or as Ray
actors. Before an assignment and — with in-flight updates — between decode steps, it loads the
newest published weights, so one sequence can span several policy versions; every token records
the version that produced it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from tidal.harness import run_episodes
from tidal.harness.seeds import derive_seed
from tidal.trajectory import Trajectory


@dataclass
class Assignment:
    """Part of one training step's tasks. ``group_ids`` index the step's GRPO groups."""

    assignment_id: int
    step: int
    tasks: list[Any]
    """Tasks of the run's environment (each has task_id and prompt)."""
    group_ids: list[int]
    min_version: int
    """The worker must hold at least this policy version before it generates."""


@dataclass
class Span:
    """A stretch of a worker's time: busy, wait_weights or wait_backpressure (absolute seconds)."""

    worker: int
    state: str
    start: float
    end: float


@dataclass
class RolloutResult:
    assignment_id: int
    step: int
    worker: int
    trajectories: list[Trajectory]
    generated_tokens: int
    generate_s: float
    grade_s: float
    spans: list[Span] = field(default_factory=list)


class RolloutWorker:
    def __init__(self, cfg, init_checkpoint: str, weights_root: str, worker_id: int,
                 cpus: list[int] | None = None):
        """``cpus``: pin this process to them first (only where the worker has a process of its
        own: a Ray actor, a remote pool's process)."""
        from tidal.engine.engine import Engine
        from tidal.env import from_config
        from tidal.model import from_pretrained, load_tokenizer
        from tidal.sandbox import Sandbox
        from tidal.sync.transport import open_weight_source

        if cpus:
            from tidal.hardware import pin_process

            pin_process(cpus)
        if cfg.run.worker_threads:
            torch.set_num_threads(cfg.run.worker_threads)
        self.cfg = cfg
        self.worker_id = worker_id
        self.dtype = getattr(torch, cfg.model.dtype)
        if cfg.engine.backend == "remote":  # an OpenAI-compatible server generates (docs/scale.md)
            from tidal.engine.remote.build import RemoteSetup, remote_engine

            self.engine = remote_engine(RemoteSetup.of(cfg), init_checkpoint, weights_root)
        else:
            model = from_pretrained(init_checkpoint, dtype=self.dtype)
            self.engine = Engine(model, load_tokenizer(init_checkpoint), cfg.engine, version=0)
        self.env = from_config(cfg.env, Sandbox(cfg.env.sandbox))
        self.store = open_weight_source(cfg.sync, weights_root)
        self.in_flight_updates = cfg.orchestrator.in_flight_updates

    def rollout(self, assignment: Assignment) -> RolloutResult:
        spans: list[Span] = []
        self._wait_for_version(assignment.min_version, spans)
        reload = (lambda: self._maybe_reload(spans)) if self.in_flight_updates else None
        t0 = time.time()
        try:
            trajs, stats = run_episodes(self.engine, self.env, assignment.tasks, self.cfg.harness,
                                        self.cfg.orchestrator.group_size, assignment.group_ids, reload,
                                        seed=derive_seed(self.cfg.run.seed, "rollout", assignment.step))
        except BaseException:
            # a failed rollout (weights unreachable mid-episode, a dead server) leaves requests
            # in the engine; the next assignment, or this one retried, starts on an empty one
            self.engine.abort_all()
            raise
        spans.append(Span(self.worker_id, "busy", t0, time.time()))
        return RolloutResult(assignment.assignment_id, assignment.step, self.worker_id, trajs,
                             stats.generated_tokens, stats.generate_s, stats.grade_s, spans)

    def _maybe_reload(self, spans: list[Span]) -> None:
        latest = self.store.latest_version()
        if latest is not None and latest > self.engine.version:
            t = time.time()
            self._load(latest)
            spans.append(Span(self.worker_id, "wait_weights", t, time.time()))

    def _wait_for_version(self, min_version: int, spans: list[Span]) -> None:
        t = time.time()
        while self.engine.version < min_version:
            latest = self.store.latest_version()
            if latest is not None and latest >= min_version:
                self._load(latest)
            else:
                time.sleep(0.01)
        if time.time() - t > 1e-3:
            spans.append(Span(self.worker_id, "wait_weights", t, time.time()))

    def _load(self, version: int) -> None:
        """Load ``version``, or the newest one if it was garbage-collected meanwhile."""
        from tidal.model import CheckpointError

        local = getattr(self.engine, "needs_local_weights", True)  # a tidal server pulls itself
        for attempt in range(5):
            try:
                model = self.store.load(version, self.dtype) if local else None
                break
            except (FileNotFoundError, CheckpointError):
                if attempt == 4:
                    raise
                version = self.store.latest_version()
        self.engine.load_weights(model, version)
