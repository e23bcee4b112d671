"""The fixit family as tidal loads it (``env.name = "fixit"``): its environment, tasks and corpus
in one EnvironmentSpec."""

from __future__ import annotations

from tidal.env import EnvironmentSpec
from tidal.families import funcs
from tidal.families.fixit.corpus import CORPUS_VERSION, build_corpus
from tidal.families.fixit.environment import RUBRIC, Fixit, FixitConfig, FixitTask, all_tests_pass, sample_tasks
from tidal.families.funcs import Grade


def load_environment(sandbox=None, config: FixitConfig | None = None) -> EnvironmentSpec:
    """``sandbox`` runs the tests (None: tasks and the corpus only); ``config``: env.args."""
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
