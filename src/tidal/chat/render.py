"""Messages -> template text -> ids, for the gateway's history matching (history.py).

A checkpoint with a chat template renders through transformers' ``apply_chat_template`` (the
tokenizer's ``render_chat``), tools included, exactly as the model was trained to read it.
tidal's byte model has no template: it uses the documented plain template of ``tidal serve``
(tidal.chat.template), tools in its Hermes-style default format, where a reply ends with the
text ``<|end|>`` (a stop string) instead of a special token."""

from __future__ import annotations

from typing import Any


class Renderer:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.templated = bool(getattr(tokenizer, "has_chat_template", False))
        from tidal.chat.template import END_OF_TURN, ChatTemplate

        self.plain = ChatTemplate()
        """tidal's plain template (used without a checkpoint template)."""
        self.end_of_turn_text = tokenizer.end_of_turn_token if self.templated else END_OF_TURN
        """What ends a reply in the template's text."""
        self.stop: list[str] = [] if self.templated else [END_OF_TURN]
        """The engine's stop strings for a reply (a templated reply ends at its eos token)."""

    def ends_turn(self, ids: list[int]) -> bool:
        """Whether sampled ``ids`` end with the end of a reply (a turn cut short does not)."""
        if self.templated:
            return bool(ids) and ids[-1] == self.tok.end_of_turn_id
        return self.tok.decode(ids).endswith(self.end_of_turn_text)

    def render(self, messages: list[dict[str, Any]], tools, add_generation_prompt: bool) -> str:
        """``messages`` as templates take them (tools.template_messages) through the template."""
        if self.templated:
            return self.tok.render_chat(messages, tools, add_generation_prompt)
        return self.plain.render(messages, tools, add_generation_prompt)

    def encode(self, text: str, whole: bool) -> list[int]:
        """Template text as ids; ``whole`` (a prompt from the start): the plain template's BOS
        first (a checkpoint's template writes its own)."""
        return self.tok.encode(text, add_bos=whole and not self.templated)
