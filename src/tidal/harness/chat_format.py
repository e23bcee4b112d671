"""How an episode's messages become the tokens of its context: environments speak messages,
models speak tokens.

An environment's first observation (``reset``) is a user message (a string) or a list of chat
messages; its later observations (tool results, feedback) are text. The format turns them into
token ids the model was trained to read, and every token is appended exactly once: the context
only grows, and the trainer trains on exactly the ids the engine sampled (never on text
re-tokenised afterwards, which on a BPE tokenizer is not the identity).

    RawFormat       tidal's byte model, no chat template: the head is the message text after
                    BOS; an observation is ``<obs>text</obs>``; a turn ends at the environment's
                    stop strings (the documented default template of the byte tokenizer).
    TemplateFormat  a checkpoint's chat template (tokenizer_config.json), rendered as
                    transformers' ``apply_chat_template`` renders it. A model turn ends at the
                    template's end-of-turn token (the engine's eos); an observation is the
                    tokens the template puts between that token and the next assistant turn.

Observations are rendered in the ``user`` role (``OBSERVATION_ROLE``): every chat template knows
it, while many reject a ``tool`` message without a matching assistant ``tool_calls`` entry.
"""

from __future__ import annotations

from typing import Any

from tidal.env.toolcall import OBS_CLOSE, OBS_OPEN

Messages = list[dict[str, Any]]

SUMMARY_REQUEST = ("Your context is full. Summarize your progress so far: the facts you found and "
                   "what is left to do, inside <summary></summary>.")
"""A chat model's summary request (TemplateFormat.summary_request); a byte model is asked by
the opening tag alone."""

OBSERVATION_ROLE = "user"
"""The role an environment's observation is rendered in (see the module docstring)."""


def as_messages(first: str | Messages) -> Messages:
    """An environment's first observation as chat messages (a string is one user message)."""
    if isinstance(first, str):
        return [{"role": "user", "content": first}]
    if not (isinstance(first, list) and first and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in first)):
        raise TypeError("Environment.reset must return a string or a non-empty list of chat "
                        "messages ({'role': ..., 'content': ...}), got " + type(first).__name__)
    return first


class RawFormat:
    """The byte tokenizer's default template (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.end_of_turn: list[int] = []
        """Ids that close a turn the model ended by a stop string (none: the text runs on)."""
        self.frame = (tokenizer.encode(OBS_OPEN), tokenizer.encode(OBS_CLOSE))
        """(ids before, ids after) an observation's body."""

    def head(self, first: str | Messages) -> list[int]:
        """The context's fixed head: the messages' text, one after another, after BOS."""
        text = "\n".join(str(m.get("content", "")) for m in as_messages(first))
        return self.tok.encode(text, add_bos=True)

    def summary_request(self, opening: str) -> list[int]:
        """What the harness writes to ask for a summary: ``opening`` right after the turn."""
        return self.tok.encode(opening)


class TemplateFormat:
    """A chat template's rendering (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.end_of_turn = [tokenizer.end_of_turn_id]
        self.frame = self._observation_frame()
        """(ids before, ids after) an observation's body: what the template writes between the
        end-of-turn token that closed the model's turn and the message content, and from the
        content's end to the next opened assistant turn."""

    def head(self, first: str | Messages) -> list[int]:
        """The messages rendered by the template, ending with the opened assistant turn."""
        return self.tok.encode_chat(as_messages(first), add_generation_prompt=True)

    def summary_request(self, opening: str) -> list[int]:
        """A user message asking for the summary, then ``opening`` (stripped) in the assistant's
        reply, where the model goes on writing the summary."""
        before, after = self.frame
        return before + self.tok.encode(SUMMARY_REQUEST) + after + self.tok.encode(opening.strip())

    def _observation_frame(self) -> tuple[list[int], list[int]]:
        """Render a conversation with and without a marked observation after an assistant turn
        and cut the difference at the mark: the template's own frame of a message, as ids."""
        mark = "\x00OBSERVATION\x00"
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        without = self.tok.render_chat(base, add_generation_prompt=False)
        with_obs = self.tok.render_chat(base + [{"role": OBSERVATION_ROLE, "content": mark}],
                                        add_generation_prompt=True)
        if not with_obs.startswith(without):
            raise ValueError("the chat template renders earlier messages differently once a "
                             "message follows; tidal cannot append observations to it")
        delta = with_obs[len(without):]
        end = self.tok.end_of_turn_token
        closed = without.rstrip()
        if not closed.endswith(end):
            raise ValueError(f"the chat template does not end an assistant turn with its "
                             f"end-of-turn token {end!r}")
        # What follows the end-of-turn token in `without` (e.g. "\n") belongs to the frame too.
        trailing = without[len(closed):]
        before, _, after = (trailing + delta).partition(mark)
        return self.tok.encode(before), self.tok.encode(after)


def chat_format(tokenizer) -> RawFormat | TemplateFormat:
    """The format of a tokenizer: its chat template when it has one, else the raw default."""
    return TemplateFormat(tokenizer) if getattr(tokenizer, "has_chat_template", False) else RawFormat(tokenizer)
