"""Messages -> template text -> ids, for the gateway's history matching (history.py).

A checkpoint with a chat template renders through transformers' ``apply_chat_template`` (the
tokenizer's ``render_chat``), tools included, exactly as the model was trained to read it.
tidal's byte model has no template: it uses the documented plain template of ``tidal serve``
(tidal.online.api.chat), tools in its Hermes-style default format, and ends a reply with its eos
token, which has no text."""

from __future__ import annotations

from typing import Any


class Renderer:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.templated = bool(getattr(tokenizer, "has_chat_template", False))
        self.end_of_turn_text = tokenizer.end_of_turn_token if self.templated else ""
        """The end-of-turn token's text in the template ("" for the plain template)."""

    def render(self, messages: list[dict[str, Any]], tools, add_generation_prompt: bool) -> str:
        if self.templated:
            return self.tok.render_chat(messages, tools, add_generation_prompt)
        from tidal.online.api.chat import ChatTemplate

        return ChatTemplate().render(messages, tools=tools,
                                     add_generation_prompt=add_generation_prompt)

    def encode(self, text: str, whole: bool) -> list[int]:
        """Template text as ids; ``whole`` (a prompt from the start): the plain template's BOS
        first (a checkpoint's template writes its own)."""
        return self.tok.encode(text, add_bos=whole and not self.templated)
