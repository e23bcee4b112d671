"""Token-exact trajectories from an outside harness's chat requests.

A harness sends the whole conversation with every request. Re-tokenising it would rebuild the
model's earlier replies from their text (and from the harness's re-serialised tool calls), which
on a BPE tokenizer gives other ids than the engine sampled, so the trainer would train on tokens
the policy never produced (the "retokenization drift" peers report). Instead each request is
matched against what this episode already served:

    request messages M, tools T
    served turn t: (messages before, tools, context ids, the reply message it returned, ids sampled)
    M extends t  <=>  T == t.tools, M starts with t.messages, and the next message is t.reply
    then ids = t's context + the sampled ids + the template's tokens for M's new messages

The new messages' tokens are the difference of two renderings by the chat template (the
conversation through the reply, and all of M with the generation prompt), so every token is
the template's, never a re-encoding of sampled text. A request that extends the newest context
of a segment continues that segment (``matched``); any other (the harness edited, dropped or
reordered history, changed its tools, or the template re-renders earlier turns) opens a new
segment from the full rendering (``new_segment``), as self-summarization does. Both are counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidal.harness.segments import SegmentBuilder
from tidal.chat.tool_calls import template_messages

MARK = "\x00TIDAL-REPLY\x00"
"""Stands in for an assistant reply's content when finding what a template writes after it."""


@dataclass
class ServedTurn:
    messages: list[dict[str, Any]]
    """The request's messages (as templates take them: tools.template_messages)."""
    tools: Any
    context: list[int]
    """The prompt ids the engine was given."""
    reply: dict[str, Any]
    """The assistant message returned, in the same form."""
    sampled: list[int]
    """The ids the engine sampled for it."""
    segment: int


@dataclass
class Placement:
    """Where a request's prompt goes: the prompt ids, and the segment they extend or open."""

    prompt_ids: list[int]
    segment: int
    """Index into History.segments."""
    tail: list[int]
    """Ids the template adds after the previous context (matched), or the whole prompt."""
    matched: bool


class History:
    """One episode's served turns and segments (see the module docstring). Messages come as
    templates take them (tools.template_messages: content one string, tool-call arguments
    parsed), so comparing them compares what the template renders, whatever the harness's JSON
    spacing, key order or OpenAI's echo-only fields.

    render(messages, tools, add_generation_prompt) -> text is the chat template; encode(text,
    whole) -> ids encodes template text (special tokens to their ids; ``whole``: a prompt from
    its start, with what a prompt begins with); ends_turn(ids) says whether sampled ids end
    with the end of a reply, whose text in the template is ``end_of_turn_text``."""

    def __init__(self, render, encode, ends_turn, end_of_turn_text: str, no_experts=None):
        self.render, self.encode, self.ends_turn = render, encode, ends_turn
        self.eot_text = end_of_turn_text
        self.no_experts = no_experts
        self.turns: list[ServedTurn] = []
        self.segments: list[SegmentBuilder] = []
        self.matched = 0
        self.new_segments = 0

    def place(self, messages: list[dict[str, Any]], tools: Any) -> Placement:
        """The prompt for a request (without recording it: ``record`` does, after generation)."""
        for turn in reversed(self.turns):
            tail = self._extension(turn, messages, tools)
            if tail is None:
                continue
            # the turn ends its segment's newest context (segments only grow), or the request
            # branches from an older turn: a new segment
            if len(self.segments[turn.segment]) == len(turn.context) + len(turn.sampled):
                return Placement(turn.context + turn.sampled + tail, turn.segment, tail, True)
            break
        ids = self.encode(self.render(messages, tools, True), True)
        return Placement(ids, len(self.segments), ids, False)

    def record(self, placement: Placement, messages, tools, result, reply: dict[str, Any]) -> None:
        """Add a served turn: extend its segment by the template's tail and the sampled ids, or
        open the new segment."""
        if placement.matched:
            seg = self.segments[placement.segment]
            seg.add_env(placement.tail)
            self.matched += 1
        else:
            seg = SegmentBuilder(placement.prompt_ids, self.no_experts)
            self.segments.append(seg)
            self.new_segments += 1
        seg.add_model(result, turn=True)
        self.turns.append(ServedTurn(list(messages), tools, placement.prompt_ids,
                                     template_messages([reply])[0], list(result.token_ids),
                                     placement.segment))

    def fill(self, result) -> None:
        """Give an episode's result (harness.episode.EpisodeResult) its trajectory: the segments,
        the environment's tokens in them and the first context's length."""
        result.segments = [s.to_segment() for s in self.segments]
        result.env_tokens = sum(len(s.completion_ids) - sum(s.loss_mask) for s in result.segments)
        result.head_tokens = len(result.segments[0].prompt_ids) if result.segments else 0

    def _extension(self, turn: ServedTurn, messages, tools) -> list[int] | None:
        """The template's ids after ``turn``'s sampled reply up to M's generation prompt, or None
        when M does not extend ``turn``."""
        k = len(turn.messages)
        if (tools != turn.tools or len(messages) <= k + 1 or messages[:k] != turn.messages
                or messages[k] != turn.reply):
            return None
        through = self.render(messages[: k + 1], tools, False)
        full = self.render(messages, tools, True)
        if not full.startswith(through):
            return None  # the template renders earlier turns differently once more follow
        closing = self._closing(messages[: k + 1], tools, through, turn)
        if closing is None:
            return None
        return self.encode(closing + full[len(through):], False)

    def _closing(self, through_messages, tools, through: str, turn: ServedTurn) -> str | None:
        """What the template writes after the reply's sampled part: its turn closing (e.g.
        "<|im_end|>\\n"), less the end of the reply when the model sampled it."""
        after = self._after_reply(through_messages, tools)
        if after is None or not through.endswith(after):
            return None
        if self.ends_turn(turn.sampled) and after.startswith(self.eot_text):
            return after[len(self.eot_text):]
        return after

    def _after_reply(self, through_messages, tools) -> str | None:
        """The text the template writes after an assistant message's content (a marked render)."""
        marked = through_messages[:-1] + [{"role": "assistant", "content": MARK}]
        text = self.render(marked, tools, False)
        if MARK not in text:
            return None
        return text[text.rindex(MARK) + len(MARK):]
