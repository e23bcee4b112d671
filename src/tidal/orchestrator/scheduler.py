"""Which assignments exist and where each one is: the orchestrator's planning and dispatch state.

    plan(trainer_version)   queue the assignments of every step the staleness bound now allows
    dispatch(now)           hand queued assignments to idle workers, one each, oldest first
    complete(worker, r)     the result of the assignment the worker held
    fail(worker, error)     re-queue that assignment (first in line, for the replaced worker or
                            any other), or stop the run once it failed max_attempts times
    ready(step) / take(step)  whether all of a step's assignments are back; its results by id

Pure state: no threads, no pool, no clock. Callers pass ``now`` (time.time()), used only to say
how long a worker waited for work (the wait_backpressure span of the report's timeline).
Invariants, each tested in tests/test_scheduler.py: step s is planned only once
s <= trainer_version + max_staleness; every assignment is at any moment queued, running, done
or taken, never two of them; an assignment is dispatched again only after it failed; a step's
results are taken once, when all of its assignments are done.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from tidal.orchestrator.pool import OrchestratorError
from tidal.orchestrator.worker import Assignment, RolloutResult, Span

MAX_ATTEMPTS = 3
"""Times one assignment is tried (on fresh workers) before the run stops with an error."""

Planner = Callable[[int, int], list[Assignment]]
"""planner(step, first_id) -> the step's assignments, with ids first_id, first_id + 1, ..."""


@dataclass
class Dispatch:
    """An assignment handed to a worker, and the worker's wait for it since it was last idle."""

    worker: int
    assignment: Assignment
    waited: Span


def split_step(tasks: list, step: int, first_id: int, num_workers: int,
               max_staleness: int) -> list[Assignment]:
    """One assignment per worker (fewer if tasks are few), tasks dealt round-robin; each needs
    policy version step − max_staleness or newer."""
    parts = min(num_workers, len(tasks))
    min_version = max(0, step - max_staleness)
    out = []
    for p in range(parts):
        idx = list(range(p, len(tasks), parts))
        out.append(Assignment(first_id + p, step, [tasks[i] for i in idx], idx, min_version))
    return out


class Scheduler:
    """Steps first_step .. steps − 1, planned within the staleness bound, run on num_workers."""

    def __init__(self, planner: Planner, num_workers: int, steps: int, max_staleness: int,
                 first_step: int = 0, now: float = 0.0, max_attempts: int = MAX_ATTEMPTS):
        self.planner = planner
        self.num_workers = num_workers
        self.steps = steps
        self.max_staleness = max_staleness
        self.max_attempts = max_attempts
        self.next_step = first_step
        """The next step to plan."""
        self.next_id = 0
        """The id of the next assignment planned."""
        self.queue: deque[Assignment] = deque()
        """Assignments waiting for a worker, next first."""
        self.running: dict[int, Assignment] = {}
        """worker -> the assignment it is running."""
        self.failures: Counter[int] = Counter()
        """assignment id -> times it failed."""
        self.results: dict[int, list[RolloutResult]] = {}
        """step -> the results back so far, for every planned step not yet taken."""
        self.expected: dict[int, int] = {}
        """step -> its number of assignments, for every planned step not yet taken."""
        self.idle_since = dict.fromkeys(range(num_workers), now)
        """worker -> when it last became idle."""

    def plan(self, trainer_version: int) -> list[int]:
        """Queue every step s with s <= trainer_version + max_staleness not planned yet; returns them."""
        planned = []
        while self.next_step < self.steps and self.next_step <= trainer_version + self.max_staleness:
            assignments = self.planner(self.next_step, self.next_id)
            self.next_id += len(assignments)
            self.queue.extend(assignments)
            self.expected[self.next_step] = len(assignments)
            self.results[self.next_step] = []
            planned.append(self.next_step)
            self.next_step += 1
        return planned

    def dispatch(self, now: float) -> list[Dispatch]:
        """Queued assignments for the idle workers, lowest worker index first."""
        out = []
        for w in range(self.num_workers):
            if self.queue and w not in self.running:
                a = self.queue.popleft()
                self.running[w] = a
                out.append(Dispatch(w, a, Span(w, "wait_backpressure", self.idle_since[w], now)))
        return out

    def complete(self, worker: int, result: RolloutResult, now: float) -> None:
        """``worker`` finished the assignment it held with ``result``."""
        a = self.running.pop(worker)
        if result.assignment_id != a.assignment_id:
            raise ValueError(f"worker {worker} returned assignment {result.assignment_id}, "
                             f"but it was running {a.assignment_id}")
        self.idle_since[worker] = now
        self.results[a.step].append(result)

    def fail(self, worker: int, error: BaseException, now: float) -> Assignment:
        """``worker`` failed (it is being replaced): its assignment goes back to the front of the
        queue, or, after max_attempts failures, the run stops with an OrchestratorError."""
        a = self.running.pop(worker)
        self.idle_since[worker] = now
        self.failures[a.assignment_id] += 1
        if self.failures[a.assignment_id] >= self.max_attempts:
            raise OrchestratorError(f"assignment {a.assignment_id} (step {a.step}) failed "
                                    f"{self.max_attempts} times; last error: {type(error).__name__}: {error}")
        self.queue.appendleft(a)
        return a

    def ready(self, step: int) -> bool:
        """Planned, not taken, and every one of its assignments is back."""
        return step in self.expected and len(self.results[step]) == self.expected[step]

    def take(self, step: int) -> list[RolloutResult]:
        """A ready step's results, ordered by assignment id (so a run's batch does not depend on
        which worker finished first); the step is forgotten."""
        if not self.ready(step):
            raise ValueError(f"step {step} is not ready: {len(self.results.get(step, []))} of "
                             f"{self.expected.get(step, 0)} assignments back")
        del self.expected[step]
        return sorted(self.results.pop(step), key=lambda r: r.assignment_id)
