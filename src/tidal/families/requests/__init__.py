"""The "requests" family: everyday coding requests about strings and lists, asked in plain
English to a chat model and graded by funcs' grader (see tasks.py). Instruct-only, no corpus: it
measures whether what a chat model could already do outside funcs survives RL on funcs."""

from tidal.families.requests.config import RequestsConfig
from tidal.families.requests.environment import RequestsEnvironment, load_environment
from tidal.families.requests.tasks import (GENERATOR_VERSION, KIND_BY_NAME, KINDS, Kind, Task,
                                       canonical, instruction_text, is_heldout, make_task,
                                       reference, sample_tasks)

Config = RequestsConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["Config", "GENERATOR_VERSION", "KINDS", "KIND_BY_NAME", "Kind", "RequestsConfig",
           "RequestsEnvironment", "Task", "canonical", "instruction_text", "is_heldout",
           "load_environment", "make_task", "reference", "sample_tasks"]
