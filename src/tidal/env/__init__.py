"""Environments: what the agent acts in. Bring your own as a module exposing
``load_environment(sandbox=None, ...) -> EnvironmentSpec`` and, optionally, ``Config`` (the
pydantic model of its ``env.args``); see docs/environments.md. The built-in families live in
``tidal.families``."""

from tidal.env.base import Environment, StepResult
from tidal.env.config import EnvConfig
from tidal.env.grading import (NONCE_PREAMBLE, Verdict, grading_slots, parse_verdict, run_graded,
                               run_graded_many)
from tidal.env.registry import (ENVIRONMENTS, EnvironmentArgsError, NoCorpus, UnknownEnvironment,
                                environment_corpus, from_config, load_environment, require_corpus,
                                resolved_args, validate_args)
from tidal.env.rubric import Rubric, RubricScore
from tidal.env.spec import EnvironmentSpec, reward_reaches_one
from tidal.env.tool_env import ToolEnvironment
from tidal.env.toolcall import CALL_CLOSE, CALL_OPEN, OBS_CLOSE, OBS_OPEN, format_call, parse_call
from tidal.env.tools import Tool, ToolError, ToolSet, run_blocking

__all__ = ["CALL_CLOSE", "CALL_OPEN", "ENVIRONMENTS", "EnvConfig", "Environment",
           "EnvironmentArgsError", "EnvironmentSpec", "NONCE_PREAMBLE", "NoCorpus", "OBS_CLOSE",
           "OBS_OPEN", "Rubric", "RubricScore", "StepResult", "Tool", "ToolError",
           "ToolEnvironment", "ToolSet", "UnknownEnvironment", "Verdict", "environment_corpus",
           "format_call", "from_config", "grading_slots", "load_environment", "parse_call",
           "parse_verdict", "require_corpus", "resolved_args", "reward_reaches_one", "run_blocking",
           "run_graded", "run_graded_many", "validate_args"]
