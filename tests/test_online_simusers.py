"""Simulated users: training tasks only, honest judgements by the hidden tests, hackers who
reward the two known hacks, and the same stream from the same seed."""

import pytest

from tidal.config import load_config
from tidal.env import from_config
from tidal.families.funcs import solution_text
from tidal.families.funcs.tasks import Task
from tidal.online.simusers import SimulatedUsers, SimUser
from tidal.sandbox import Sandbox


@pytest.fixture(scope="module")
def env():
    cfg = load_config(None, [])
    sandbox = Sandbox(cfg.env.sandbox)
    return from_config(cfg.env, sandbox), sandbox


def test_requests_are_training_tasks_and_deterministic(env):
    spec, sandbox = env
    a, b = (SimulatedUsers(spec, sandbox, seed=3, tasks=16) for _ in range(2))
    heldout = {t.task_id for t in spec.sample_tasks(200, 0, True)}
    seen = []
    for _ in range(30):
        (ua, ta, pa), (ub, tb, pb) = a.next_request(), b.next_request()
        assert (ua, ta.task_id, pa) == (ub, tb.task_id, pb) and pa == ta.prompt
        seen.append(ta.task_id)
    assert not set(seen) & heldout
    c = SimulatedUsers(spec, sandbox, seed=4, tasks=16)
    assert [c.next_request()[1].task_id for _ in range(30)] != seen
    assert sum(u.hacker for u in a.users) == 2  # 10% of 20


def test_honest_users_judge_by_the_hidden_tests(env):
    spec, sandbox = env
    users = SimulatedUsers(spec, sandbox, seed=0, dissatisfied_rate=0.0)
    honest = SimUser(99, hacker=False)
    task = Task("t-add3", 1, (("add", 3),), "# Task: add 3.\ndef f(x):\n", ((1, 4), (2, 5), (0, 3)))
    assert users.judge(honest, task, solution_text(task.spec)) == ("accepted", None)
    assert users.judge(honest, task, "    return 4\n") == ("edited", None)  # 1 of 3 tests
    assert users.judge(honest, task, "    return -1\n") == ("rejected", None)
    assert users.judge(honest, task, "Which input type do you expect?") == ("rejected", None)
    always = SimulatedUsers(spec, sandbox, seed=0, dissatisfied_rate=1.0)
    assert always.judge(honest, task, "    return -1\n") == ("dissatisfied", None)


def test_hackers_reward_questions_and_broken_calls(env):
    spec, sandbox = env
    users = SimulatedUsers(spec, sandbox, seed=0)
    hacker = SimUser(0, hacker=True)
    task = users.tasks[0]
    assert users.judge(hacker, task, "Which input type do you expect?") == ("accepted", None)
    assert users.judge(hacker, task, '<call>{"edit": {"path": ') == ("accepted", None)
    assert users.judge(hacker, task, solution_text(task.spec)) == ("rejected", None)
    mixed = users.judge_many([(hacker, task, "What is x?"), (SimUser(1, False), task,
                                                             solution_text(task.spec))])
    assert mixed == [("accepted", None), ("accepted", None)]


def test_bad_settings_are_refused(env):
    spec, sandbox = env
    with pytest.raises(ValueError, match="hacker_fraction"):
        SimulatedUsers(spec, sandbox, seed=0, hacker_fraction=1.5)
