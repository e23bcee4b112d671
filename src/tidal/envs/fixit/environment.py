"""Example environment "fixit": find and fix the one wrong line of calc.py, using tools.

A complete environment (docs/environments.md walks through it): its settings, tasks, tools, a
rubric, what counts as success and ``load_environment``; its mid-training corpus is in
corpus.py. It builds only on public names (tidal.env, and the funcs family's task generator and
grader). The model reads calc.py, rewrites it, runs the tests in the sandbox and submits:

    <call>{"read":{"path":"calc.py"}}</call>
    <call>{"write":{"path":"calc.py","content":"def f(x):\\n    x = x + 3\\n    return x\\n"}}</call>
    <call>{"run_tests":{}}</call>
    <call>{"submit":{}}</call>
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tidal.env import EnvironmentSpec, Rubric, RubricScore, ToolEnvironment, ToolError
from tidal.envs import funcs
from tidal.envs.funcs import Grade

MAX_FILE_CHARS = 2000
HELDOUT_BUCKETS = 10


class FixitConfig(BaseModel):
    """fixit's settings: ``env.args`` when ``env.name = "fixit"``."""

    model_config = ConfigDict(extra="forbid")
    min_level: int = Field(1, ge=1)
    """Fewest lines in f (one of them is wrong)."""
    max_level: int = Field(2, ge=1)
    """Most lines in f."""
    num_tests: int = Field(6, ge=1)
    """Hidden tests run_tests and submit check calc.py against."""
    fix_slip_rate: float = Field(0.3, ge=0.0, lt=1.0)
    """Mid-training corpus realism: the chance that the expert's fix is itself wrong (see
    corpus.py); 0 = the expert always fixes the line."""

    @model_validator(mode="after")
    def _check(self) -> "FixitConfig":
        if self.min_level > self.max_level:
            raise ValueError(f"min_level ({self.min_level}) exceeds max_level ({self.max_level})")
        return self


@dataclass(frozen=True)
class FixitTask:
    task_id: str
    prompt: str
    files: dict[str, str]
    tests: funcs.Task
    """A funcs task with an empty prompt: grading it runs calc.py against its hidden tests."""

    @property
    def level(self) -> int:
        return self.tests.level


def source_of(spec) -> str:
    """calc.py implementing ``spec``."""
    return "def f(x):\n" + funcs.solution_text(spec).rstrip("\n") + "\n"


def make_task(spec, rng: random.Random, num_tests: int) -> FixitTask:
    """calc.py implements ``spec`` except for one line, which has a typical slip."""
    tests = dataclasses.replace(funcs.make_task(spec, rng, num_examples=0, num_tests=num_tests),
                                prompt="")
    broken = rng.randrange(len(spec))
    written = tuple(funcs.slip(rng, *op) if i == broken else op for i, op in enumerate(spec))
    prompt = f"calc.py has one wrong line. f should: {funcs.describe(spec)}"
    return FixitTask(f"fixit-{tests.task_id}", prompt, {"calc.py": source_of(written)}, tests)


def sample_tasks(cfg: FixitConfig, n: int, seed: int, heldout: bool) -> list[FixitTask]:
    """Deterministic in the arguments; a spec is held out iff the funcs family holds it out."""
    rng = random.Random(f"fixit-{seed}-{heldout}")
    tasks: list[FixitTask] = []
    while len(tasks) < n:
        spec = funcs.random_spec(rng, rng.randint(cfg.min_level, cfg.max_level))
        if funcs.is_heldout(spec, HELDOUT_BUCKETS) == heldout:
            task = make_task(spec, rng, cfg.num_tests)
            if task.files["calc.py"] != source_of(spec):
                tasks.append(task)  # skip the rare slip that changes nothing in the text
    return tasks


Grader = Callable[[FixitTask, str], Grade]
"""(task, calc.py's text) -> the hidden tests' verdict."""


class Fixit(ToolEnvironment):
    system_prompt = 'Fix the bug. One tool call per turn: <call>{"TOOL":{ARGS}}</call>'
    tool_style = "signature"

    def __init__(self, grade: Grader, rubric: Rubric):
        super().__init__(rubric)
        self.grade = grade
        self.files: dict[str, str] = {}
        self.verdict: Grade | None = None
        """The hidden tests' verdict on calc.py at submission."""

    async def setup(self, task: FixitTask) -> str:
        self.files = dict(task.files)
        return task.prompt

    def tools(self):
        return [self.read, self.write, self.run_tests, self.submit]

    def read(self, path: str) -> str:
        """Show a file."""
        if path not in self.files:
            raise ToolError(f"no file {path!r}; files: {', '.join(sorted(self.files))}")
        return self.files[path]

    def write(self, path: str, content: str) -> str:
        """Replace a file's content."""
        if len(content) > MAX_FILE_CHARS:
            raise ToolError(f"content is {len(content)} characters; the limit is {MAX_FILE_CHARS}")
        self.files[path] = content
        return f"wrote {len(content)} characters"

    def run_tests(self) -> str:
        """Run the tests of f in calc.py."""
        grade = self.grade(self.task, self.files.get("calc.py", ""))
        return f"{grade.passed}/{grade.total} pass ({grade.reason})"

    def submit(self) -> str:
        """Finish: calc.py is graded."""
        self.verdict = self.grade(self.task, self.files.get("calc.py", ""))
        self.finish()
        return "submitted"

    def reason(self, score: RubricScore) -> str:
        return self.verdict.reason  # "pass", "wrong_answer", "syntax_error", "timeout", ...


def tests_pass(task: FixitTask, env: Fixit) -> float:
    """Fraction of the hidden tests calc.py passes at submission."""
    return env.verdict.passed / env.verdict.total


def clean_calls(task: FixitTask, env: Fixit) -> float:
    """1 if no tool call of the episode was malformed."""
    return 1.0 if env.tool_errors == 0 else 0.0


RUBRIC = Rubric([(tests_pass, 1.0), (clean_calls, 0.1)])


def all_tests_pass(reward: float, info: dict[str, Any]) -> bool:
    """Success is every hidden test passing: the reward (up to 1.1) also has clean_calls' bonus."""
    return info.get("reward/tests_pass") == 1.0


def load_environment(sandbox=None, config: FixitConfig | None = None) -> EnvironmentSpec:
    """``sandbox`` runs the tests (None: tasks and the corpus only); ``config``: env.args."""
    from tidal.envs.fixit.corpus import CORPUS_VERSION, build_corpus

    cfg = config or FixitConfig()

    def in_sandbox(task: FixitTask, source: str) -> Grade:
        return funcs.grade_many(sandbox, [task.tests], [source])[0]

    return EnvironmentSpec(
        name="fixit",
        make=lambda: Fixit(in_sandbox, RUBRIC),
        sample_tasks=lambda n, seed, heldout: sample_tasks(cfg, n, seed, heldout),
        build_corpus=lambda n_docs, seed: build_corpus(cfg, n_docs, seed),
        corpus_version=CORPUS_VERSION,
        success=all_tests_pass,
    )
