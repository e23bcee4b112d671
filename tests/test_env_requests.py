"""The "requests" family (plain-English string/list requests, graded by funcs' grader): its tasks
are deterministic with disjoint splits, every kind's reference solution passes its own hidden
tests through the real grader in the sandbox, a wrong answer fails, and an episode through the
harness is graded."""

import pytest

from harness_fakes import ScriptedEngine
from tidal.env import load_environment
from tidal.families import requests as family
from tidal.families.funcs import grade_many
from tidal.harness import HarnessConfig, run_episodes
from tidal.sandbox import Sandbox, SandboxConfig


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig())


def fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}```\n"


def one_task_per_kind() -> list:
    """A training task of every kind (drawn from the sampler, so its tests are the real ones)."""
    by_kind = {}
    for t in family.sample_tasks(family.RequestsConfig(), 600, 0, False):
        by_kind.setdefault(t.kind, t)
    assert set(by_kind) == set(family.KIND_BY_NAME)
    return list(by_kind.values())


def test_registered_by_name_with_settings_validated():
    spec = load_environment("requests", sandbox=None, num_tests=3)
    assert spec.name == "requests" and spec.build_corpus is None
    assert all(len(t.tests) == 3 for t in spec.sample_tasks(10, 1, False))
    with pytest.raises(ValueError, match="env.args.num_test"):
        load_environment("requests", sandbox=None, num_test=3)


def test_tasks_are_deterministic_and_splits_disjoint():
    cfg = family.RequestsConfig()
    train, held = family.sample_tasks(cfg, 400, 5, False), family.sample_tasks(cfg, 200, 5, True)
    assert train == family.sample_tasks(cfg, 400, 5, False)
    assert held == family.sample_tasks(cfg, 200, 5, True)
    assert train != family.sample_tasks(cfg, 400, 6, False)
    key = lambda t: (t.kind, repr(t.examples[0][0]))  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in held}
    assert len({key(t) for t in held}) == len(held)  # held-out tasks are distinct
    assert len({t.kind for t in train}) >= 20 and {t.level for t in train} == {1, 2}
    for t in train + held:
        kind = family.KIND_BY_NAME[t.kind]
        assert len(t.tests) == 5 and t.level == kind.level
        assert len({repr(y) for _, y in t.tests}) > 1  # no constant answer passes
        assert t.prompt == t.instruction == family.instruction_text(kind, list(t.examples))
        assert t.prompt.startswith("Write a Python function f(x) that takes ")
        assert t.prompt.endswith("\nReply with only the code.")
        x, y = t.examples[0]
        assert f"Example: f({x!r}) == {y!r}" in t.prompt


def test_levels_select_kinds():
    easy = family.sample_tasks(family.RequestsConfig(max_level=1), 50, 2, False)
    assert {t.level for t in easy} == {1}
    with pytest.raises(ValueError, match="exceeds max_level"):
        family.RequestsConfig(min_level=2, max_level=1)


def test_every_reference_passes_its_hidden_tests_in_the_sandbox(sandbox):
    tasks = one_task_per_kind()
    answers = [fenced(t.reference_solution) for t in tasks]
    grades = grade_many(sandbox, tasks, answers, style="instruct")
    failed = {t.kind: (g.reason, g.passed) for t, g in zip(tasks, grades) if g.reward != 1.0}
    assert not failed
    assert all(g.passed == g.total == 5 for g in grades)


def test_a_wrong_answer_fails(sandbox):
    tasks = one_task_per_kind()
    wrong = fenced("def f(x):\n    return x\n")  # the identity is no kind's answer
    grades = grade_many(sandbox, tasks, [wrong] * len(tasks), style="instruct")
    assert all(g.reward == 0.0 and g.reason == "wrong_answer" for g in grades)
    (g,) = grade_many(sandbox, tasks[:1], ["```python\ndef f(x):\n    return 1 / 0\n```"],
                      style="instruct")
    assert (g.reward, g.reason) == (0.0, "runtime_error")


def test_an_episode_through_the_harness_is_graded(sandbox):
    spec = load_environment("requests", sandbox=sandbox)
    tasks = spec.sample_tasks(4, 9, True)
    by_prompt = {t.prompt: t for t in tasks}

    def policy(prompt: str) -> str:  # solves the first two tasks, answers the others wrongly
        task = next(t for p, t in by_prompt.items() if p in prompt)
        right = task in tasks[:2]
        return fenced(task.reference_solution if right else "def f(x):\n    return None\n")

    engine = ScriptedEngine(policy, max_seq_len=1024, max_new_tokens=400)
    trajs, _ = run_episodes(engine, spec, tasks, HarnessConfig(), samples_per_task=1)
    assert [t.reward for t in trajs] == [1.0, 1.0, 0.0, 0.0]
    assert [t.solved for t in trajs] == [True, True, False, False]
    assert [t.reason for t in trajs] == ["pass", "pass", "wrong_answer", "wrong_answer"]
    for t, task in zip(trajs, tasks):
        assert t.task_id == task.task_id and t.level == task.level and t.episode.turns == 1
    # The answers hold a blank line before their code: the engine's default stop ("\n\n") would
    # have cut them there; the environment's stop = [] lets them run to the end of turn.
    assert all(r.stop == [] for r in engine.requests)
