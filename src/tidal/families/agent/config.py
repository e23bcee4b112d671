"""Settings of the "agent" family (``env.args`` when ``env.name = "agent"``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tidal.config_section import Section


class AgentConfig(Section):
    tasks: str = "funcs"
    """The family whose tasks the agent is given and whose environment grades what it submits."""
    task_args: dict[str, Any] = Field(default_factory=dict)
    """That family's env.args (e.g. {"prompt_style": "instruct"})."""
    output_chars: int = Field(500, ge=1)
    """run_python shows the last this many characters of the program's output."""
