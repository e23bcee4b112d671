"""The "agent" family: examples/harness_agent.py's coding agent as a native tidal environment.

Its system prompt, its ``run_python``, ``write_file`` and ``submit`` tools and its rules, with a
task family's tasks and grader, run by tidal's own tool-calling loop (harness/tool_episode.py)
instead of an outside process over the gateway: the native side of ``tidal bench harness``, and a
template for an environment that speaks OpenAI function calls.
"""

from tidal.families.agent.config import AgentConfig
from tidal.families.agent.environment import SYSTEM, TOOLS, AgentEnvironment, load_environment

Config = AgentConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["SYSTEM", "TOOLS", "AgentConfig", "AgentEnvironment", "Config", "load_environment"]
