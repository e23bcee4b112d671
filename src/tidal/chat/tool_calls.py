"""OpenAI function calling: a request's tools, the messages a chat template gets, and tool calls
parsed back out of the text the model wrote.

The model calls a tool the way Hermes/Qwen-style templates teach (and tidal's plain template,
api/chat.py): one block per call, anywhere after its prose,

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 2}}
    </tool_call>

``parse_tool_calls`` reads them as vLLM's Hermes tool parser (hermes_tool_parser.py) does: the
text before the first ``<tool_call>`` is the reply's content (None when empty), each block's JSON
becomes one call with ``arguments`` re-serialised as a JSON string, and text between or after the
blocks is dropped. Stricter than vLLM: a block must be closed, name a declared tool and carry an
object ``arguments``; otherwise the whole text comes back as content (``malformed`` says why),
never an error: the client sees what the model wrote, and the server counts it (ToolStats, in
GET /v1/tidal/status).

``tool_choice``: "auto" parses calls; "none" keeps the tools in the prompt and parses nothing
(vLLM's default, without --exclude-tools-when-tool-choice-none); "required" and a named function
are not enforced while decoding (tidal does not constrain sampling): a reply without a call
(for a named function: without a call to it; calls to other tools are dropped) comes back as
content and is counted as unmet. ``parallel_tool_calls: false`` keeps the first call.

Nothing here needs the web app: a rollout gateway uses the same functions.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field, replace
from typing import Any, Collection

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
"""OpenAI's rule for a function name."""
CHOICES = ("auto", "none", "required")


class ToolRequestError(ValueError):
    """A request whose tools or tool messages cannot be served; ``param`` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments_json`` is a JSON object as text (OpenAI's shape)."""

    id: str
    name: str
    arguments_json: str

    def openai(self) -> dict:
        """The call as a message's ``tool_calls`` entry."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class ParsedReply:
    """What a reply's text says: prose (``content``) and ``calls``; when its call markup did not
    parse, ``malformed`` says why and ``content`` is the whole text. ``unmet``: tool_choice asked
    for a call ("required" or a named function) and the reply has none."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    malformed: str | None = None
    unmet: bool = False

    @property
    def message(self) -> dict:
        """The assistant message of a chat response (content null when only calls came)."""
        if not self.calls:
            return {"role": "assistant", "content": self.content or ""}
        return {"role": "assistant", "content": self.content,
                "tool_calls": [c.openai() for c in self.calls]}


def call_deltas(calls: list[ToolCall]) -> list[dict]:
    """The calls as the ``tool_calls`` deltas OpenAI streams and its client accumulates: per call
    its id, type and name (arguments ""), then its arguments, under the call's index."""
    out = []
    for k, call in enumerate(calls):
        out += [{"index": k, "id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": ""}},
                {"index": k, "function": {"arguments": call.arguments_json}}]
    return out


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def _call(body: str, names: Collection[str]) -> ToolCall | str:
    """One block's JSON as a call, or why it is not one."""
    try:
        value = json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, NaN, or nested too deeply
        return f"a tool call is not valid JSON ({getattr(e, 'msg', None) or e})"
    if not isinstance(value, dict):
        return 'a tool call must be a JSON object {"name": ..., "arguments": {...}}'
    name = value.get("name")
    if not isinstance(name, str) or name not in names:
        return f"a tool call names {name!r}, which is not one of the request's tools"
    arguments = value.get("arguments")
    if not isinstance(arguments, dict):
        return f"the arguments of a call to {name!r} must be a JSON object"
    return ToolCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(text: str, tool_names: Collection[str]) -> ParsedReply:
    """The content and ``<tool_call>`` blocks of ``text`` (see the module docstring)."""
    first = text.find(OPEN)
    if first < 0:
        return ParsedReply(text)
    calls, at = [], first
    while at >= 0:
        end = text.find(CLOSE, at + len(OPEN))
        if end < 0:
            return ParsedReply(text, malformed=f"a {OPEN} tag is not closed with {CLOSE}")
        call = _call(text[at + len(OPEN):end], tool_names)
        if isinstance(call, str):
            return ParsedReply(text, malformed=call)
        calls.append(call)
        at = text.find(OPEN, end + len(CLOSE))
    return ParsedReply(text[:first] or None, calls)


def check_parameters(schema: dict) -> dict:
    """``schema`` if it is a valid JSON Schema (draft 2020-12, the jsonschema package's check);
    ValueError naming the problem otherwise."""
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        raise ValueError(f"not a valid JSON Schema{f' at {where}' if where else ''}: "
                         f"{e.message}") from None
    return schema


