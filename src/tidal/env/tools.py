"""Tools: typed Python functions shown to the model as JSON schemas and called with checked args.

    def read(path: str, max_lines: int = 50) -> str:
        \"\"\"Read a file of the workspace.\"\"\"

becomes a tool named ``read`` whose schema pydantic derives from the signature
(``TypeAdapter(fn).json_schema()``) and whose arguments pydantic validates (``validate_call``,
strict: a JSON string is not silently turned into an int). The docstring's first paragraph is the
description. A tool returns text (anything else is ``json.dumps``-ed) and raises ``ToolError``
for failures the model should read about ("no such file").
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError, validate_call

from tidal.env.toolcall import MalformedCall, ToolCall

ToolStyle = Literal["json", "signature"]


class ToolError(Exception):
    """Raised by a tool: the message is shown to the model as the call's observation."""


_BLOCKING = ThreadPoolExecutor(max_workers=32, thread_name_prefix="tidal-env")
"""Threads for blocking environment work (tools, grading). Not asyncio's default executor:
``asyncio.run`` waits for that one's threads at exit, so one tool stuck forever (abandoned after
its timeout) would hang the whole rollout; threads here are left behind instead."""


async def run_blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a thread, awaited without blocking the other episodes."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_BLOCKING, functools.partial(fn, *args, **kwargs))


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    """JSON schema of the arguments object (titles removed: they repeat the names)."""
    call: Callable[..., Any]
    """The function wrapped by pydantic's validate_call (raises ValidationError on bad args)."""
    is_async: bool

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> "Tool":
        name = fn.__name__
        doc = inspect.getdoc(fn)
        if not doc:
            raise TypeError(f"tool {name!r} needs a docstring: it is the description the model sees")
        schema, validated = _typed(fn)
        return cls(name, doc.split("\n\n")[0].replace("\n", " "), schema, validated,
                   inspect.iscoroutinefunction(fn))

    def call_form(self) -> str:
        """``read(path: string, max_lines?: integer)``: the name and typed parameters."""
        props = self.schema.get("properties", {})
        required = set(self.schema.get("required", []))
        params = ", ".join(f"{p}{'' if p in required else '?'}: {_type_name(s)}"
                           for p, s in props.items())
        return f"{self.name}({params})"

    def signature(self) -> str:
        """``read(path: string, max_lines?: integer) - Read a file.`` (compact listing)."""
        return f"{self.call_form()} - {self.description}"

    def json_line(self) -> str:
        return json.dumps({"name": self.name, "description": self.description,
                           "parameters": self.schema}, separators=(",", ":"))


class ToolSet:
    """The tools of one episode, by name."""

    def __init__(self, functions: list[Callable[..., Any]]):
        self.tools: dict[str, Tool] = {}
        for fn in functions:
            tool = Tool.from_function(fn)
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool

    def render(self, style: ToolStyle) -> str:
        """The listing shown to the model, one tool per line."""
        if style == "json":
            return "\n".join(t.json_line() for t in self.tools.values())
        return "\n".join(t.signature() for t in self.tools.values())

    async def run(self, call: ToolCall, timeout_s: float) -> str:
        """Run a parsed call; every mistake of the model becomes a MalformedCall."""
        tool = self.tools.get(call.name)
        if tool is None:
            raise MalformedCall("unknown_tool", f"unknown tool {call.name!r}; the tools are "
                                                f"{', '.join(self.tools)}")
        try:
            if tool.is_async:
                out = await asyncio.wait_for(tool.call(**call.args), timeout_s)
            else:
                # Tools may block (sandbox runs); a thread keeps the other episodes going.
                out = await asyncio.wait_for(run_blocking(tool.call, **call.args), timeout_s)
        except ValidationError as e:
            raise MalformedCall("bad_args", f"bad arguments for {call.name}: "
                                            f"{_explain(e)}") from None
        except ToolError as e:
            raise MalformedCall("tool_error", f"{call.name} failed: {e}") from None
        except TimeoutError:
            raise MalformedCall("timeout", f"{call.name} took longer than {timeout_s:g} s "
                                           "and was abandoned") from None
        return out if isinstance(out, str) else json.dumps(out)


_TYPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _typed(fn: Callable[..., Any]) -> tuple[dict[str, Any], Callable[..., Any]]:
    """The tool's argument schema and its validating wrapper, built once per function (for a
    method: once per class, then bound to the instance). Tools are made for every episode, and
    pydantic's schema generation costs ~1.7 ms a tool: most of a scripted episode's time."""
    func = getattr(fn, "__func__", fn)
    if func not in _TYPED:
        validated = validate_call(func, config=ConfigDict(strict=True, arbitrary_types_allowed=True))
        _TYPED[func] = (_drop_titles(TypeAdapter(fn).json_schema()), validated)
    schema, validated = _TYPED[func]
    bound = getattr(fn, "__self__", None)
    return schema, validated if bound is None else functools.partial(validated, bound)


def _explain(err: ValidationError) -> str:
    """One line per problem: ``path: Input should be a valid string``."""
    parts = []
    for e in err.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def _drop_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        # A schema's "title" is a string; a *property* named title maps to a dict and stays.
        return {k: _drop_titles(v) for k, v in schema.items()
                if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_drop_titles(v) for v in schema]
    return schema


def _type_name(prop: dict[str, Any]) -> str:
    if "type" in prop:
        item = prop.get("items")
        return f"{prop['type']}[{_type_name(item)}]" if prop["type"] == "array" and item else prop["type"]
    if "anyOf" in prop:
        return "|".join(_type_name(p) for p in prop["anyOf"])
    if "enum" in prop:
        return "|".join(json.dumps(v) for v in prop["enum"])
    return "any"
