"""The tool-call format the model writes, and its parser.

A model turn may think in free text, then calls one tool:

    I should look at the file first. <call>{"read": {"path": "a.py"}}</call>

One JSON object whose single key is the tool name and whose value is the arguments object. It is
short on purpose: a byte-level model pays for every character, and this shape has nothing to
spell twice. The turn ends at ``CALL_CLOSE`` (a stop string); the environment's answer comes back
as ``OBS_OPEN + text + OBS_CLOSE`` and is never trained on.

Parsing is strict and every failure says what was wrong (``MalformedCall.kind`` names the case
for metrics); nothing a model writes can make the parser raise anything else or loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CALL_OPEN = "<call>"
CALL_CLOSE = "</call>"
OBS_OPEN = "\n<obs>"
OBS_CLOSE = "</obs>\n"


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any]


class MalformedCall(Exception):
    """The model's call cannot be run; ``str(self)`` is the observation explaining why.

    kind: no_call | unclosed | too_long | bad_json | not_object | unknown_tool | bad_args |
    tool_error | timeout.
    """

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def format_call(name: str, args: dict[str, Any]) -> str:
    """The canonical text of a call (for docs, traces and scripted policies)."""
    return CALL_OPEN + json.dumps({name: args}, separators=(",", ":")) + CALL_CLOSE


def parse_call(text: str, max_chars: int) -> ToolCall:
    """The last complete ``<call>...</call>`` in ``text``; raises MalformedCall otherwise.

    max_chars bounds the JSON between the tags (oversized arguments are refused before any JSON
    parsing, so a huge call costs no more than its length to reject)."""
    start = text.rfind(CALL_OPEN)
    if start < 0:
        raise MalformedCall("no_call", f"no tool call found: end your turn with "
                                       f'{CALL_OPEN}{{"TOOL": {{ARGS}}}}{CALL_CLOSE}')
    body_start = start + len(CALL_OPEN)
    end = text.find(CALL_CLOSE, body_start)
    if end < 0:
        raise MalformedCall("unclosed", f"tool call not closed: write {CALL_CLOSE} after the JSON")
    body = text[body_start:end]
    if len(body) > max_chars:
        raise MalformedCall("too_long", f"tool call is {len(body)} characters; the limit is "
                                        f"{max_chars}")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, or an int over 4300 digits
        message = e.msg if isinstance(e, json.JSONDecodeError) else str(e) or "nested too deeply"
        raise MalformedCall("bad_json", f"tool call is not valid JSON: {message}") from None
    if not (isinstance(value, dict) and len(value) == 1):
        raise MalformedCall("not_object", 'a tool call is one JSON object with one key, the tool '
                                          'name: {"TOOL": {ARGS}}')
    (name, args), = value.items()
    if not isinstance(args, dict):
        raise MalformedCall("not_object", f"the arguments of {name!r} must be a JSON object, "
                                          f"got {type(args).__name__}")
    return ToolCall(name, args)
