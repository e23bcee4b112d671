"""Sealed grading: the grading workspace holds only what the task allows the agent to change,
protected files are hash-checked, and outputs mode keeps the answers on the host (the threat
model in tidal.env.sealed, including what the weaker modes leave open)."""

import pytest

from tidal.env.grading import NONCE_PREAMBLE
from tidal.env.sealed import (SealedTask, changed_protected, grade_sealed, grading_files,
                              is_editable)
from tidal.sandbox import Sandbox, SandboxConfig

CALC = "def f(x):\n    return x + 1\n"
VISIBLE = "from calc import f\nassert f(1) == 2\n"
HIDDEN = "from calc import f\nassert f(5) == 6 and f(-1) == 0\n"


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig())


def task(**kw) -> SealedTask:
    base = dict(pristine={"calc.py": "def f(x):\n    pass\n", "test_calc.py": VISIBLE},
                editable=("*.py",), protected=("test_calc.py",),
                hidden={"hidden/check.py": HIDDEN}, verifier=("python", "-m", "hidden.check"))
    return SealedTask(**{**base, **kw})


def test_grading_takes_only_editable_files_and_the_hidden_ones_last():
    t = task()
    final = {"calc.py": CALC, "test_calc.py": "pass\n", "conftest.py": "import os\n",
             "sub/sitecustomize.py": "x\n", "hidden/check.py": "raise SystemExit(0)\n",
             "../escape.py": "x\n", "/abs.py": "x\n", "helper.py": "y = 1\n",
             "notes.txt": "hi\n"}
    files = grading_files(t, final)
    assert files == {"calc.py": CALC, "test_calc.py": VISIBLE, "hidden/check.py": HIDDEN,
                     "helper.py": "y = 1\n"}
    assert not is_editable(t, "conftest.py") and not is_editable(t, "x/evil.pth")


def test_a_deleted_editable_file_stays_deleted_and_a_deleted_protected_one_is_restored():
    files = grading_files(task(), {})
    assert "calc.py" not in files and files["test_calc.py"] == VISIBLE


def test_changed_protected_by_hash():
    t = task()
    assert changed_protected(t, {"test_calc.py": VISIBLE, "calc.py": CALC}) == []
    assert changed_protected(t, {"test_calc.py": VISIBLE + "\n"}) == ["test_calc.py"]
    assert changed_protected(t, {"calc.py": CALC}) == ["test_calc.py"]


@pytest.mark.parametrize("kw, match", [
    (dict(hidden={"calc.py": "x"}), "also pristine"),
    (dict(protected=("missing.py",)), "not among the pristine"),
    (dict(pristine={"../up.py": ""}, protected=()), "plain relative path"),
    (dict(editable="*.py"), "tuple of glob patterns"),
    (dict(verifier="python x.py"), "tuple of argv"),
])
def test_bad_tasks_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        task(**kw)


def test_exit_mode_grades_the_agents_code_against_hidden_tests_not_its_test_edits(sandbox):
    t = task()
    good = grade_sealed(sandbox, t, {"calc.py": CALC, "test_calc.py": VISIBLE})
    assert (good.passed, good.reason, good.tampered) == (True, "pass", ())
    # A wrong f with an emptied visible test and a conftest that would skip everything.
    bad = grade_sealed(sandbox, t, {"calc.py": "def f(x):\n    return 2\n", "test_calc.py": "",
                                    "conftest.py": "raise SystemExit(0)\n"})
    assert (bad.passed, bad.reason, bad.tampered) == (False, "fail", ("test_calc.py",))
    with pytest.raises(ValueError, match="needs a program"):
        grade_sealed(sandbox, task(verifier=()), {})


def test_exit_mode_trusts_the_exit_status_which_editable_code_can_forge(sandbox):
    """The documented weakness of exit mode: editable code runs in the grading process."""
    forged = grade_sealed(sandbox, task(), {"calc.py": "import os\nos._exit(0)\n"})
    assert forged.passed


OUTPUTS = NONCE_PREAMBLE + """\
from calc import f
print(_nonce, "out", *[repr(y) if type(y) is int else "?" for y in map(f, [5, -1, 10])])
"""
VERDICT = NONCE_PREAMBLE + """\
from calc import f
print(_nonce, "pass" if [f(5), f(-1), f(10)] == [6, 0, 11] else "wrong_answer")
"""
FORGER = "import __main__, os\nprint(__main__._nonce, {words}, flush=True)\nos._exit(0)\n"
ALWAYS_EQUAL = "class E:\n    def __eq__(s, o): return True\ndef f(x):\n    return E()\n"


def outputs_task() -> SealedTask:
    return task(hidden={}, verifier=(), expected=("6", "0", "11"))


def test_outputs_mode_compares_on_the_host(sandbox):
    t = outputs_task()
    good = grade_sealed(sandbox, t, {"calc.py": CALC}, program=OUTPUTS)
    assert (good.passed, good.reason, good.fields, good.matched) == (True, "pass", ("6", "0", "11"), 3)
    half = grade_sealed(sandbox, t, {"calc.py": "def f(x):\n    return x + 1 if x < 9 else 0\n"},
                        program=OUTPUTS)
    assert (half.passed, half.reason, half.matched) == (False, "wrong_answer", 2)
    eq = grade_sealed(sandbox, t, {"calc.py": ALWAYS_EQUAL}, program=OUTPUTS)
    assert (eq.passed, eq.fields) == (False, ("?", "?", "?"))


def test_forged_lines_pass_verdict_mode_but_not_outputs_mode(sandbox):
    """The nonce stops blind forgery only; the host-side answers stop a forger that reads it."""
    assert grade_sealed(sandbox, task(), {"calc.py": ALWAYS_EQUAL}, program=VERDICT).passed
    forged = grade_sealed(sandbox, task(), {"calc.py": FORGER.format(words="'pass'")},
                          program=VERDICT)
    assert (forged.passed, forged.reason) == (True, "pass")
    guess = FORGER.format(words="'out', '6', '0', '1'")
    forged = grade_sealed(sandbox, outputs_task(), {"calc.py": guess}, program=OUTPUTS)
    assert (forged.passed, forged.reason, forged.matched) == (False, "wrong_answer", 2)


def test_an_early_exit_leaves_no_stamped_line(sandbox):
    v = grade_sealed(sandbox, outputs_task(), {"calc.py": "raise SystemExit(0)\n"}, program=OUTPUTS)
    assert (v.passed, v.reason) == (False, "no_result")


def test_a_task_file_named_main_py_is_refused_with_a_program(sandbox):
    with pytest.raises(ValueError, match="main.py"):
        grade_sealed(sandbox, task(pristine={"main.py": ""}, protected=(), editable=("calc.py",)),
                     {}, program=OUTPUTS)
