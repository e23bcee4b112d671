"""The documented example environment "fixit": the docs show its exact source, it uses only
public names, its tool edits and tests calc.py, a scripted expert solves it through the harness
in the default recipe's window, its corpus is the expert's episodes as the harness renders
them, and a tiny random model runs it end to end."""

import ast
import asyncio
import dataclasses
import json
import random
import re
from pathlib import Path

import pytest

from harness_fakes import ScriptedEngine
from tidal.config import load_config
from tidal.engine.config import EngineConfig
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationResult
from tidal.env import OBS_OPEN, format_call, load_environment
from tidal.families import funcs
from tidal.families.fixit.environment import (FixitConfig, code_of, numbered, phrase_of, sample_tasks,
                                          source_of)
from tidal.harness import HarnessConfig, run_episodes
from tidal.model import ByteTokenizer, build_model, preset
from tidal.sandbox import Sandbox, SandboxConfig

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = load_config(None, [])
"""The default recipe: fixit must fit its engine window and turn room."""


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig())


def test_the_docs_list_the_example_verbatim():
    doc = (ROOT / "docs/environments.md").read_text()
    for marker, path in (("fixit.py", "environment.py"), ("fixit/spec.py", "spec.py")):
        listing = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", doc, re.S).group(1)
        assert listing == (ROOT / "src/tidal/families/fixit" / path).read_text()


def test_tasks_are_deterministic_splits_disjoint_and_each_file_fails_its_tests():
    spec = load_environment("fixit", sandbox=None)
    a, b = spec.sample_tasks(50, 3, False), spec.sample_tasks(50, 3, False)
    assert a == b
    held = spec.sample_tasks(50, 3, True)
    assert not {t.tests.spec for t in a} & {t.tests.spec for t in held}
    for t in a + held:
        assert t.files["calc.py"] != source_of(t.tests.spec)
        lines = t.files["calc.py"].splitlines()[1:-1]
        written = [code_part(line) for line in lines]
        right = [code_of(*step) for step in t.tests.spec]
        assert sum(w != r for w, r in zip(written, right)) == 1  # exactly one wrong line
        assert [line.partition(" # ")[2] for line in lines] == [phrase_of(*s) for s in t.tests.spec]
        assert t.level == len(t.tests.spec)  # ... and every comment says what its line should do


PUBLIC_MODULES = {"tidal.env", "tidal.families", "tidal.families.funcs", "tidal.families.fixit.environment",
                  "tidal.harness", "tidal.model"}
"""What a user's environment could import too (no harness, engine or family internals)."""


def test_fixit_uses_only_public_names():
    for path in (ROOT / "src/tidal/families/fixit").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("tidal"):
                assert node.module in PUBLIC_MODULES | {"tidal.families.fixit.corpus", "tidal.families.fixit.spec"}, (path, node.module)
                assert not any(a.name.startswith("_") for a in node.names), (path, node.module)
            if isinstance(node, ast.Attribute):
                assert not (node.attr.startswith("_") and not node.attr.startswith("__")), (path, node.attr)
    assert "._slip" not in (ROOT / "src/tidal/families/fixit/environment.py").read_text()


# ---------------------------------------------------------------- the tool


def play(spec, task, calls):
    """Reset an episode on ``task`` and step each call; the head and every StepResult."""
    env = spec.make()

    async def episode():
        head = await env.reset(task)
        results = []
        for call in calls:
            results.append(await env.step(call))
            if results[-1].done:
                break
        else:
            results.append(await env.end("context"))
        await env.close()
        return head, results

    return asyncio.run(episode())


def code_part(line: str) -> str:
    return line.partition(" #")[0].strip()


def broken_line(task) -> int:
    written = task.files["calc.py"].splitlines()
    return next(i for i, step in enumerate(task.tests.spec, 2)
                if code_part(written[i - 1]) != code_of(*step))


