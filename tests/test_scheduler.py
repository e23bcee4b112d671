"""The orchestrator's scheduler on its own: no workers, no threads, no clock.

Back-pressure (nothing planned past trainer version + max_staleness; max_staleness = 0
alternates generation and training), retries then a clear error, a step's results taken only
when all its assignments are back and ordered by id, and no assignment dispatched twice or lost
under random completion orders and failures.
"""

import random

import pytest

from tidal.orchestrator.pool import OrchestratorError
from tidal.orchestrator.scheduler import MAX_ATTEMPTS, Scheduler, split_step
from tidal.orchestrator.worker import Assignment, RolloutResult


def planner(per_step: int, max_staleness: int):
    def plan(step: int, first_id: int) -> list[Assignment]:
        return [Assignment(first_id + i, step, [], [], max(0, step - max_staleness)) for i in range(per_step)]
    return plan


def scheduler(steps=10, max_staleness=1, workers=2, per_step=2, **kw) -> Scheduler:
    return Scheduler(planner(per_step, max_staleness), workers, steps, max_staleness, **kw)


def result_of(d) -> RolloutResult:
    return RolloutResult(d.assignment.assignment_id, d.assignment.step, d.worker, [], 0, 0.0, 0.0)


def test_nothing_is_planned_beyond_trainer_version_plus_max_staleness():
    s = scheduler(steps=10, max_staleness=2)
    assert s.plan(0) == [0, 1, 2]
    assert s.plan(0) == []  # planned once only
    assert s.plan(1) == [3]
    assert s.plan(3) == [4, 5]
    assert s.plan(100) == [6, 7, 8, 9]  # never past the run's last step
    assert s.plan(200) == []
    assert sorted({a.step for a in s.queue}) == list(range(10))


def test_a_resumed_run_plans_from_its_step():
    s = scheduler(steps=10, max_staleness=1, first_step=4)
    assert s.plan(4) == [4, 5]
    assert [a.assignment_id for a in s.queue] == [0, 1, 2, 3]


def drive(max_staleness: int, steps: int = 6) -> list[tuple[str, int]]:
    """A trainer that trains a step as soon as it is ready; returns the plan/train events."""
    s = scheduler(steps=steps, max_staleness=max_staleness, workers=3, per_step=2)
    version, events = 0, []
    while version < steps:
        events += [("plan", step) for step in s.plan(version)]
        planned = set(s.expected)
        assert all(step <= version + max_staleness for step in planned)
        for d in s.dispatch(0.0):
            assert d.assignment.min_version <= version  # a worker never waits for the future
            s.complete(d.worker, result_of(d), 0.0)
        if s.ready(version):
            s.take(version)
            events.append(("train", version))
            version += 1
    return events


def test_max_staleness_zero_alternates_generation_and_training():
    events = drive(max_staleness=0)
    assert events == [(kind, step) for step in range(6) for kind in ("plan", "train")]


def test_max_staleness_two_runs_ahead():
    events = drive(max_staleness=2)
    assert events[:3] == [("plan", 0), ("plan", 1), ("plan", 2)]
    assert [e for e in events if e[0] == "train"] == [("train", s) for s in range(6)]


def test_a_failed_assignment_is_retried_then_the_run_stops_with_a_clear_error():
    s = scheduler(workers=2, per_step=1, max_staleness=0)
    s.plan(0)
    (first,) = s.dispatch(1.0)
    assert s.fail(first.worker, RuntimeError("boom"), 2.0) is first.assignment
    assert list(s.queue) == [first.assignment] and not s.running  # back at the front
    for attempt in range(2, MAX_ATTEMPTS + 1):
        (again,) = s.dispatch(3.0)
        assert again.assignment is first.assignment
        if attempt < MAX_ATTEMPTS:
            s.fail(again.worker, RuntimeError("boom"), 4.0)
    with pytest.raises(OrchestratorError, match=f"assignment 0 .step 0. failed {MAX_ATTEMPTS} times; "
                                                "last error: RuntimeError: boom"):
        s.fail(again.worker, RuntimeError("boom"), 5.0)