@dataclass(frozen=True)
class ToolUse:
    """A request's function calling: the tools (as the chat template gets them), tool_choice
    ("auto", "none", "required", or the name of the function it forces) and
    parallel_tool_calls."""

    tools: list[dict]
    choice: str = "auto"
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def parses(self) -> bool:
        """Whether replies are read for calls (not with tool_choice "none")."""
        return self.choice != "none"

    @classmethod
    def of(cls, tools: list[dict] | None = None, tool_choice: str | dict | None = None,
           parallel_tool_calls: bool | None = None) -> ToolUse | None:
        """From a request's fields as OpenAI spells them (None: no tools); ToolRequestError for
        a tool_choice or parallel_tool_calls without tools, duplicate names, a tool_choice
        naming no tool."""
        if not tools:
            for name, value in (("tool_choice", tool_choice),
                                ("parallel_tool_calls", parallel_tool_calls)):
                if value is not None:
                    raise ToolRequestError(f"{name} is only allowed when tools are given", name)
            return None
        tools = [{**t, "function": {k: v for k, v in t["function"].items() if k != "strict"}}
                 for t in tools]
        names = [t["function"]["name"] for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ToolRequestError(f"tools name {twice[0]!r} more than once; function names "
                                   "must be unique", "tools")
        choice = tool_choice if tool_choice is not None else "auto"
        if isinstance(choice, dict):
            choice = choice["function"]["name"]
            if choice not in names:
                raise ToolRequestError(f"tool_choice names {choice!r}, which is not one of the "
                                       f"tools ({', '.join(names)})", "tool_choice")
        return cls(tools, choice, True if parallel_tool_calls is None else parallel_tool_calls)

    def reply(self, text: str) -> ParsedReply:
        """The reply ``text`` as content and calls, under this request's rules."""
        if not self.parses:
            return ParsedReply(text)
        parsed = parse_tool_calls(text, self.names)
        calls = parsed.calls
        if self.choice not in CHOICES:  # a named function
            calls = [c for c in calls if c.name == self.choice]
        if not self.parallel:
            calls = calls[:1]
        if self.choice != "auto" and not calls:
            return ParsedReply(text, malformed=parsed.malformed, unmet=True)
        return replace(parsed, calls=calls)


@dataclass
class ToolStats:
    """Counts of replies to requests with tools (GET /v1/tidal/status)."""

    returned: int = 0
    """Replies returned with tool calls."""
    malformed: int = 0
    """Replies whose call markup did not parse (returned as content)."""
    unmet: int = 0
    """Replies without the call tool_choice asked for (returned as content)."""

    def count(self, reply: ParsedReply) -> None:
        self.returned += bool(reply.calls)
        self.malformed += reply.malformed is not None
        self.unmet += reply.unmet

    def status(self) -> dict:
        return {"tool_calls_returned": self.returned, "tool_calls_malformed": self.malformed,
                "tool_choice_unmet": self.unmet}


def _held(text: str) -> int:
    """How many trailing characters of ``text`` could still grow into ``<tool_call>``."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            return k
    return 0


class ToolStream:
    """The content of one streamed choice while calls may come: text goes out until a
    ``<tool_call>`` could be starting (a partial tag is held back); from a tag on, everything
    waits for the end, when ``finish`` sends the content still owed (the calls follow)."""

    def __init__(self):
        self.text = ""
        self.sent = 0

    def add(self, new: str) -> str:
        """The content that can go out after ``new`` text arrived."""
        self.text += new
        at = self.text.find(OPEN)
        safe = at if at >= 0 else len(self.text) - _held(self.text)
        out = self.text[self.sent:safe]
        self.sent = max(self.sent, safe)
        return out

    def finish(self, text: str, reply: ParsedReply) -> str:
        """The rest of the content once the choice's final ``text`` is parsed into ``reply``."""
        content = (reply.content or "") if reply.calls else text
        out = content[self.sent:]
        self.sent = max(self.sent, len(content))
        return out


def _arguments(value: Any, param: str) -> dict:
    """An assistant tool call's ``arguments`` (a JSON string) as the object templates expect;
    "" and null are {} (vLLM's reading)."""
    if isinstance(value, dict):
        return value
    if value in (None, ""):
        return {}
    try:
        parsed = json.loads(value, parse_constant=_no_constants)
    except (ValueError, RecursionError, TypeError):
        raise ToolRequestError(f"{param} is not valid JSON", param) from None
    if parsed is None:
        return {}
    if not isinstance(parsed, dict):
        raise ToolRequestError(f"{param} must be a JSON object", param)
    return parsed


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content or ""


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages (dicts) as chat templates take them, as vLLM passes them: content as
    one string ("" for null), assistant ``tool_calls`` with their ``arguments`` parsed into
    objects, a tool message's ``tool_call_id`` kept. ToolRequestError for arguments that are not
    a JSON object, or a tool message answering no earlier assistant tool call."""
    out, asked = [], set()
    for i, m in enumerate(messages):
        msg = {"role": m["role"], "content": _text(m.get("content"))}
        if m.get("name"):
            msg["name"] = m["name"]
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {
                    "name": c["function"]["name"],
                    "arguments": _arguments(c["function"].get("arguments"),
                                            f"messages[{i}].tool_calls[{j}].function.arguments")}}
                for j, c in enumerate(m["tool_calls"])]
            asked.update(c["id"] for c in m["tool_calls"])
        if m["role"] == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in asked:
                raise ToolRequestError(f"messages[{i}] answers tool call {call_id!r}, which no "
                                       "earlier assistant message made",
                                       f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = call_id
        out.append(msg)
    return out
