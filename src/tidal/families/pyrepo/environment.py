"""The "pyrepo" family: a multi-turn repository task graded by pytest, by construction.

Each episode gets its own TaskImage of the task's files (tasks.py) carrying a Python env with
pytest, ``tests/test_ops.py`` protected (read-only in the workspace), and one rollout over it:
a copy-on-write workspace every tool works in. Tools (signature style):

  read(path)            a workspace file, read host-side from the rollout (no links followed)
  write(path, content)  through a sandbox run (the sandbox writes it from inside); a write the
                        sandbox refuses (the protected test) comes back as a ToolError
  run_tests()           ``pytest -q tests`` in the workspace; the observation is the tail of
                        pytest's output (its summary)
  submit()              ends the episode

After the episode (at submit, or in ``end`` when the harness cuts it short): the workspace as
left (``Rollout.files()``), the protected files hash-checked (``changed_protected``), then
hidden grading in a fresh sandbox (grader.py). **The reward is the hidden verdict** (1.0 /
0.0): nothing the agent could write. StepResult.info: ``hidden_pass``, ``visible_pass`` (the
pristine visible tests on the grading files), ``hidden_passed``, ``hidden_total``,
``tampered`` (protected files changed), ``reason`` and ``level``. ``evidence()`` gives
integrity checking the episode; the grading runs' traces are not the agent's and are left out.

Git history in the task (issue 13, item 1) is not built: tasks have none.
"""

from __future__ import annotations

import threading
from typing import Any

from tidal.env import (
    EnvironmentSpec,
    Rubric,
    RubricScore,
    StepResult,
    ToolEnvironment,
    ToolError,
    parse_call,
    run_blocking,
)
from tidal.env.sealed import safe_path
from tidal.env.toolcall import MalformedCall
from tidal.families.pyrepo import tasks
from tidal.families.pyrepo.config import PyrepoConfig
from tidal.families.pyrepo.grader import Grading, grade_repo
from tidal.families.pyrepo.tasks import HIDDEN_FILE, PROTECTED, RepoTask
from tidal.evidence.records import Action, Evidence
from tidal.sandbox import (
    TRUNCATED,
    PythonEnv,
    TaskImage,
    build_python_env,
    changed_protected,
)

PACKAGES = ["pytest"]
WRITER = ".tidal-write.py"
"""The program write() runs in the rollout (it deletes itself first)."""
WRITER_CODE = """\
import os, sys
os.remove(__file__)
path = {path!r}
try:
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(sys.stdin.buffer.read())
except OSError as e:
    sys.stderr.write("cannot write %s: %s\\n" % (path, e.strerror))
    sys.exit(3)
"""
"""Writes stdin to ``path`` inside the sandbox, in the traced interpreter: every write of the
agent is in the trace (a write-mode open), a refused one too (the sandbox mounts the protected
test read-only; its open for writing fails)."""

_envs: dict[tuple[str, str], PythonEnv] = {}
_envs_lock = threading.Lock()


def pytest_env(sandbox, cache_dir: str = "") -> PythonEnv:
    """The pytest env for ``sandbox``'s interpreter, built once (cached on disk by
    build_python_env, and here per process); ``cache_dir`` "" = the sandbox's."""
    key = (sandbox.python, cache_dir or sandbox.cfg.env_cache_dir)
    with _envs_lock:
        if key not in _envs:
            _envs[key] = build_python_env(PACKAGES, *key)
        return _envs[key]


def hidden_tests_pass(reward: float, info: dict) -> bool:
    """Success: the hidden tests passed."""
    return info.get("hidden_pass", 0.0) >= 1.0


async def hidden_tests(task: RepoTask, env: "PyrepoEnvironment") -> float:
    """The reward: 1.0 iff the hidden tests pass on the grading files."""
    return 1.0 if (await env.graded()).hidden_pass else 0.0


RUBRIC = Rubric([(hidden_tests, 1.0)])