def test_a_retry_goes_before_newer_work():
    s = scheduler(workers=1, per_step=3, max_staleness=0)
    s.plan(0)
    (d,) = s.dispatch(0.0)
    s.fail(d.worker, RuntimeError("x"), 0.0)
    assert [a.assignment_id for a in s.queue] == [0, 1, 2]


def test_a_step_is_taken_only_when_all_its_assignments_are_back_in_id_order():
    s = scheduler(workers=3, per_step=3, max_staleness=0)
    s.plan(0)
    sent = s.dispatch(0.0)
    assert [d.worker for d in sent] == [0, 1, 2]
    for d in (sent[2], sent[0]):
        s.complete(d.worker, result_of(d), 1.0)
        assert not s.ready(0)
    with pytest.raises(ValueError, match="2 of 3"):
        s.take(0)
    s.complete(sent[1].worker, result_of(sent[1]), 1.0)
    assert s.ready(0)
    assert [r.assignment_id for r in s.take(0)] == [0, 1, 2]  # finished 2, 0, 1
    assert not s.ready(0)
    with pytest.raises(ValueError, match="not ready"):
        s.take(0)


def test_a_result_for_another_assignment_is_refused():
    s = scheduler(workers=2, per_step=2)
    s.plan(0)
    a, b = s.dispatch(0.0)
    with pytest.raises(ValueError, match="returned assignment 1, but it was running 0"):
        s.complete(a.worker, result_of(b), 0.0)


def test_idle_workers_report_how_long_they_waited_for_work():
    s = scheduler(workers=2, per_step=1, max_staleness=0, now=10.0)
    s.plan(0)
    (d,) = s.dispatch(12.0)  # one assignment, two workers: worker 1 stays idle
    assert (d.worker, d.waited.state, d.waited.start, d.waited.end) == (0, "wait_backpressure", 10.0, 12.0)
    s.complete(0, result_of(d), 15.0)
    s.take(0)
    s.plan(1)
    (d,) = s.dispatch(20.0)
    assert (d.worker, d.waited.start, d.waited.end) == (0, 15.0, 20.0)


@pytest.mark.parametrize("seed", range(5))
def test_no_assignment_is_dispatched_twice_or_lost(seed):
    """Random completion order and random failures: every planned assignment is taken exactly
    once, and dispatched once plus once per failure."""
    rng = random.Random(seed)
    steps, workers, per_step = 8, 3, 4
    s = Scheduler(planner(per_step, 2), workers, steps, 2, max_attempts=100)
    version, dispatched, failures, taken = 0, [], 0, []
    running: list = []
    while version < steps:
        s.plan(version)
        sent = s.dispatch(0.0)
        dispatched += [d.assignment.assignment_id for d in sent]
        running += sent
        rng.shuffle(running)
        for d in running[: rng.randint(0, len(running))]:
            running.remove(d)
            if rng.random() < 0.2:
                s.fail(d.worker, RuntimeError("flaky"), 0.0)
                failures += 1
            else:
                s.complete(d.worker, result_of(d), 0.0)
        ids_running = {a.assignment_id for a in s.running.values()}
        ids_queued = [a.assignment_id for a in s.queue]
        assert len(set(ids_queued)) == len(ids_queued) and not ids_running & set(ids_queued)
        if s.ready(version):
            taken += [r.assignment_id for r in s.take(version)]
            version += 1
    assert sorted(taken) == list(range(steps * per_step))
    assert len(dispatched) == steps * per_step + failures
    assert sum(s.failures.values()) == failures


def test_split_step_deals_tasks_round_robin_and_sets_min_version():
    parts = split_step(list("abcdefg"), step=5, first_id=10, num_workers=3, max_staleness=2)
    assert [a.assignment_id for a in parts] == [10, 11, 12]
    assert [a.tasks for a in parts] == [list("adg"), list("be"), list("cf")]
    assert [a.group_ids for a in parts] == [[0, 3, 6], [1, 4], [2, 5]]
    assert all(a.min_version == 3 and a.step == 5 for a in parts)
    assert len(split_step(["a"], 0, 0, 4, 0)) == 1
