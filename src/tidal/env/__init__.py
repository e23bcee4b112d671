"""Environments: what the agent acts in. Bring your own as a module exposing
``load_environment(**kwargs) -> EnvironmentSpec`` (docs/environments.md)."""

from tidal.env.base import Environment, StepResult
from tidal.env.registry import ENVIRONMENTS, from_config, load_environment
from tidal.env.rubric import Rubric, RubricScore
from tidal.env.spec import EnvironmentSpec
from tidal.env.tool_env import ToolEnvironment
from tidal.env.toolcall import CALL_CLOSE, CALL_OPEN, OBS_CLOSE, OBS_OPEN, format_call, parse_call
from tidal.env.tools import Tool, ToolError, ToolSet

__all__ = ["CALL_CLOSE", "CALL_OPEN", "ENVIRONMENTS", "Environment", "EnvironmentSpec",
           "OBS_CLOSE", "OBS_OPEN", "Rubric", "RubricScore", "StepResult", "Tool", "ToolError",
           "ToolEnvironment", "ToolSet", "format_call", "from_config", "load_environment",
           "parse_call"]
