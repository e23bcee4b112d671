"""Example environment "fixit": find and fix the one wrong line of calc.py, using tools.

A complete environment in one file (docs/environments.md walks through it): tasks, tools, a
rubric and ``load_environment``. The model reads calc.py, rewrites it, runs the tests in the
sandbox and submits:

    <call>{"read":{"path":"calc.py"}}</call>
    <call>{"write":{"path":"calc.py","content":"def f(x):\\n    x = x + 3\\n    return x\\n"}}</call>
    <call>{"run_tests":{}}</call>
    <call>{"submit":{}}</call>
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from tidal.env import EnvironmentSpec, Rubric, ToolEnvironment, ToolError
from tidal.envs.funcs import tasks as family
from tidal.envs.funcs.grader import grade_many

MAX_FILE_CHARS = 2000


@dataclass(frozen=True)
class FixitTask:
    task_id: str
    prompt: str
    files: dict[str, str]
    tests: family.Task
    """A funcs task with an empty prompt: grading it runs calc.py against its hidden tests."""


def make_task(spec, rng: random.Random) -> FixitTask:
    """calc.py implements ``spec`` except for one line, which has a typical slip."""
    tests = dataclasses.replace(family.make_task(spec, rng, num_examples=0, num_tests=6), prompt="")
    broken = rng.randrange(len(spec))
    written = tuple(family._slip(rng, *op) if i == broken else op for i, op in enumerate(spec))
    source = "def f(x):\n" + family.solution_text(written).rstrip("\n") + "\n"
    prompt = f"calc.py has one wrong line. f should: {family.describe(spec)}"
    return FixitTask(f"fixit-{tests.task_id}", prompt, {"calc.py": source}, tests)


def sample_tasks(n: int, seed: int, heldout: bool, min_level: int, max_level: int) -> list[FixitTask]:
    """Deterministic in the arguments; a spec is held out iff the funcs family holds it out."""
    rng = random.Random(f"fixit-{seed}-{heldout}")
    tasks: list[FixitTask] = []
    while len(tasks) < n:
        spec = family.random_spec(rng, rng.randint(min_level, max_level))
        if family.is_heldout(spec, 10) == heldout:
            task = make_task(spec, rng)
            if task.files["calc.py"] != "def f(x):\n" + family.solution_text(spec).rstrip("\n") + "\n":
                tasks.append(task)  # skip the rare slip that changes nothing in the text
    return tasks


class Fixit(ToolEnvironment):
    system_prompt = 'Fix the bug. One tool call per turn: <call>{"TOOL":{ARGS}}</call>'
    tool_style = "signature"

    def __init__(self, sandbox, rubric: Rubric):
        super().__init__(rubric)
        self.sandbox = sandbox
        self.files: dict[str, str] = {}
        self.passed, self.total = 0, 0

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
        grade = self._grade()
        return f"{grade.passed}/{grade.total} pass ({grade.reason})"

    def submit(self) -> str:
        """Finish: calc.py is graded."""
        grade = self._grade()
        self.passed, self.total = grade.passed, grade.total
        self.finish()
        return "submitted"

    def _grade(self):
        return grade_many(self.sandbox, [self.task.tests], [self.files.get("calc.py", "")])[0]


def tests_pass(task: FixitTask, env: Fixit) -> float:
    """Fraction of the hidden tests calc.py passes at submission."""
    return env.passed / env.total if env.total else 0.0


def clean_calls(task: FixitTask, env: Fixit) -> float:
    """1 if no tool call of the episode was malformed."""
    return 1.0 if env.tool_errors == 0 else 0.0


def load_environment(sandbox, min_level: int = 1, max_level: int = 2) -> EnvironmentSpec:
    rubric = Rubric([(tests_pass, 1.0), (clean_calls, 0.1)])
    return EnvironmentSpec(
        name="fixit",
        make=lambda: Fixit(sandbox, rubric),
        sample_tasks=lambda n, seed, heldout: sample_tasks(n, seed, heldout, min_level, max_level),
    )
