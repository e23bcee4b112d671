"""The admin routes (an admin key each, auth.admin_only): the version registry over HTTP, as
``tidal versions`` works it from a shell, and the ephemeral keys of the server's KeyRing.

    GET    /v1/tidal/versions                  every VersionRecord (the registry)
    POST   /v1/tidal/versions/{v}/promote      {"force": false, "note": null}: make v live
    POST   /v1/tidal/versions/{v}/rollback     {"note": null}: take v off traffic
    POST   /v1/tidal/keys                      {"owner", "ttl_s", "role"} -> {"key", "key_id", ...}
    DELETE /v1/tidal/keys/{key_id}             revoke that key now

Promote and rollback are the registry's own (VersionRegistry.promote / rollback, what the CLI
calls; its refusals are 409s with the CLI's message, an unknown version a 404); afterwards the
server reads the registry at once (PolicyServer.refresh_from) rather than at its next poll, so
the answer names what it serves now. Keys issued here live in this process's memory only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Literal

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, Field

from tidal.errors import UserError
from tidal.online.api.auth import KeyRing, admin_only, key_id
from tidal.online.api.bodies import parse, read_body
from tidal.online.api.errors import ApiError
from tidal.online.api.schemas import Body, NonEmpty

ADMIN_BODY_BYTES = 4096
"""Largest body of an admin route (they are small)."""


class PromoteRequest(Body):
    force: bool = False
    """Also a blocked, rolled-back or ungated version (``tidal versions promote --force``)."""
    note: str | None = Field(None, max_length=1024)
    """Why (kept with the version)."""


class RollbackRequest(Body):
    note: str | None = Field(None, max_length=1024)


class IssueKeyRequest(Body):
    owner: NonEmpty
    """Whom the key is for (e.g. a rollout episode's id): ``Principal.owner``."""
    ttl_s: float | None = Field(None, gt=0)
    """Seconds until it expires; null = until revoked (or the server restarts)."""
    role: Literal["user", "admin"] = "user"


async def _parse(request: Request, model: type[BaseModel]):
    """An admin body (empty = every field at its default)."""
    return parse(model, await read_body(request, ADMIN_BODY_BYTES) or b"{}")


def add_admin_routes(app: FastAPI, policy, registry, live_versions, keys: KeyRing | None) -> None:
    """The registry routes when there is a ``registry`` (tidal.online.store.VersionRegistry), the
    key routes when there is a KeyRing; nothing otherwise (404)."""
    admin = [Depends(admin_only)]
    if registry is not None:
        routes = _VersionRoutes(policy, registry, live_versions)
        app.add_api_route("/v1/tidal/versions", routes.list, methods=["GET"], dependencies=admin)
        app.add_api_route("/v1/tidal/versions/{version}/promote", routes.promote, methods=["POST"],
                          dependencies=admin)
        app.add_api_route("/v1/tidal/versions/{version}/rollback", routes.rollback,
                          methods=["POST"], dependencies=admin)
    if keys is not None:
        routes = _KeyRoutes(keys)
        app.add_api_route("/v1/tidal/keys", routes.issue, methods=["POST"], dependencies=admin)
        app.add_api_route("/v1/tidal/keys/{key_id}", routes.revoke, methods=["DELETE"],
                          dependencies=admin)


class _VersionRoutes:
    def __init__(self, policy, registry, live_versions):
        self.policy, self.registry, self.live_versions = policy, registry, live_versions

    async def list(self):
        records = await asyncio.to_thread(self.registry.all)
        return {"object": "list", "data": [asdict(r) for r in records]}

    async def promote(self, version: int, request: Request):
        req = await _parse(request, PromoteRequest)
        await self._act(version, lambda: self.registry.promote(version, force=req.force,
                                                               note=req.note))
        return await self._served(version, "promoted")

    async def rollback(self, version: int, request: Request):
        req = await _parse(request, RollbackRequest)
        await self._act(version, lambda: self.registry.rollback(version, note=req.note))
        return await self._served(version, "rolled_back")

    async def _act(self, version: int, action) -> None:
        if await asyncio.to_thread(self.registry.get, version) is None:
            raise ApiError(404, f"version {version} is not registered", param="version",
                           code="unknown_version")
        try:
            await asyncio.to_thread(action)
        except UserError as e:  # the registry refused (already live, needs force, a canary...)
            raise ApiError(409, str(e), param="version", code="version_state") from None

    async def _served(self, version: int, action: str) -> dict:
        if self.live_versions is not None:
            await asyncio.to_thread(self.policy.refresh_from, self.live_versions)
        status = self.policy.status()
        records = await asyncio.to_thread(self.registry.all)
        return {"version": version, "action": action, "serving": {"live": status["live"],
                                                                  "canary": status["canary"]},
                "versions": [asdict(r) for r in records]}


class _KeyRoutes:
    def __init__(self, keys: KeyRing):
        self.keys = keys

    async def issue(self, request: Request):
        req = await _parse(request, IssueKeyRequest)
        key = self.keys.issue(req.owner, req.ttl_s, req.role)
        expires = None if req.ttl_s is None else time.time() + req.ttl_s
        return {"key": key, "key_id": key_id(key), "owner": req.owner, "role": req.role,
                "expires_at": expires}

    async def revoke(self, key_id: str):
        if not self.keys.revoke_id(key_id):
            raise ApiError(404, f"no key {key_id!r} is held", param="key_id", code="unknown_key")
        return {"key_id": key_id, "status": "revoked"}
