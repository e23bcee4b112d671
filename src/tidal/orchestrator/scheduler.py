"""Which assignments exist and where each one is: the orchestrator's planning and dispatch state.

    plan(trainer_version)   queue the assignments of every step the staleness bound now allows
    dispatch(now)           hand queued assignments to idle workers, one each, oldest first
    complete(worker, r)     the result of the assignment the worker held (a duplicate of one
                            already back is dropped and counted: results are idempotent by
                            assignment id, so a retried upload never trains anything twice)
    fail(worker, error)     re-queue that assignment (first in line, for the replaced worker or
                            any other), or stop the run once it failed max_attempts times
    add_worker(w) / remove_worker(w)  elastic membership: a worker joins, or leaves (its lease
                            expired or it said so); what it held is queued again, first in line,
                            without counting as a failure of the assignment
    ready(step) / take(step)  whether all of a step's assignments are back; its results by id

Pure state: no threads, no pool, no clock. Callers pass ``now`` (time.time()), used only to say
how long a worker waited for work (the wait_backpressure span of the report's timeline).
Workers are named by any hashable id (ints 0..n-1 for one pool; "<pool>/<n>" in a fleet).
Invariants, each tested in tests/test_scheduler.py: step s is planned only once
s <= trainer_version + max_staleness; every assignment is at any moment queued, running, done
or taken, never two of them (except that a worker which left may still deliver what it held:
the first result back wins and a second is a counted duplicate); an assignment is dispatched
again only after it failed or its worker left; a step's results are taken once, when all of its
assignments are done. The simulator (tidal.fleet.simulate) drives this same class on a simulated
clock.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable
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

    worker: Hashable
    assignment: Assignment
    waited: Span


def split_step(tasks: list, step: int, first_id: int, num_workers: int,
               max_staleness: int) -> list[Assignment]:
    """One assignment per worker (fewer if tasks are few; at least one), tasks dealt round-robin;
    each needs policy version step − max_staleness or newer. How a step is split changes no
    result: every episode's seed depends on its step, group and sample only."""
    parts = max(1, min(num_workers, len(tasks)))
    min_version = max(0, step - max_staleness)
    out = []
    for p in range(parts):
        idx = list(range(p, len(tasks), parts))
        out.append(Assignment(first_id + p, step, [tasks[i] for i in idx], idx, min_version))
    return out


class Scheduler:
    """Steps first_step .. steps − 1, planned within the staleness bound, run on the workers
    (an int n means workers 0 .. n − 1; more may join later)."""

    def __init__(self, planner: Planner, workers: int | Iterable[Hashable], steps: int, max_staleness: int,
                 first_step: int = 0, now: float = 0.0, max_attempts: int = MAX_ATTEMPTS):
        self.planner = planner
        self.steps = steps
        self.max_staleness = max_staleness
        self.max_attempts = max_attempts
        self.next_step = first_step
        """The next step to plan."""
        self.next_id = 0
        """The id of the next assignment planned."""
        self.queue: deque[Assignment] = deque()
        """Assignments waiting for a worker, next first."""
        self.running: dict[Hashable, Assignment] = {}
        """worker -> the assignment it is running."""
        self.failures: Counter[int] = Counter()
        """assignment id -> times it failed."""
        self.results: dict[int, list[RolloutResult]] = {}
        """step -> the results back so far, for every planned step not yet taken."""
        self.expected: dict[int, int] = {}
        """step -> its number of assignments, for every planned step not yet taken."""
        self.done: set[int] = set()
        """Ids of the assignments whose result is back (taken or not)."""
        self.orphans: dict[Hashable, Assignment] = {}
        """worker that left -> the assignment it held (queued again); its late result still counts
        if it comes first."""
        self.duplicates = 0
        """Results dropped because their assignment's result was already back."""
        self.requeued = 0
        """Assignments queued again because the worker holding them left."""
        ids = range(workers) if isinstance(workers, int) else workers
        self.idle_since: dict[Hashable, float] = dict.fromkeys(ids, now)
        """worker -> when it last became idle, for every member (insertion order = dispatch order)."""

    @property
    def num_workers(self) -> int:
        """Workers that are members now."""
        return len(self.idle_since)

    @property
    def workers(self) -> list[Hashable]:
        return list(self.idle_since)

    def add_worker(self, worker: Hashable, now: float) -> None:
        """``worker`` joined (idle from ``now``)."""
        if worker in self.idle_since:
            raise ValueError(f"worker {worker!r} is already a member")
        self.idle_since[worker] = now

    def remove_worker(self, worker: Hashable, now: float) -> Assignment | None:
        """``worker`` left: the assignment it ran, if any, goes back to the front of the queue
        (not counted as a failure: the task did nothing wrong). Returns that assignment."""
        self.idle_since.pop(worker, None)
        a = self.running.pop(worker, None)
        if a is not None and a.assignment_id not in self.done:
            self.queue.appendleft(a)
            self.orphans[worker] = a
            self.requeued += 1
        return a

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
        for w in self.idle_since:
            if self.queue and w not in self.running:
                a = self.queue.popleft()
                self.running[w] = a
                out.append(Dispatch(w, a, Span(w, "wait_backpressure", self.idle_since[w], now)))
        return out

    def complete(self, worker: Hashable, result: RolloutResult, now: float) -> bool:
        """``worker`` finished the assignment it held (or, for a worker that left, the assignment
        it held then) with ``result``. False when that assignment's result was already back: the
        duplicate is dropped and counted."""
        a = self.running.pop(worker, None) if worker in self.running else self.orphans.pop(worker, None)
        if a is None:
            raise ValueError(f"worker {worker!r} returned assignment {result.assignment_id} but holds none")
        if result.assignment_id != a.assignment_id:
            raise ValueError(f"worker {worker!r} returned assignment {result.assignment_id}, "
                             f"but it was running {a.assignment_id}")
        if worker in self.idle_since:
            self.idle_since[worker] = now
        return self.accept(result)

    def accept(self, result: RolloutResult) -> bool:
        """Record the result of a planned assignment, whoever ran it; idempotent by assignment
        id (False, counted as a duplicate, when its result is already back). An assignment
        still queued (its worker left, then delivered after all) leaves the queue."""
        aid = result.assignment_id
        if aid in self.done or result.step not in self.expected:
            self.duplicates += 1
            return False
        self.done.add(aid)
        self.queue = deque(q for q in self.queue if q.assignment_id != aid)
        self.results[result.step].append(result)
        return True

    def fail(self, worker: Hashable, error: BaseException, now: float) -> Assignment:
        """``worker`` failed (it is being replaced): its assignment goes back to the front of the
        queue, or, after max_attempts failures, the run stops with an OrchestratorError."""
        a = self.running.pop(worker)
        if worker in self.idle_since:
            self.idle_since[worker] = now
        if a.assignment_id in self.done:  # a copy of it already came back from elsewhere
            return a
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
        # a worker that is still running an assignment whose result came back from elsewhere
        # keeps it until it returns (its result is then a counted duplicate)
        return sorted(self.results.pop(step), key=lambda r: r.assignment_id)