def test_the_head_shows_calc_py_numbered(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    task = spec.sample_tasks(1, 0, False)[0]
    head, _ = play(spec, task, [])
    assert head == f"calc.py\n{numbered(task.files['calc.py'])}"
    assert head.splitlines()[1] == "1 def f(x):" and head.splitlines()[-1].endswith(" return x")


def test_a_fix_keeps_the_line_s_indent_and_comment(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    task = spec.sample_tasks(1, 0, False)[0]
    line = broken_line(task)
    env = spec.make()

    async def fix():
        await env.reset(task)
        await env.step(format_call("fix", {"line": line, "code": "  x = x + 1 "}))
        return env.source.splitlines()[line - 1]

    assert asyncio.run(fix()) == f" x = x + 1 # {phrase_of(*task.tests.spec[line - 2])}"


def test_the_right_fix_passes_and_ends_the_episode(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    task = spec.sample_tasks(1, 2, False)[0]
    line = broken_line(task)
    _, [result] = play(spec, task, [format_call("fix", {"line": line, "code": code_of(*task.tests.spec[line - 2])})])
    assert result.done and result.observation == "6/6 pass" and result.info["reason"] == "pass"
    assert result.reward == pytest.approx(1.1) and spec.success(result.reward, result.info)


def test_a_wrong_fix_shows_failing_tests_and_the_episode_goes_on(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    task = spec.sample_tasks(1, 2, False)[0]
    line = broken_line(task)
    right = code_of(*task.tests.spec[line - 2])
    _, results = play(spec, task, [
        format_call("fix", {"line": line, "code": "x = x + 100"}),
        format_call("fix", {"line": line, "code": "x = (x"}),
        format_call("fix", {"line": 9, "code": right}),
        format_call("fix", {"line": line, "code": right}),
    ])
    wrong, syntax, out_of_range, fixed = results
    assert re.fullmatch(r"[0-5]/6 pass", wrong.observation) and not wrong.done
    assert syntax.observation == "0/6 pass (syntax_error)" and not syntax.done
    assert out_of_range.info["tool_error"] == "tool_error" and "lines 1-" in out_of_range.observation
    assert fixed.done and spec.success(fixed.reward, fixed.info)
    assert fixed.reward == pytest.approx(1.0)  # a malformed call lost the clean_calls bonus


def test_an_episode_cut_short_scores_calc_py_as_it_stands(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    task = spec.sample_tasks(1, 5, False)[0]
    _, [ended] = play(spec, task, [])  # no fix at all: the broken file is graded
    assert ended.done and ended.info["reason"] == "context" and ended.info["reward/tests_pass"] == 0.0
    assert ended.reward == 0.0  # no partial credit for the tests the broken file passes
    assert not spec.success(ended.reward, ended.info)


def test_a_fix_that_passes_some_tests_earns_nothing_for_them(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    task = next(t for t in spec.sample_tasks(20, 2, False)  # a broken file that passes some
                if 0 < sum(funcs.evaluate(_written(t), x) == y for x, y in t.tests.tests))
    line = broken_line(task)
    unchanged = code_part(task.files["calc.py"].splitlines()[line - 1])
    _, [same, ended] = play(spec, task, [format_call("fix", {"line": line, "code": unchanged})])
    assert re.fullmatch(r"[1-5]/6 pass", same.observation)
    assert ended.info["reward/tests_pass"] == 0.0 and ended.reward == 0.0


def _written(task):
    from tidal.families.fixit.corpus import steps_of

    return steps_of(task.files["calc.py"])


# ---------------------------------------------------------------- the harness


def test_every_task_fits_the_default_window_with_room_for_a_turn():
    window, turn = DEFAULTS.engine.max_seq_len, DEFAULTS.engine.max_new_tokens
    tok = ByteTokenizer()
    for heldout in (False, True):
        for task in sample_tasks(FixitConfig(), 300, 0, heldout):
            head = f"{task.prompt}\n{numbered(task.files['calc.py'])}"  # the head (tested above)
            assert len(tok.encode(head, add_bos=True)) + turn <= window


class Expert:
    """Fixes the wrong line; first a malformed call when ``clumsy``, a wrong fix when ``wrong``."""

    def __init__(self, tasks, clumsy=False, wrong=False):
        self.tasks, self.clumsy, self.wrong = tasks, clumsy, wrong
        self.tok = ByteTokenizer()

    async def generate(self, request):
        index, kind = request.tag
        task = self.tasks[index]
        line = broken_line(task)
        plan = ([format_call("fix", {"line": "two", "code": "x"})] if self.clumsy else []) + (
            [format_call("fix", {"line": line, "code": "x = -x + 99"})] if self.wrong else []) + [
            "Fix it. " + format_call("fix", {"line": line, "code": code_of(*task.tests.spec[line - 2])})]
        text = plan[self.tok.decode(request.prompt_ids).count(OBS_OPEN)]
        ids = self.tok.encode(text)[: request.max_new_tokens]
        return GenerationResult(0, request.prompt_ids, ids, [-0.1] * len(ids), [0] * len(ids),
                                None, "stop", self.tok.decode(ids), request.tag)


def test_a_scripted_expert_solves_fixit_in_the_default_window(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    tasks = spec.sample_tasks(4, 0, False)
    shell = ScriptedEngine(policy=None, max_seq_len=DEFAULTS.engine.max_seq_len,
                           max_new_tokens=DEFAULTS.engine.max_new_tokens)
    trajs, _ = run_episodes(shell, spec, tasks, DEFAULTS.harness, client=Expert(tasks))
    for t, task in zip(trajs, tasks):
        assert t.episode.turns == 1 and t.reward == pytest.approx(1.1)
        assert t.solved and t.reason == "pass" and t.level == task.level


@pytest.mark.parametrize("clumsy, wrong", [(True, False), (False, True)])
def test_a_retry_after_a_mistake_solves_it_where_the_window_has_room(sandbox, clumsy, wrong):
    spec = load_environment("fixit", sandbox=sandbox)
    tasks = spec.sample_tasks(3, 0, False)
    shell = ScriptedEngine(policy=None, max_seq_len=512, max_new_tokens=96)
    trajs, _ = run_episodes(shell, spec, tasks, HarnessConfig(max_turns=4),
                            client=Expert(tasks, clumsy, wrong))
    for t in trajs:
        text = ByteTokenizer().decode(t.segments[0].completion_ids)
        assert t.episode.turns == 2 and t.solved and t.reason == "pass"
        assert t.reward == pytest.approx(1.0 if clumsy else 1.1)  # clean_calls term (0.1)
        assert ("bad_args" in text) == clumsy and bool(re.search(r"<obs>[0-5]/6 pass</obs>", text)) == wrong


def test_a_tiny_random_model_runs_fixit_end_to_end(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    engine = Engine(build_model(preset("tiny"), seed=0), ByteTokenizer(),
                    EngineConfig(max_seq_len=256, max_new_tokens=24, seed=0))
    cfg = HarnessConfig(max_turns=4)
    trajs, stats = run_episodes(engine, spec, spec.sample_tasks(2, 1, False), cfg, samples_per_task=2)
    assert len(trajs) == 4 and stats.generated_tokens > 0
    for t in trajs:
        assert t.reason in {"turn_budget", "pass", "context", "token_budget"}
        assert t.episode.turns >= 1 and t.episode.tool_errors <= t.episode.turns
        assert "reward/tests_pass" in t.info  # scored even when cut short
        for seg in t.segments:
            assert len(seg.prompt_ids) + len(seg.completion_ids) <= 256


# ---------------------------------------------------------------- the mid-training corpus


def test_the_corpus_is_expert_episodes_exactly_as_the_harness_shows_them():
    spec = load_environment("fixit", sandbox=None)
    docs = spec.build_corpus(200, 0)
    assert len(docs) == 200 and docs == spec.build_corpus(200, 0)
    tasks = sample_tasks(FixitConfig(), 200, 1_000_003, False)
    tok = ByteTokenizer()
    ended_right = 0
    for doc, task in zip(docs, tasks):
        env = spec.make()
        head = asyncio.run(env.reset(task))  # the context's head, as the model sees it
        assert doc.startswith(head + '<call>{"fix":{"line":')
        assert len(tok.encode(doc, add_bos=True)) <= DEFAULTS.engine.max_seq_len  # one window
        right = format_call("fix", {"line": broken_line(task), "code": code_of(*task.tests.spec[broken_line(task) - 2])})
        ended_right += doc.endswith(right)  # else a slip the 6 tests did not catch, or a failed fix:
        assert doc.endswith("}}</call>") or re.search(r"<obs>[0-5]/6 pass</obs>\n$", doc)
    assert ended_right >= 120
    first_wrong = sum(bool(re.search(r"<obs>[0-5]/6 pass", d)) for d in docs)
    retried = sum(d.count("<call>") == 2 for d in docs)
    assert 70 <= first_wrong <= 130 and 10 <= retried < first_wrong  # fix_slip_rate 0.5; room to retry
    held = {t.files["calc.py"] for t in spec.sample_tasks(200, 0, True)}
    shown = {d.partition("\n<call>")[0] for d in docs}
    assert not any(numbered(f) in s for f in held for s in shown)  # training split only


def test_a_slip_free_expert_always_fixes_the_line():
    spec = load_environment("fixit", sandbox=None, fix_slip_rate=0.0)
    docs = spec.build_corpus(100, 1)
    assert all(d.count("<call>") == 1 and d.endswith("}}</call>") for d in docs)


def test_the_corpus_grader_agrees_with_the_sandbox(sandbox):
    from tidal.families.fixit.corpus import expert_plan, grade_written

    spec = load_environment("fixit", sandbox=None)
    seen = []

    def spy(task, source):
        seen.append((task, source))
        return grade_written(task, source)

    for i, task in enumerate(spec.sample_tasks(8, 4, False)):
        env = spec.make()
        env.grade = spy
        asyncio.run(env.reset(task))
        seen.append((task, task.files["calc.py"]))
        for turn in expert_plan(task, random.Random(i), slip_rate=0.5):
            asyncio.run(env.step(turn))
    assert len(seen) > 8
    for task, source in seen:
        [real] = funcs.grade_many(sandbox, [task.tests], [source])
        assert grade_written(task, source) == dataclasses.replace(real, wall_s=0.0)


def test_the_broken_line_keeps_its_constant_and_changes_its_operator():
    from tidal.families.fixit.corpus import steps_of

    for task in sample_tasks(FixitConfig(), 300, 2, False):
        written, spec = steps_of(task.files["calc.py"]), task.tests.spec
        (i,) = [i for i, (w, s) in enumerate(zip(written, spec)) if w != s]
        assert written[i][0] != spec[i][0]  # another operator
        if funcs.OP_BY_NAME[written[i][0]][3] and spec[i][1]:
            assert written[i][1] == spec[i][1]  # the same constant, where both take one
