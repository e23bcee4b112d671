"""The agent's world: a task family's task, asked as examples/harness_agent.py asks it, and its
three tools run in tidal's sandbox.

    reset(task)  -> [system: SYSTEM, user: the task's prompt]
    step(reply)  -> each tool call's result as a "tool" message; ``submit`` (or a reply with no
                    call: its fenced code block) is graded by the family and ends the episode

What the example does with ``subprocess`` in its working folder this does in the sandbox: a
``write_file`` file is in the folder of every later ``run_python``.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from tidal.env.base import Environment, StepResult, final_answer
from tidal.env.registry import load_environment as load_family
from tidal.env.spec import EnvironmentSpec
from tidal.env.tools import run_blocking
from tidal.families.agent.config import AgentConfig
from tidal.errors import UserError
from tidal.harness.chat_format import as_messages
from tidal.sandbox.sandbox import MAIN

SYSTEM = "You are a coding agent. Use the tools: test your code with run_python, then submit it."
"""examples/harness_agent.py's system prompt (a test keeps the two equal)."""
TOOLS = [
    {"type": "function", "function": {
        "name": "run_python", "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                       "required": ["code"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file in the working folder.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the final code (the task's function).",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                       "required": ["code"]}}},
]
"""examples/harness_agent.py's tools (a test keeps the two equal)."""
PARAMETERS = {t["function"]["name"]: tuple(t["function"]["parameters"]["required"]) for t in TOOLS}
"""Each tool's parameters (all required strings)."""


def code_of(text: str) -> str:
    """A reply's first fenced code block, else its whole text (as the example reads it)."""
    blocks = re.findall(r"```(?:python)?\n(.*?)```", text, re.S)
    return blocks[0] if blocks else text


class AgentEnvironment(Environment):
    def __init__(self, family_env: Environment, sandbox, output_chars: int = 500):
        self.inner, self.sandbox, self.output_chars = family_env, sandbox, output_chars
        self.files: dict[str, str] = {}
        """What write_file wrote, in every later run_python's folder."""

    async def reset(self, task: Any) -> list[dict]:
        prompt = as_messages(await self.inner.reset(task))[-1].get("content", "")
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]

    async def step(self, action: dict) -> StepResult:
        """``action``: the assistant message (content and parsed ``tool_calls``)."""
        calls = action.get("tool_calls") or []
        if not calls:
            return await final_answer(self.inner, code_of(action.get("content") or ""))
        results = []
        for call in calls:
            name = call["function"]["name"]
            args = json.loads(call["function"]["arguments"])
            if name == "submit" and _strings(args, PARAMETERS["submit"]):
                return await final_answer(self.inner, args["code"])
            results.append({"role": "tool", "tool_call_id": call["id"],
                            "content": await self._call(name, args)})
        return StepResult(results)

    async def end(self, reason: str) -> StepResult:
        return await self.inner.end(reason)

    def evidence(self):
        return self.inner.evidence()

    async def close(self) -> None:
        await self.inner.close()

    async def _call(self, name: str, args: dict) -> str:
        """A non-final tool's output; a call with wrong arguments gets an error, as in the
        example (a TypeError from calling the function)."""
        params = PARAMETERS[name]
        if not _strings(args, params):
            return f"error: TypeError: {name}() takes {', '.join(params)} (strings)"
        if name == "write_file":
            return self._write(args["path"], args["content"])
        done = await run_blocking(self.sandbox.run_python, args["code"], files=dict(self.files))
        if done.killed_reason == "timeout":
            return "timed out"
        return (done.stdout + done.stderr)[-self.output_chars:] or "(no output)"

    def _write(self, path: str, content: str) -> str:
        if path.startswith("/") or ".." in path.split("/") or path == MAIN:
            return "error: write inside the working folder"
        self.files[path] = content
        return f"wrote {len(content)} characters to {path}"


def _strings(args: dict, params: tuple[str, ...]) -> bool:
    return set(args) == set(params) and all(isinstance(args[p], str) for p in params)


def load_environment(sandbox=None, config: AgentConfig | None = None) -> EnvironmentSpec:
    cfg = config or AgentConfig()
    if cfg.tasks in ("agent", "harness"):
        raise UserError(f"env.args.tasks names the family whose tasks the agent solves; it "
                         f"cannot be {cfg.tasks!r}")
    family = load_family(cfg.tasks, sandbox=sandbox, **cfg.task_args)
    return replace(family, name=f"agent:{family.name}", tools=TOOLS, build_corpus=None,
                   make=lambda: AgentEnvironment(family.make(), sandbox, cfg.output_chars))
