"""The "pyrepo" family: a small repository whose pytest tests fail (calc/ops.py's f, from a
funcs spec), solved over many turns with read / write / run_tests / submit in one sandbox
rollout, and graded by hidden pytest tests in a fresh sandbox after the episode (issue 13,
items 0-2 end to end): tasks.py, grader.py, environment.py. No mid-training corpus."""

from tidal.families.pyrepo.config import PyrepoConfig
from tidal.families.pyrepo.environment import (
                                           PyrepoEnvironment,
                                           hidden_tests_pass,
                                           load_environment,
                                           pytest_env,
)
from tidal.families.pyrepo.grader import (
                                           VERDICT_PROGRAM,
                                           Grading,
                                           PytestVerdict,
                                           grade_repo,
                                           verdict_program,
)
from tidal.families.pyrepo.tasks import (
                                           EDITABLE,
                                           GENERATOR_VERSION,
                                           HIDDEN_FILE,
                                           OPS_FILE,
                                           PROTECTED,
                                           VISIBLE_FILE,
                                           RepoTask,
                                           make_task,
                                           sample_tasks,
)

Config = PyrepoConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["Config", "EDITABLE", "GENERATOR_VERSION", "Grading", "HIDDEN_FILE", "OPS_FILE",
           "PROTECTED", "PyrepoConfig", "PyrepoEnvironment", "PytestVerdict", "RepoTask",
           "VERDICT_PROGRAM", "VISIBLE_FILE", "grade_repo", "hidden_tests_pass",
           "load_environment", "make_task", "pytest_env", "sample_tasks", "verdict_program"]
