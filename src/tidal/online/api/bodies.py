"""Request bodies: read within a size limit (413 past it), then validated by a strict pydantic
model into one OpenAI-style 400 naming the field (errors.from_validation)."""

from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel, ValidationError

from tidal.online.api.errors import ApiError, from_validation


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with a 413 past ``limit`` bytes (by Content-Length before reading, and
    by counting while reading, which stops at the first chunk past the limit)."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ApiError(400, f"Content-Length {length!r} is not a number", code="invalid_header")
        if int(length) > limit:
            raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the body is larger than this endpoint's limit of {limit} bytes",
                    code="body_too_large")


def parse(model: type[BaseModel], body: bytes):
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise from_validation(e) from None
