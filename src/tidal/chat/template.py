"""Chat messages (and a request's tools) -> one prompt string, as the checkpoint would have it.

With a Hugging Face chat template (``chat_template`` in the checkpoint's tokenizer_config.json)
the messages are rendered the way transformers' ``apply_chat_template(messages, tools=tools,
add_generation_prompt=True, tokenize=False)`` does: a sandboxed, immutable jinja2 environment
(trim_blocks, lstrip_blocks, loop controls, ``tojson``, ``raise_exception``) with ``messages``,
``tools`` (the request's tool dicts, or None), ``bos_token``, ``eos_token`` and
``add_generation_prompt``. Messages come as vLLM hands them to templates
(api/tools.template_messages): content one string, an assistant's ``tool_calls`` with their
``arguments`` as objects, a tool message's ``tool_call_id``. Without a template, the plain one:

    <|system|>
    You are terse.<|end|>
    <|user|>
    Fix f.<|end|>
    <|assistant|>

(one ``<|role|>`` line before each message's content, ``<|end|>`` and a newline after it, then
``<|assistant|>`` and a newline, where the completion begins; a reply ends with ``<|end|>``, which
the server adds to the stop strings, so a model mid-trained on this template stops there). With
tools it uses a Hermes/Qwen-style default (tidal's byte model has no template of its own): the system turn (one is added when the messages have none) ends with

    # Tools
    Call a function by writing
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>
    Functions:
    <tools>
    {"type": "function", "function": {"name": "add", ...}}
    </tools>

(one tool's JSON a line); an assistant turn with calls is its content followed at once by one
such ``<tool_call>`` block per call (newline-separated: what api/tools.parse_tool_calls reads
back, with the same content), and a tool result is its own turn:

    <|tool|>
    <tool_response>
    4
    </tool_response><|end|>
"""

from __future__ import annotations

import json
from pathlib import Path

from tidal.errors import UserError

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplateError(UserError):
    """The messages cannot be rendered (the template rejected them, or it is broken)."""


END_OF_TURN = "<|end|>"
"""Closes every message of the plain template: the end of a reply (a stop string)."""
TOOLS_HEADER = ("# Tools\nCall a function by writing\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
                "Functions:\n<tools>\n")


def plain_tools(tools: list[dict]) -> str:
    """The plain template's tools block (the module docstring's default format)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return f"{TOOLS_HEADER}{lines}\n</tools>"


def plain_call(call: dict) -> str:
    """One tool call as the plain template writes it (and the model is to write it)."""
    fn = call.get("function", call)
    body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _plain_body(m: dict) -> str:
    if m["role"] == "tool":
        return f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
    return (m.get("content") or "") + "\n".join(plain_call(c) for c in m.get("tool_calls") or [])


def plain_prompt(messages: list[dict], tools: list[dict] | None = None,
                 add_generation_prompt: bool = True) -> str:
    """The documented plain template (see the module docstring)."""
    turns = [(m["role"], _plain_body(m)) for m in messages]
    if tools:
        if turns and turns[0][0] == "system":
            turns[0] = ("system", f"{turns[0][1]}\n\n{plain_tools(tools)}")
        else:
            turns.insert(0, ("system", plain_tools(tools)))
    text = "".join(f"<|{role}|>\n{body}{END_OF_TURN}\n" for role, body in turns)
    return text + "<|assistant|>\n" if add_generation_prompt else text


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

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               add_generation_prompt: bool = True) -> str:
        """The prompt for ``messages`` (each {"role", "content": str}, plus ``tool_calls`` /
        ``tool_call_id`` as api/tools.template_messages makes them) and the request's ``tools``
        (OpenAI's {"type": "function", "function": {...}} dicts, or None), ending where the
        assistant's reply starts (``add_generation_prompt``; else after the last message)."""
        if self._compiled is None:
            return plain_prompt(messages, tools, add_generation_prompt)
        try:
            return self._compiled.render(messages=messages, tools=tools,
                                         add_generation_prompt=add_generation_prompt,
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


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)
