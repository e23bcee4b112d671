"""One model turn of a conversation with tools, token-exact: the prompt placed by the episode's
History (history.py), the engine's reply at the run's temperature, parsed into content and tool
calls as the API parses them (api/tools). The gateway serves it over HTTP (server.py); an
environment that speaks messages and tools runs it in process (harness/tool_episode.py), so both
build the same tokens from the same messages."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidal.engine.request import GenerationRequest, GenerationResult
from tidal.harness.history import History, Placement
from tidal.chat.render import Renderer
from tidal.chat.template import cut_at_stop
from tidal.chat.tool_calls import ParsedReply, ToolUse


class TemplateRejected(ValueError):
    """The chat template could not render the messages (their author's mistake)."""


class ContextFull(ValueError):
    """The conversation's prompt leaves no room in the context window."""

    def __init__(self, prompt_tokens: int, window: int):
        super().__init__(f"the conversation is {prompt_tokens} tokens; the context window is "
                         f"{window}")
        self.prompt_tokens, self.window = prompt_tokens, window


@dataclass
class Turn:
    placement: Placement
    result: GenerationResult
    reply: ParsedReply
    finish: str
    """OpenAI's finish_reason: "tool_calls", "stop" or "length"."""
    engine_s: float
    """Seconds spent waiting on the engine."""


async def take_turn(client, renderer: Renderer, history: History, messages: list[dict], tools,
                    use: ToolUse | None, max_new: int, window: int, seed: int | None,
                    tag) -> Turn:
    """Generate the reply to ``messages`` (as templates take them: tools.template_messages) and
    record it in ``history``. ``client``: async generate(GenerationRequest)."""
    try:
        placement = history.place(messages, tools)
    except Exception as e:  # a template's raise_exception, or a template bug
        raise TemplateRejected(f"the chat template could not render these messages: {e}") from None
    room = window - len(placement.prompt_ids)
    if room <= 0:
        raise ContextFull(len(placement.prompt_ids), window)
    start = time.perf_counter()
    result = await client.generate(GenerationRequest(
        prompt_ids=placement.prompt_ids, max_new_tokens=min(max_new, room), stop=renderer.stop,
        tag=tag, seed=seed))
    engine_s = time.perf_counter() - start
    text = cut_at_stop(renderer.tok.decode(result.token_ids), renderer.stop)[0]
    reply, finish = parse_reply(text, use, result)
    history.record(placement, messages, tools, result, reply.message)
    return Turn(placement, result, reply, finish, engine_s)


def parse_reply(text: str, use: ToolUse | None, result: GenerationResult) -> tuple[ParsedReply, str]:
    """The reply (content and parsed calls) and its finish reason; call markup that does not
    parse stays content (``malformed`` says why)."""
    finish = "length" if result.finish_reason == "length" else "stop"
    if use is None:
        return ParsedReply(text), finish
    parsed = use.reply(text)
    return parsed, "tool_calls" if parsed.calls else finish
