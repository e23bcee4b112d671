"""A harness's mid-training corpus: its own conversations (the analogue of a product's logs),
rendered through the chat template into documents.

``env.args.corpus_command`` gets the family's *training* tasks as JSON lines on stdin (the
harness's task JSON, {"task_id", "messages", "prompt"}, plus the task's own fields and its
``reference_solution`` where it has one) and prints one conversation per line, {"messages",
"tools"} in OpenAI's shapes. Each is rendered as the gateway renders requests (tidal's plain
template for the byte model, tools in its default format), so mid-training teaches the model the
exact text it is asked in and must answer in."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from typing import Any

from tidal.env.spec import EnvironmentSpec
from tidal.errors import UserError
from tidal.gateway.config import GatewayConfig
from tidal.gateway.episode import harness_argv
from tidal.harness.chat_format import as_messages
from tidal.chat.tool_calls import template_messages

CORPUS_TIMEOUT_S = 1800
"""Longest the corpus command may run."""


def build_corpus(cfg: GatewayConfig, family: EnvironmentSpec, n_docs: int, seed: int) -> list[str]:
    tasks = family.sample_tasks(n_docs, seed + 1_000_003, False)
    records = asyncio.run(_records(family, tasks))
    lines = "".join(json.dumps(r) + "\n" for r in records)
    try:
        done = subprocess.run(harness_argv(cfg.corpus_command), input=lines, capture_output=True,
                              text=True, timeout=CORPUS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"env.args.corpus_command {cfg.corpus_command!r} failed: {e}") from None
    if done.returncode != 0:
        raise UserError(f"env.args.corpus_command {cfg.corpus_command!r} exited with code "
                        f"{done.returncode}; its stderr ends: {done.stderr[-1500:]}")
    from tidal.chat.template import ChatTemplate

    plain = ChatTemplate()
    return [render_conversation(plain, line, n)
            for n, line in enumerate(done.stdout.splitlines(), 1) if line.strip()]


def render_conversation(template, line: str, number: int) -> str:
    """One {"messages", "tools"} line as ``template`` renders it (no generation prompt)."""
    try:
        conv = json.loads(line)
        messages, tools = conv["messages"], conv.get("tools")
        return template.render(template_messages(messages), tools=tools,
                               add_generation_prompt=False)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"line {number} of env.args.corpus_command's output is not a "
                        f'{{"messages": [...], "tools": [...]}} conversation: {e}') from None


async def _records(family: EnvironmentSpec, tasks: list[Any]) -> list[dict[str, Any]]:
    out = []
    for task in tasks:
        env = family.make()
        try:
            messages = as_messages(await env.reset(task))
        finally:
            await env.close()
        record = dataclasses.asdict(task) if dataclasses.is_dataclass(task) else {}
        if hasattr(task, "reference_solution"):
            record["reference_solution"] = task.reference_solution
        out.append({**record, "task_id": task.task_id, "messages": messages,
                    "prompt": messages[-1].get("content", "")})
    return out
