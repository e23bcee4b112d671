"""Chat messages -> one prompt string, as the checkpoint would have it.

With a Hugging Face chat template (``chat_template`` in the checkpoint's tokenizer_config.json)
the messages are rendered the way transformers' ``apply_chat_template`` does: a sandboxed,
immutable jinja2 environment (trim_blocks, lstrip_blocks, loop controls, ``tojson``,
``raise_exception``) with ``messages``, ``bos_token``, ``eos_token`` and
``add_generation_prompt=True``. Without one, the plain template:

    <|system|>
    You are terse.
    <|user|>
    Fix f.
    <|assistant|>

(one ``<|role|>`` line before each message's content, then ``<|assistant|>`` and a newline, where
the completion begins).
"""

from __future__ import annotations

import json
from pathlib import Path

from tidal.errors import UserError

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplateError(UserError):
    """The messages cannot be rendered (the template rejected them, or it is broken)."""


def plain_prompt(messages: list[dict]) -> str:
    """The documented plain template (see the module docstring)."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def _token_text(value) -> str:
    """tokenizer_config.json names special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _pick_template(value) -> str | None:
    """A template string, or the "default" one of a list of named templates."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


class ChatTemplate:
    """Renders messages with a jinja chat template (compiled once), or the plain one."""

    def __init__(self, template: str | None = None, bos_token: str = "", eos_token: str = ""):
        self.source = template
        self.bos_token, self.eos_token = bos_token, eos_token
        self._compiled = _compile(template) if template else None

    @property
    def kind(self) -> str:
        """"hf" (the checkpoint's template) or "plain"."""
        return "hf" if self._compiled is not None else "plain"

    @classmethod
    def from_checkpoint(cls, folder: str | Path | None) -> ChatTemplate:
        """The template of a checkpoint folder's tokenizer_config.json (or chat_template.jinja),
        else the plain one."""
        if folder is None:
            return cls()
        folder = Path(folder)
        conf: dict = {}
        path = folder / "tokenizer_config.json"
        if path.is_file():
            try:
                conf = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise UserError(f"{path} is not valid JSON ({e}); fix or remove it") from None
        template = _pick_template(conf.get("chat_template"))
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        return cls(template, _token_text(conf.get("bos_token")), _token_text(conf.get("eos_token")))

    def render(self, messages: list[dict]) -> str:
        """The prompt for ``messages`` (each {"role", "content": str}), ending where the
        assistant's reply starts."""
        if self._compiled is None:
            return plain_prompt(messages)
        try:
            return self._compiled.render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except Exception as e:  # a template bug or a sandbox violation: still the client's 400
            raise ChatTemplateError(f"the chat template could not render these messages: {e}") from None


def _compile(source: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ChatTemplateError(f"the chat template rejected the messages: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise UserError(f"the checkpoint's chat template does not compile: {e}") from None
