"""The OpenAI-compatible HTTP API of ``tidal serve``: app.py (routes), schemas.py (request
bodies), errors.py (OpenAI error bodies), chat.py (messages -> prompt), render.py (responses),
auth.py (API keys and roles), admin.py (admin routes: the registry, ephemeral keys)."""

from tidal.online.api.app import create_app

__all__ = ["create_app"]
