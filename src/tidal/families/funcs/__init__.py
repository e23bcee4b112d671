"""The "funcs" family: write a Python function from a one-line description (see tasks.py).

Public names other environments build on (fixit and ledger do): the task generator, the slips
of a hurried programmer, and the grader of a one-argument ``f``.
"""

from tidal.families.funcs.config import FuncsConfig
from tidal.families.funcs.corpus import build_corpus
from tidal.families.funcs.environment import FuncsEnvironment, load_environment
from tidal.families.funcs.grader import Grade, grade_many, reward_of
from tidal.families.funcs.tasks import (CONST_RANGE, GENERATOR_VERSION, OP_BY_NAME, OPS, Task,
                                    canonical, describe, evaluate, is_heldout, make_task,
                                    parse_solution, random_spec, sample_tasks, slip,
                                    solution_text, split_specs)

Config = FuncsConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["CONST_RANGE", "Config", "FuncsConfig", "FuncsEnvironment", "GENERATOR_VERSION",
           "Grade", "OPS", "OP_BY_NAME", "Task", "build_corpus", "canonical", "describe",
           "evaluate", "grade_many", "is_heldout", "load_environment", "make_task",
           "parse_solution", "random_spec", "reward_of", "sample_tasks", "slip", "solution_text",
           "split_specs"]