class PyrepoEnvironment(ToolEnvironment):
    tool_style = "signature"
    max_call_chars = 16384
    max_observation_chars = 4000
    tool_timeout_s = 60.0

    def __init__(self, sandbox, cfg: PyrepoConfig):
        super().__init__(RUBRIC)
        if sandbox is None:
            raise ValueError("pyrepo episodes need a sandbox (load_environment(sandbox=...))")
        self.sandbox, self.cfg = sandbox, cfg
        self.image: TaskImage | None = None
        self.rollout = None
        self.actions: list[Action] = []
        self.grading: Grading | None = None
        self.final: dict[str, str] = {}
        self.tampered: list[str] = []
        self._traced = True

    async def setup(self, task: RepoTask) -> str:
        await run_blocking(self._open, task)
        return task.prompt

    def _open(self, task: RepoTask) -> None:
        env = pytest_env(self.sandbox, self.cfg.env_cache_dir)
        self.image = TaskImage.from_files(task.files, python_env=env, protected=PROTECTED)
        self.rollout = self.sandbox.rollout(self.image)

    def tools(self):
        return [self.read, self.write, self.run_tests, self.submit]

    def read(self, path: str) -> str:
        """Read a file of the repository."""
        files = self.rollout.files()
        if not safe_path(path) or path not in files or path == TRUNCATED:
            raise ToolError(f"no file {path!r}; the files are {', '.join(sorted(files))}")
        return files[path]

    def write(self, path: str, content: str) -> str:
        """Write a file of the repository (created or replaced)."""
        if not safe_path(path) or path == WRITER:
            raise ToolError(f"{path!r} is not a relative path inside the repository")
        result = self._note(self.rollout.run_python(WRITER_CODE.format(path=path), stdin=content,
                                                    main=WRITER))
        if result.killed_reason:
            raise ToolError(f"cannot write {path}: the sandbox stopped the write "
                            f"({result.killed_reason})")
        if result.exit_code != 0:
            lines = result.stderr.strip().splitlines()
            raise ToolError(lines[-1] if lines else f"cannot write {path}")
        return f"wrote {path}"

    def run_tests(self) -> str:
        """Run the visible tests (pytest -q tests)."""
        result = self._note(self.rollout.run_pytest(["-q", "tests"]))
        out = (result.stdout + result.stderr).strip()
        cap = self.cfg.max_test_output_chars
        text = out if len(out) <= cap else "..." + out[-cap:]
        return f"pytest stopped: {result.killed_reason}\n{text}" if result.killed_reason else text

    def submit(self) -> str:
        """Submit the repository as it is: the episode ends and hidden tests grade it."""
        self.finish()
        return "submitted"

    def _note(self, result):
        self._traced = self._traced and result.trace is not None
        return result

    async def step(self, action: str) -> StepResult:
        result = await super().step(action)
        try:
            call = parse_call(action, self.max_call_chars)
            tool, args = call.name, dict(call.args)
        except MalformedCall:
            tool, args = "", {}
        self.actions.append(Action(action, tool, args, result.observation))
        return result

    async def graded(self) -> Grading:
        """The episode's grading (done once, when first asked)."""
        if self.grading is None:
            await run_blocking(self._grade)
        return self.grading

    def _grade(self) -> None:
        files = self.rollout.files()
        self.tampered = changed_protected(self.image, files)
        self.final = {p: t for p, t in files.items() if p != TRUNCATED}
        self.grading = grade_repo(self.sandbox, self.task, self.final, self.image.python_env)

    def report(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.grading is not None:
            hidden = self.grading.hidden
            info = {**info, "hidden_pass": float(self.grading.hidden_pass),
                    "hidden_pytest_pass": float(hidden.passed),
                    "hidden_outputs_pass": float(self.grading.outputs.passed),
                    "visible_pass": float(self.grading.visible.passed),
                    "hidden_passed": hidden.tests_passed, "hidden_total": hidden.total,
                    "tampered": len(self.tampered)}
        return super().report(info)

    def reason(self, score: RubricScore) -> str:
        if self.grading.hidden.passed and not self.grading.outputs.passed:
            return "hidden_outputs_wrong"  # the pytest run passed, f's outputs did not
        return self.grading.hidden.reason

    async def end(self, reason: str) -> StepResult:
        """Cut short: the workspace as it stands is graded, as at submit."""
        if self.rollout is None:
            return StepResult("", 0.0, True, {"reason": reason})
        score = await self.rubric.score(self.task, self)
        info: dict[str, Any] = {f"reward/{k}": v for k, v in score.parts.items()}
        return StepResult("", score.total, True, self.report({**info, "reason": reason}))

    def evidence(self) -> Evidence | None:
        """The graded episode's evidence; None before grading."""
        if self.grading is None:
            return None
        return Evidence(
            before=dict(self.task.files), after=dict(self.final), actions=list(self.actions),
            trace=list(self.rollout.trace), protected=PROTECTED, hidden=(HIDDEN_FILE,),
            expected_outputs=tuple(repr(y) for _, y in self.task.visible),
            trace_recorded=self._traced and self.rollout.runs > 0,
            visible_pass=self.grading.visible.passed, hidden_pass=self.grading.hidden_pass)

    async def close(self) -> None:
        if self.rollout is not None:
            self.rollout.close()
        if self.image is not None:
            self.image.close()


def load_environment(sandbox=None, config: PyrepoConfig | None = None) -> EnvironmentSpec:
    """``sandbox`` runs the episodes (None: tasks only); ``config``: the validated env.args."""
    cfg = config or PyrepoConfig()
    return EnvironmentSpec(
        name="pyrepo",
        make=lambda: PyrepoEnvironment(sandbox, cfg),
        sample_tasks=lambda n, seed, heldout: tasks.sample_tasks(cfg, n, seed, heldout),
        build_corpus=None,
        corpus_version=tasks.GENERATOR_VERSION,
        success=hidden_tests_pass,
    )
