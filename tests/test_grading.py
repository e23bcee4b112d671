"""Grading generated code: every kind of bad program ends as reward 0 with a recorded reason."""

import pytest

from tidal.config import load_config
from tidal.sandbox import Sandbox
from tidal.families.funcs import FuncsConfig, grade_many, sample_tasks


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(None, ["--env.sandbox.timeout_s", "2", "--env.sandbox.cpu_s", "1",
                             "--env.sandbox.memory_mb", "256", "--env.sandbox.max_output_bytes", "4096"])
    task = sample_tasks(FuncsConfig(), 1, seed=0, heldout=False)[0]
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


# ---------------------------------------------------------------- the generic API (tidal.env.grading)


def test_run_graded_reads_only_the_verdict_stamped_with_its_nonce(setup):
    from tidal.env import NONCE_PREAMBLE, run_graded

    sandbox, _ = setup
    honest = run_graded(sandbox, NONCE_PREAMBLE + "print('pass pass 1')\nprint(_nonce, 'ok', 3, 'x')\n")
    assert (honest.reason, honest.fields) == ("ok", ("3", "x"))
    forged = run_graded(sandbox, NONCE_PREAMBLE + "print('0123456789abcdef pass 6 6')\n")
    assert (forged.reason, forged.fields) == ("no_result", ())
    looping = run_graded(sandbox, NONCE_PREAMBLE + "while True:\n    pass\n")
    assert looping.reason in {"timeout", "cpu"}


class CountingSandbox:
    """Stands in for a Sandbox: records how many programs run at once."""

    def __init__(self, concurrency):
        import threading
        from types import SimpleNamespace

        self.cfg = SimpleNamespace(concurrency=concurrency, share_verdicts=True)
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def run_python(self, code, stdin=None):
        import time
        from types import SimpleNamespace

        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.02)
        with self.lock:
            self.now -= 1
        return SimpleNamespace(killed_reason=None, stdout=f"{stdin.strip()} pass", wall_s=0.02)


def test_parallel_gradings_through_one_sandbox_share_one_limit():
    import threading

    from tidal.env import grading_slots, run_graded_many

    sandbox = CountingSandbox(concurrency=2)
    assert grading_slots(sandbox) is grading_slots(sandbox)
    results = []
    callers = [threading.Thread(target=lambda: results.extend(run_graded_many(sandbox, ["p"] * 6)))
               for _ in range(3)]  # three environments' episodes finishing at once
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    assert len(results) == 18 and {v.reason for v in results} == {"pass"}
    assert sandbox.most == 2


class RecordingSandbox(CountingSandbox):
    """A CountingSandbox that also keeps every program it ran (and can be made to fail)."""

    def __init__(self, concurrency=2, fail=False):
        super().__init__(concurrency)
        self.programs, self.fail = [], fail

    def run_python(self, code, stdin=None):
        if self.fail:
            raise OSError("sandbox broke")
        with self.lock:
            self.programs.append(code)
        return super().run_python(code, stdin)


def test_identical_candidates_are_graded_once_per_sandbox():
    from tidal.env.grading import verdict_memo

    tasks = sample_tasks(FuncsConfig(), 2, seed=0, heldout=False)
    sandbox = RecordingSandbox()
    same, other = "    return x\n", "    return x + 1\n"
    grades = grade_many(sandbox, [tasks[0]] * 4 + [tasks[1]], [same, same, other, same, same])
    assert [g.reason for g in grades] == ["pass"] * 5
    assert len(sandbox.programs) == 3 and len(set(sandbox.programs)) == 3  # one per distinct pair
    grade_many(sandbox, [tasks[0]], [other])  # known from the first call
    assert len(sandbox.programs) == 3 and verdict_memo(sandbox).runs == 3
    grade_many(RecordingSandbox(), [tasks[0]], [other])  # another sandbox has its own memo
    assert verdict_memo(sandbox).runs == 3
    sandbox.cfg.share_verdicts = False  # env.sandbox.share_verdicts = false: every program runs
    grade_many(sandbox, [tasks[0]] * 2, [same, same])
    assert len(sandbox.programs) == 5


def test_concurrent_gradings_of_one_candidate_run_it_once():
    import threading

    task = sample_tasks(FuncsConfig(), 1, seed=0, heldout=False)[0]
    sandbox = RecordingSandbox()
    results = []
    callers = [threading.Thread(target=lambda: results.extend(grade_many(sandbox, [task], ["    return x\n"])))
               for _ in range(6)]  # a group's episodes finishing at once
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    assert len(results) == 6 and len(sandbox.programs) == 1


def test_a_failed_grading_is_not_remembered():
    from tidal.env.grading import verdict_memo

    task = sample_tasks(FuncsConfig(), 1, seed=0, heldout=False)[0]
    sandbox = RecordingSandbox(fail=True)
    with pytest.raises(OSError, match="sandbox broke"):
        grade_many(sandbox, [task], ["    return x\n"])
    sandbox.fail = False
    [grade] = grade_many(sandbox, [task], ["    return x\n"])
    assert grade.reason == "pass" and len(sandbox.programs) == 1 and verdict_memo(sandbox).runs == 2
