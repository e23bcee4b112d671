"""The long-horizon family "ledger": tasks, held-out split, the scripted expert, the environment."""

import asyncio
import itertools
import random

import pytest

from tidal.env.toolcall import format_call
from tidal.families.funcs import canonical, evaluate, is_heldout
from tidal.families.ledger.config import LedgerConfig
from tidal.families.ledger import load_environment
from tidal.families.ledger.environment import NO_MORE_FILES, PARTIAL_CREDIT
from tidal.families.ledger.tasks import (NO_STEPS, LedgerExpert, body_text, code_text, parse_code,
                                     parse_steps, sample_tasks, slipped)
from tidal.sandbox import Sandbox
from tidal.sandbox.config import SandboxConfig

CFG = LedgerConfig(num_files=12)


def test_deterministic_from_seed():
    assert sample_tasks(CFG, 10, 3, False) == sample_tasks(CFG, 10, 3, False)
    assert sample_tasks(CFG, 10, 3, False) != sample_tasks(CFG, 10, 4, False)


def test_heldout_disjoint_from_training_by_construction():
    held = sample_tasks(CFG, 100, 0, True)
    train = sample_tasks(CFG, 2000, 1, False)
    assert len({canonical(t.spec) for t in held}) == 100
    assert not {t.spec for t in held} & {t.spec for t in train}
    assert all(is_heldout(t.spec, CFG.heldout_buckets) for t in held)


def test_steps_sit_early_in_order_one_per_file():
    for task in sample_tasks(CFG, 50, 0, False):
        assert CFG.min_ops <= len(task.spec) <= CFG.max_ops
        assert all(i < CFG.num_files * CFG.op_zone for i in task.op_files)
        found = [s for text in task.files for s in parse_steps(text)]
        assert tuple(found) == task.spec
        assert [i for i, text in enumerate(task.files) if parse_steps(text)] == list(task.op_files)


def test_no_step_can_be_forgotten():
    for task in sample_tasks(CFG, 200, 5, False) + sample_tasks(CFG, 50, 5, True):
        for k in range(len(task.spec)):
            for fewer in itertools.combinations(task.spec, k):
                assert any(evaluate(fewer, x) != y for x, y in task.tests)


def test_reference_solution_passes_hidden_tests():
    for task in sample_tasks(CFG, 50, 1, False):
        ns: dict = {}
        exec("def f(x):\n" + body_text(task.reference_solution), ns)
        assert all(ns["f"](x) == y == evaluate(task.spec, x) for x, y in task.tests)


def play_without_context(task, expert, summarize_every):
    """The expert reading the files, its context reset to its own summary every few files."""
    summary, seen = None, []
    for i, text in enumerate(task.files):
        seen.append(text)
        if i % summarize_every == summarize_every - 1:
            summary, seen = expert.summarize(expert.recall(summary, seen)), []
    return expert.answer(expert.recall(summary, seen))


def test_expert_without_slips_is_right_through_its_own_summaries():
    for task in sample_tasks(CFG, 30, 2, False):
        expert = LedgerExpert(random.Random(0), slip_rate=0.0)
        assert play_without_context(task, expert, summarize_every=2) == task.reference_solution
        assert expert.summarize([]) == NO_STEPS
        assert parse_code(expert.summarize(list(task.spec))) == list(task.spec)


def test_expert_slips_change_the_answer_at_about_the_rate():
    tasks = sample_tasks(CFG, 300, 3, False)
    wrong = sum(play_without_context(t, LedgerExpert(random.Random(i), 0.1), 1) != t.reference_solution
                for i, t in enumerate(tasks))
    # 12 summaries, those after the first step (in the first half) can slip: P(no slip) ~ 0.9^9
    assert 0.45 < wrong / len(tasks) < 0.8


def test_slipped_memory_differs():
    rng = random.Random(0)
    memory = [("add", 3), ("mul", 2)]
    for _ in range(50):
        out = slipped(memory, rng)
        assert out != memory and len(out) >= len(memory) - 1


def test_code_is_one_line_of_statements_and_the_body_returns():
    assert code_text((("add", 3), ("max", 2))) == "x+=3;x=max(x,2)"
    assert body_text("x = x + 3; x = max(x, 2)") == "    x = x + 3; x = max(x, 2)\n    return x\n"
    assert parse_code("x+=3; x = bogus; x = max(x, 2)") == [("add", 3), ("max", 2)]


@pytest.fixture(scope="module")
def spec():
    return load_environment(Sandbox(SandboxConfig(backend="subprocess")), LedgerConfig(num_files=6))


def play(spec, task, actions):
    async def go():
        env = spec.make()
        head = await env.reset(task)
        results = [await env.step(a) for a in actions]
        await env.close()
        return head, results

    return asyncio.run(go())


def test_environment_pages_files_then_grades_the_submission(spec):
    task = spec.sample_tasks(1, 0, False)[0]
    reads = [format_call("next_file", {})] * (len(task.files) + 1)
    head, results = play(spec, task, reads + [format_call("submit", {"code": task.reference_solution})])
    assert "next_file()" in head and "submit(code: string)" in head and task.prompt.strip() in head
    assert [r.observation.split("\n")[0] for r in results[:2]] == ["m_aa.py", "m_ab.py"]
    assert results[len(task.files)].observation == NO_MORE_FILES
    assert not any(r.done for r in results[:-1])
    assert results[-1].done and results[-1].reward == 1.0 + PARTIAL_CREDIT
    assert results[-1].info["reason"] == "pass" and results[-1].info["level"] == task.level


def test_environment_wrong_or_malformed_submission(spec):
    task = spec.sample_tasks(1, 0, False)[0]
    _, results = play(spec, task, ["<call>{nope</call>", format_call("submit", {"code": "return 0"})])
    assert "bad_json" in results[0].observation and not results[0].done
    assert results[1].done and results[1].reward == 0.0


def test_partial_credit_for_steps_carried_stays_below_success(spec):
    task = spec.sample_tasks(1, 0, False)[0]
    first_only = code_text(task.spec[:1])
    _, results = play(spec, task, [format_call("submit", {"code": first_only})])
    assert 0.0 < results[0].reward < 1.0 and not spec.success(results[0].reward, results[0].info)
    assert results[0].info["reason"] == "wrong_answer"
    _, results = play(spec, task, [format_call("submit", {"code": task.reference_solution})])
    assert results[0].reward >= 1.0 and spec.success(results[0].reward, results[0].info)
