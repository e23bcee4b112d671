"""The documented example environment "fixit": the docs show its exact source, a scripted expert
solves it through the harness, and a tiny random model runs it end to end without crashing."""

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
from tidal.sandbox import Sandbox, SandboxConfig
from tidal.envs.funcs import tasks as family

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
        assert t.files["calc.py"] != "def f(x):\n" + family.solution_text(t.tests.spec).rstrip("\n") + "\n"


class Expert:
    """Reads calc.py, writes the reference solution, runs the tests, submits; one mistake first
    when ``clumsy``."""

    def __init__(self, tasks, clumsy=False):
        self.tasks, self.clumsy = tasks, clumsy
        self.tok = ByteTokenizer()

    async def generate(self, request):
        index, kind = request.tag
        task = self.tasks[index]
        fixed = "def f(x):\n" + family.solution_text(task.tests.spec).rstrip("\n") + "\n"
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
    for t in trajs:
        text = ByteTokenizer().decode(t.segments[0].completion_ids)
        assert "/6 pass (" in text and t.info["reward/tests_pass"] == 1.0
        assert t.reward == pytest.approx(1.0 if clumsy else 1.1)  # clean_calls term (0.1)
        assert t.info["tool_errors"] == float(clumsy)


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


def test_a_tiny_random_model_runs_fixit_end_to_end(sandbox):
    spec = load_environment("fixit", sandbox=sandbox)
    engine = Engine(build_model(preset("tiny"), seed=0), ByteTokenizer(),
                    EngineConfig(max_seq_len=512, max_new_tokens=24, seed=0))
    cfg = HarnessConfig(context_mode="summarize", summary_max_tokens=16, max_turns=4)
    trajs, stats = run_episodes(engine, spec, spec.sample_tasks(2, 1, False), cfg, samples_per_task=2)
    assert len(trajs) == 4 and stats.generated_tokens > 0
    for t in trajs:
        assert t.reason in {"turn_budget", "done", "context", "token_budget"}
        assert t.info["turns"] >= 1 and t.info["tool_errors"] <= t.info["turns"]
        for seg in t.segments:
            assert len(seg.prompt_ids) + len(seg.completion_ids) <= 512
