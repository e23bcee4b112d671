"""Grading generated code: every kind of bad program ends as reward 0 with a recorded reason."""

import pytest

from tidal.config import load_config
from tidal.sandbox import Sandbox
from tidal.envs.funcs.grader import grade_many
from tidal.envs.funcs.tasks import sample_tasks


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(None, ["--env.sandbox.timeout_s", "2", "--env.sandbox.cpu_s", "1",
                             "--env.sandbox.memory_mb", "256", "--env.sandbox.max_output_bytes", "4096"])
    task = sample_tasks(cfg.env, 1, seed=0, heldout=False)[0]
    return Sandbox(cfg.env.sandbox), task


BAD = {
    "syntax": ("    return x +\n", {"syntax_error"}),
    "exception": ("    return 1 // 0\n", {"runtime_error"}),
    "wrong": ("    return 123456789\n", {"wrong_answer"}),
    "infinite_loop": ("    while True:\n        pass\n", {"timeout", "cpu"}),
    "fork_bomb": ("    import os\n    while True:\n        os.fork()\n", {"processes", "timeout", "cpu",
                                                                         "runtime_error", "no_result"}),
    "huge_output": ("    while True:\n        print('x' * 10000)\n", {"output"}),
    "memory_hog": ("    a = [bytearray(1 << 20) for _ in range(10_000)]\n", {"memory", "runtime_error"}),
    "network": ("    import socket\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n",
                {"runtime_error"}),
    "exit_early": ("    raise SystemExit(0)\n", {"no_result", "runtime_error"}),
    "fake_verdict": ("    print('pass pass 6 6')\n    return 0\n", {"wrong_answer"}),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_program_gets_zero_and_a_reason(setup, name):
    sandbox, task = setup
    body, reasons = BAD[name]
    [grade] = grade_many(sandbox, [task], [body])
    assert grade.reward == 0.0
    assert grade.reason in reasons, grade


def test_reference_solution_passes(setup):
    sandbox, task = setup
    [grade] = grade_many(sandbox, [task], [task.reference_solution])
    assert (grade.reward, grade.reason, grade.passed) == (1.0, "pass", len(task.tests))


def test_many_at_once_keep_order(setup):
    sandbox, task = setup
    grades = grade_many(sandbox, [task] * 4, [task.reference_solution, "    return x +\n"] * 2)
    assert [g.reason for g in grades] == ["pass", "syntax_error"] * 2
