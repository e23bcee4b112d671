"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``.

Every client mistake becomes one ``ApiError`` with the field it is about (``param``), so a
client library shows one clear line; nothing a client sends may become a 500.
"""

from __future__ import annotations

import math

from fastapi.responses import JSONResponse
from pydantic import ValidationError


class ApiError(Exception):
    """A 4xx answer: ``status``, message, OpenAI error ``type``, the field, a short code;
    ``headers`` (e.g. Retry-After) go on the response."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code, self.headers)


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "json-or-python"}


def _is_tag(part: str) -> bool:
    """pydantic names the union member it tried (``constrained-str``, ``list[int]``,
    ``function-after[...]``, a model's class name) in the location; no field of a body is
    spelled like that."""
    return part in TYPE_TAGS or "[" in part or "-" in part or part[:1].isupper()


def _loc(loc: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content", union member tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_tag(part):
            out += f".{part}" if out else str(part)
    return out


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def from_validation(err: ValidationError) -> ApiError:
    """The first problem of a pydantic error, as a 400 naming its field."""
    errors = err.errors(include_url=False)
    # Of a union's errors, the member the client meant: the deepest (a list with a bad item),
    # then one that is not a plain type mismatch (a list that is too long).
    first = max(errors, key=lambda e: (len(_loc(e["loc"])), not e["type"].endswith("_type")))
    kind, param = first["type"], _loc(first["loc"]) or None
    if kind == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {first['msg']}", code="invalid_json")
    if kind in ("model_type", "dict_type") and not param:
        return ApiError(400, "the body must be a JSON object", code="invalid_body")
    if kind == "extra_forbidden":
        return ApiError(400, f"unknown field {param!r}: this server does not support it",
                        param=param, code="unknown_field")
    if kind == "missing":
        return ApiError(400, f"missing required field {param!r}", param=param, code="missing_field")
    value = first.get("input")
    got = "" if isinstance(value, dict) else f" (got {_shown(value)})"
    return ApiError(400, f"{param or 'body'}: {first['msg']}{got}", param=param, code="invalid_value")


def retry_header(seconds: float) -> dict:
    """Retry-After in whole seconds, rounded up (at least 1)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}
