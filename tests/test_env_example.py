"""The documented example environment "fixit": the docs show its exact source, it uses only
public names, a scripted expert solves it through the harness, its corpus is the expert's
episodes as the harness renders them, and a tiny random model runs it end to end."""

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from harness_fakes import ScriptedEngine
from tidal.engine.config import EngineConfig
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationResult
from tidal.env import OBS_OPEN, format_call, load_environment
from tidal.harness import HarnessConfig, run_episodes
from tidal.model import ByteTokenizer, build_model, preset
from tidal.envs.fixit.environment import source_of
from tidal.sandbox import Sandbox, SandboxConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig())


def test_the_docs_list_the_example_verbatim():
    doc = (ROOT / "docs/environments.md").read_text()
    listing = re.search(r"<!-- fixit.py -->\n```python\n(.*?)```", doc, re.S).group(1)
    assert listing == (ROOT / "src/tidal/envs/fixit/environment.py").read_text()


def test_tasks_are_deterministic_and_splits_disjoint():
    spec = load_environment("fixit", sandbox=None)
    a, b = spec.sample_tasks(20, 3, False), spec.sample_tasks(20, 3, False)
    assert a == b
    held = spec.sample_tasks(20, 3, True)
    assert not {t.tests.spec for t in a} & {t.tests.spec for t in held}
    for t in a:  # the file is wrong: its text differs from the reference solution
        assert t.files["calc.py"] != source_of(t.tests.spec)


PUBLIC_MODULES = {"tidal.env", "tidal.envs", "tidal.envs.funcs", "tidal.envs.fixit.environment",
                  "tidal.harness", "tidal.model"}
"""What a user's environment could import too (no harness, engine or family internals)."""


def test_fixit_uses_only_public_names():
    for path in (ROOT / "src/tidal/envs/fixit").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("tidal"):
                assert node.module in PUBLIC_MODULES | {"tidal.envs.fixit.corpus"}, (path, node.module)
                assert not any(a.name.startswith("_") for a in node.names), (path, node.module)
            if isinstance(node, ast.Attribute):
                assert not (node.attr.startswith("_") and not node.attr.startswith("__")), (path, node.attr)
    assert "._slip" not in (ROOT / "src/tidal/envs/fixit/environment.py").read_text()


class Expert:
    """Reads calc.py, writes the reference solution, runs the tests, submits; one mistake first
    when ``clumsy``."""

    def __init__(self, tasks, clumsy=False):
        self.tasks, self.clumsy = tasks, clumsy
        self.tok = ByteTokenizer()

    async def generate(self, request):
        index, kind = request.tag
        task = self.tasks[index]
        fixed = source_of(task.tests.spec)
        plan = ([format_call("write", {"path": "calc.py", "content": 3})] if self.clumsy else []) + [
            format_call("read", {"path": "calc.py"}),
            "Fix it. " + format_call("write", {"path": "calc.py", "content": fixed}),
            format_call("run_tests", {}),
            format_call("submit", {}),
        ]
        text = plan[self.tok.decode(request.prompt_ids).count(OBS_OPEN)]
        ids = self.tok.encode(text)[: request.max_new_tokens]
        return GenerationResult(0, request.prompt_ids, ids, [-0.1] * len(ids), [0] * len(ids),
                                None, "stop", self.tok.decode(ids), request.tag)


@pytest.mark.parametrize("clumsy", [False, True])
def test_a_scripted_expert_solves_fixit_through_the_harness(sandbox, clumsy):
    spec = load_environment("fixit", sandbox=sandbox)
    tasks = spec.sample_tasks(3, 0, False)
    shell = ScriptedEngine(policy=None, max_seq_len=2048, max_new_tokens=200)
    trajs, _ = run_episodes(shell, spec, tasks, HarnessConfig(max_turns=6), client=Expert(tasks, clumsy))
    for t, task in zip(trajs, tasks):
        text = ByteTokenizer().decode(t.segments[0].completion_ids)
        assert "/6 pass (" in text and t.info["reward/tests_pass"] == 1.0
        assert t.reward == pytest.approx(1.0 if clumsy else 1.1)  # clean_calls term (0.1)
        assert t.episode.tool_errors == float(clumsy)
        assert t.solved and t.reason == "pass" and t.level == task.level  # solved despite 1.0 < 1.1


def test_an_unfixed_file_earns_only_partial_credit(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    env = spec.make()
    import asyncio

    async def episode():
        await env.reset(spec.sample_tasks(1, 5, False)[0])
        result = await env.step(format_call("submit", {}))
        await env.close()
        return result

    result = asyncio.run(episode())
    assert result.done and result.info["reward/tests_pass"] < 1.0
    assert result.reward == pytest.approx(result.info["reward/tests_pass"] + 0.1)
    assert result.info["reason"] == "wrong_answer" and not spec.success(result.reward, result.info)


def test_a_tiny_random_model_runs_fixit_end_to_end(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    engine = Engine(build_model(preset("tiny"), seed=0), ByteTokenizer(),
                    EngineConfig(max_seq_len=512, max_new_tokens=24, seed=0))
    cfg = HarnessConfig(context_mode="summarize", summary_max_tokens=16, max_turns=4)
    trajs, stats = run_episodes(engine, spec, spec.sample_tasks(2, 1, False), cfg, samples_per_task=2)
    assert len(trajs) == 4 and stats.generated_tokens > 0
    for t in trajs:
        assert t.reason in {"turn_budget", "done", "context", "token_budget"}
        assert t.episode.turns >= 1 and t.episode.tool_errors <= t.episode.turns
        for seg in t.segments:
            assert len(seg.prompt_ids) + len(seg.completion_ids) <= 512


# ---------------------------------------------------------------- the mid-training corpus


def test_the_corpus_is_expert_episodes_exactly_as_the_harness_shows_them():
    import asyncio

    from tidal.envs.fixit.environment import FixitConfig, sample_tasks

    spec = load_environment("fixit", sandbox=None)
    docs = spec.build_corpus(60, 0)
    assert len(docs) == 60 and docs == spec.build_corpus(60, 0)
    tasks = sample_tasks(FixitConfig(), 60, 1_000_003, False)
    for doc, task in zip(docs, tasks):
        env = spec.make()
        head = asyncio.run(env.reset(task))  # the context's head, as the model sees it
        assert doc.startswith(head + format_call("read", {"path": "calc.py"}) + OBS_OPEN + task.files["calc.py"])
        assert doc.endswith(format_call("submit", {}))  # the episode ends there
    wrong = sum("(wrong_answer)" in d for d in docs)
    retried = sum(d.count(format_call("run_tests", {})) == 2 for d in docs)
    assert 5 <= wrong <= 35 and 1 <= retried < wrong  # fix_slip_rate 0.3; half of them retry
    held = {t.prompt for t in spec.sample_tasks(200, 0, True)}
    assert not any(p in d for p in held for d in docs)  # training split only


def test_the_corpus_grader_agrees_with_the_sandbox(sandbox):
    import random

    from tidal.envs.fixit.corpus import expert_plan, grade_written
    from tidal.envs.funcs import grade_many

    spec = load_environment("fixit", sandbox=None)
    for i, task in enumerate(spec.sample_tasks(6, 4, False)):
        for turn in expert_plan(task, random.Random(i), slip_rate=0.5):
            if '"write"' in turn:
                source = json.loads(turn[len("<call>"):-len("</call>")])["write"]["content"]
                [real] = grade_many(sandbox, [task.tests], [source])
                assert grade_written(task, source) == dataclasses.replace(real, wall_s=0.0)
