"""One episode of an environment that speaks OpenAI chat messages and function calls
(``EnvironmentSpec.tools``): the loop an agent harness runs over the gateway, run in process.

    messages = env.reset(task)                           # chat messages (system, user)
    repeat:
        turn = engine(template(messages, tools))         # token-exact: gateway/turn.take_turn
        messages += [turn's assistant message]           # content and parsed tool calls
        step = env.step(that message)                    # its tool results, as "tool" messages
        messages += step.observation
    until done, or the turn / token budget (harness.max_turns / max_tokens) or the context runs out

The prompt is the checkpoint's chat template with the tools (tidal's plain template with its
Hermes-style tools block for the byte model), exactly as the gateway renders an outside harness's
requests, and each turn extends the same segment (harness/history.py), so a native environment
and an outside harness doing the same work train on the same tokens.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tidal.env.base import Environment, StepResult
from tidal.env.tools import run_blocking
from tidal.harness.history import History
from tidal.chat.render import Renderer
from tidal.harness.turn import ContextFull, take_turn
from tidal.harness.chat_format import as_messages
from tidal.harness.config import HarnessConfig
from tidal.harness.episode import EpisodeResult, check_integrity
from tidal.harness.seeds import derive_seed
from tidal.chat.tool_calls import ToolUse, template_messages


class ToolEpisode:
    """Runs one tool-speaking environment on one task (see the module docstring)."""

    def __init__(self, env: Environment, tools: list[dict], client, tokenizer, cfg: HarnessConfig,
                 window: int, max_turn_tokens: int, no_experts=None, index: int = 0,
                 seed: int | None = None):
        self.env, self.client, self.cfg = env, client, cfg
        self.window, self.max_turn_tokens, self.index, self.seed = window, max_turn_tokens, index, seed
        self.use = ToolUse.of(tools)
        self.renderer = Renderer(tokenizer)
        r = self.renderer
        self.history = History(r.render, r.encode, r.ends_turn, r.end_of_turn_text, no_experts)
        self.result = EpisodeResult([], 0.0, "", {}, window=window)

    async def run(self, task: Any) -> EpisodeResult:
        try:
            messages = list(as_messages(await self.env.reset(task)))
            final = await self._loop(messages)
            self.result.integrity = await run_blocking(check_integrity, self.env)
        finally:
            await self.env.close()
        r, history = self.result, self.history
        history.fill(r)
        r.reward += final.reward
        r.info.update(final.info)
        r.reason = str(final.info.get("reason", "done"))
        r.info.update(tool_history_matched=history.matched,
                      tool_new_segments=history.new_segments)
        return r

    async def _loop(self, messages: list[dict]) -> StepResult:
        r, cfg = self.result, self.cfg
        while True:
            if r.turns >= cfg.max_turns:
                return await self.env.end("turn_budget")
            left = cfg.max_tokens - r.model_tokens
            if left <= 0:
                return await self.env.end("token_budget")
            seed = None if self.seed is None else derive_seed(self.seed, r.turns)
            try:
                turn = await take_turn(self.client, self.renderer, self.history,
                                       template_messages(messages), self.use.tools, self.use,
                                       min(self.max_turn_tokens, left), self.window, seed,
                                       (self.index, "turn"))
            except ContextFull:
                return await self.env.end("context")
            r.turns += 1
            r.model_tokens += len(turn.result.token_ids)
            r.tool_errors += turn.reply.malformed is not None
            message = turn.reply.message
            messages.append(message)
            try:
                step = await asyncio.wait_for(self.env.step(message), cfg.step_timeout_s)
            except TimeoutError:
                return StepResult("", 0.0, True, {"reason": "step_timeout"})
            r.reward += step.reward
            if step.done:
                return StepResult("", 0.0, True, step.info)
            r.info.update(step.info)
            messages.extend(as_messages(step.observation))
