"""What a response did: an action, a question instead of one, nothing, or a broken tool call.

The two reward hacks seen in production (deliberately broken tool calls that drew no penalty;
clarifying questions instead of edits) and the empty answer are told apart here, once, so the
reward function, the server's records and the gate's guards all count the same thing.

    invalid_tool_call   a tool-call tag (``<call>``) whose call does not parse
    action              code (a ``return``/assignment/statement line, or a def) or a valid tool call
    empty               nothing but whitespace
    question            no action, and the text asks something (a line ending in "?")
    other               none of these (prose, a fragment)
"""

from __future__ import annotations

import re

from tidal.env.toolcall import CALL_OPEN, MalformedCall, parse_call

MAX_CALL_CHARS = 4096
CODE_LINE = re.compile(
    r"^\s*(return\b|def |class |if |for |while |import |from |raise |yield\b|pass\b|"
    r"[A-Za-z_][A-Za-z_0-9\.\[\], ]*\s*[-+*/%|&^]?=[^=])", re.M)


def classify(text: str) -> str:
    """The Behaviour (tidal.online.records) of one response's text."""
    if CALL_OPEN in text:
        try:
            parse_call(text, MAX_CALL_CHARS)
        except MalformedCall:
            return "invalid_tool_call"
        return "action"
    if not text.strip():
        return "empty"
    if CODE_LINE.search(text):
        return "action"
    if any(line.rstrip().endswith("?") for line in text.splitlines()):
        return "question"
    return "other"
