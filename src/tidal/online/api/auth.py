"""API keys of ``tidal serve``: who may call it, and with which role.

    user    generate (completions, chat), read (models, status), and give feedback on the
            responses it received itself (another key's: 403 ``not_owner``)
    admin   all a user may, plus POST /v1/tidal/update_weights, the version registry
            (/v1/tidal/versions: list, promote, roll back) and keys (/v1/tidal/keys: issue, revoke)

Where keys come from (all of them together; ``serving_keys`` reads them for ``tidal serve``):

    online.serve.keys_file   JSON, readable by its owner only (chmod 600), e.g.
                             {"keys": [{"key": "<secret, >= 16 characters>", "role": "admin",
                                        "name": "trainer"},
                                       {"key_sha256": "<hex sha256 of a secret>", "role": "user",
                                        "name": "alice"}]}
                             (``key_sha256`` instead of ``key``: the file need not hold the secret)
    TIDAL_API_KEYS           user keys, comma-separated
    TIDAL_ADMIN_KEYS         admin keys, comma-separated
    KeyRing.issue(owner, ttl_s)   an ephemeral key (one per rollout episode, say), in memory
                             only: dead after ttl_s seconds or at ``revoke``, whichever is first

A request presents its key as ``Authorization: Bearer <key>`` (what the openai client sends as
``api_key``). The ring holds only sha256 digests and finds a key by its digest, so no comparison
ever runs over the secret itself; ``key_id`` (the digest's first 16 hex characters) names a key
in the store, in answers and in logs, where the secret never appears. ``RequireKey`` (ASGI
middleware) checks the header before the app reads a byte of the body: a 401 never waits for a
large upload. With ``tidal serve --no-auth`` there is no ring (None): allowed on a loopback
address only (``check_no_auth``).
"""

from __future__ import annotations

import contextvars
import hashlib
import ipaddress
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tidal.errors import UserError
from tidal.online.api.errors import ApiError

Role = Literal["user", "admin"]
ROLES: tuple[str, ...] = ("user", "admin")
KEYS_ENV, ADMIN_KEYS_ENV = "TIDAL_API_KEYS", "TIDAL_ADMIN_KEYS"
"""Environment variables with comma-separated user / admin keys."""
MIN_KEY_CHARS = 16
"""Shortest key accepted from a file or the environment (an issued key has 43 characters)."""
KEY_ID_CHARS = 16
"""Hex characters of sha256(key) that make its ``key_id``."""
HOW_TO_GIVE_KEYS = (
    f"give keys in {KEYS_ENV} (user keys) and/or {ADMIN_KEYS_ENV} (admin keys), comma-separated, "
    "or in a JSON file named by online.serve.keys_file (docs/online.md, \"Keys\"); a key: e.g. "
    "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")

PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("tidal_principal",
                                                                           default=None)
"""The caller of the request being handled (set by RequireKey; None without keys)."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def key_id(key: str) -> str:
    """The non-secret, stable name of ``key``: the first 16 hex characters of its sha256."""
    return digest(key)[:KEY_ID_CHARS]


@dataclass(frozen=True)
class Principal:
    """Who sent a request: its key's ``key_id``, ``role`` and ``owner`` (the keys file's name,
    the environment variable, or what ``issue`` was given)."""

    key_id: str
    role: Role
    owner: str

    def may(self, role: Role) -> bool:
        """An admin key may do all a user key may."""
        return self.role == "admin" or role == "user"


@dataclass
class _Entry:
    principal: Principal
    expires: float | None
    """On the ring's clock; None = until revoked."""
    issued: bool


class KeyRing:
    """Bearer keys by their sha256 digest. Thread-safe: the app authenticates on its event loop
    while a gateway issues and revokes from anywhere. ``clock``: seconds, for expiry (monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._clock = clock

    @classmethod
    def from_sources(cls, keys_file: str = "", env: Mapping[str, str] = os.environ) -> KeyRing:
        """The keys of ``keys_file`` ("" = none) and of TIDAL_API_KEYS / TIDAL_ADMIN_KEYS."""
        ring = cls()
        if keys_file:
            for entry in load_keys_file(keys_file):
                ring._put(entry.key_sha256 or digest(entry.key), entry.role,
                          entry.name or "keys_file", None, issued=False, source=keys_file)
        for var, role in ((KEYS_ENV, "user"), (ADMIN_KEYS_ENV, "admin")):
            for key in (k.strip() for k in env.get(var, "").split(",")):
                if key:
                    ring.add(valid_key(key, var), role, owner=var)
        return ring

    # ---------------------------------------------------------------- keys in, keys out

    def add(self, key: str, role: Role = "user", owner: str = "") -> Principal:
        """A long-lived key (until ``revoke``)."""
        return self._put(digest(key), role, owner, None, issued=False, source=owner or "add")

    def issue(self, owner: str, ttl_s: float | None, role: Role = "user") -> str:
        """A fresh random key (256 bits) for ``owner`` (e.g. a rollout episode's id), valid for
        ``ttl_s`` seconds (None: until revoked). Returns the secret; ``key_id(secret)`` names it."""
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds or None, got {ttl_s!r}")
        key = secrets.token_urlsafe(32)
        expires = None if ttl_s is None else self._clock() + ttl_s
        self._sweep()
        self._put(digest(key), role, owner, expires, issued=True, source="issue")
        return key

    def revoke(self, key: str) -> bool:
        """Forget ``key`` at once (its requests in flight finish); False if it was not held."""
        with self._lock:
            return self._entries.pop(digest(key), None) is not None

    def revoke_id(self, key_id: str) -> int:
        """Forget the key(s) named ``key_id``; how many."""
        return self._drop(lambda e: e.principal.key_id == key_id)

    def revoke_owner(self, owner: str) -> int:
        """Forget every key issued to ``owner`` (an episode that ended); how many."""
        return self._drop(lambda e: e.issued and e.principal.owner == owner)

    def _put(self, hexdigest: str, role: str, owner: str, expires: float | None, *, issued: bool,
             source: str) -> Principal:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        principal = Principal(hexdigest[:KEY_ID_CHARS], role, owner)
        with self._lock:
            if hexdigest in self._entries:
                raise UserError(f"{source}: key {principal.key_id} is given twice; each key once")
            self._entries[hexdigest] = _Entry(principal, expires, issued)
        return principal

    def _drop(self, which: Callable[[_Entry], bool]) -> int:
        with self._lock:
            gone = [d for d, e in self._entries.items() if which(e)]
            for d in gone:
                del self._entries[d]
        return len(gone)

    def _sweep(self) -> None:
        now = self._clock()
        self._drop(lambda e: e.expires is not None and e.expires <= now)

    # ---------------------------------------------------------------- checking

    def authenticate(self, authorization: str | None) -> Principal:
        """The Principal of an ``Authorization: Bearer <key>`` header value; a 401 ApiError
        (OpenAI's ``invalid_api_key``) when there is none or the key is unknown, expired or
        revoked."""
        key = bearer_key(authorization)
        if key is None:
            raise _unauthorized("no API key: send one as `Authorization: Bearer <key>` (the "
                                "openai client's api_key)")
        d = digest(key)
        with self._lock:
            entry = self._entries.get(d)
            if entry is not None and entry.expires is not None and entry.expires <= self._clock():
                del self._entries[d]
                entry = None
        if entry is None:
            raise _unauthorized("the API key is not valid here (unknown, expired or revoked)")
        return entry.principal

    def counts(self) -> dict[str, int]:
        """Keys held per role (expired ones not yet swept included)."""
        with self._lock:
            roles = [e.principal.role for e in self._entries.values()]
        return {role: roles.count(role) for role in ROLES}

    def __len__(self) -> int:
        return len(self._entries)


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header value; None if there is none."""
    scheme, _, key = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


KEY_RULE = (f"a key must be at least {MIN_KEY_CHARS} printable ASCII characters without spaces "
            "or commas (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")


def is_valid_key(key: str) -> bool:
    return len(key) >= MIN_KEY_CHARS and all(33 <= ord(c) <= 126 and c != "," for c in key)


def valid_key(key: str, source: str) -> str:
    if not is_valid_key(key):
        raise UserError(f"{source}: {KEY_RULE}")
    return key


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


# ---------------------------------------------------------------- the keys file


class KeyEntry(BaseModel):
    """One key of a keys file: the secret (``key``) or its sha256 (``key_sha256``), its role,
    a name for people (shown as the Principal's owner)."""

    model_config = ConfigDict(extra="forbid")
    key: str | None = None
    key_sha256: str | None = Field(None, pattern="^[0-9a-f]{64}$")
    role: Role = "user"
    name: str = ""

    @model_validator(mode="after")
    def _one_secret(self) -> KeyEntry:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError('give exactly one of "key" and "key_sha256"')
        if self.key is not None and not is_valid_key(self.key):
            raise ValueError(KEY_RULE)
        return self


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[KeyEntry]


KEYS_FILE_EXAMPLE = ('{"keys": [{"key": "<at least 16 characters>", "role": "admin", "name": '
                     '"trainer"}, {"key_sha256": "<64 hex>", "role": "user", "name": "alice"}]}')


def load_keys_file(path: str | Path) -> list[KeyEntry]:
    """The entries of a keys file; a UserError naming the file and the fix if it is missing,
    readable by group or others, not JSON, or not of the documented shape."""
    path = Path(path)
    fix = f"online.serve.keys_file = {str(path)!r}"
    if not path.is_file():
        raise UserError(f"{fix}: no such file; write one like {KEYS_FILE_EXAMPLE}")
    mode = path.stat().st_mode & 0o777
    if os.name == "posix" and mode & 0o077:
        raise UserError(f"{fix}: the keys file is readable or writable by others (mode "
                        f"{mode:o}); run `chmod 600 {path}`")
    try:
        parsed = KeysFile.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as e:  # json.JSONDecodeError is a ValueError
        what = _first_problem(e)
        raise UserError(f"{fix}: {what}; the file must look like {KEYS_FILE_EXAMPLE}") from None
    return parsed.keys


def _first_problem(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "the file"
        return f"{where}: {err['msg']}"  # never the input: it may be a secret
    return f"not valid JSON ({e})"


# ---------------------------------------------------------------- tidal serve's choice


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address only this machine reaches (127.0.0.0/8, ::1, localhost).
    Other names are not resolved: a name may point anywhere."""
    if host.strip().lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_no_auth(host: str) -> None:
    """``tidal serve --no-auth``: only on a loopback address (anyone who reaches the port could
    otherwise steer the learner with feedback)."""
    if not is_loopback(host):
        raise UserError(f"--no-auth (online.serve.require_keys = false) serves without keys, which "
                        f"is allowed on a loopback address only (127.0.0.1, ::1, localhost), not "
                        f"on host {host!r}; {HOW_TO_GIVE_KEYS}")


def serving_keys(cfg, host: str, env: Mapping[str, str] = os.environ) -> KeyRing | None:
    """The KeyRing ``tidal serve`` checks requests against (``cfg``: its ServeConfig), or None
    for --no-auth on a loopback host; a UserError saying how to give keys when there are none."""
    if not cfg.require_keys:
        check_no_auth(host)
        return None
    ring = KeyRing.from_sources(cfg.keys_file, env)
    if not len(ring):
        raise UserError(f"tidal serve needs API keys and has none: {HOW_TO_GIVE_KEYS}; or, on a "
                        "loopback host only, serve without keys with --no-auth")
    return ring


# ---------------------------------------------------------------- in the app


class RequireKey:
    """ASGI middleware: every HTTP request is authenticated from its headers alone, before the
    app reads its body (a 401 never waits for an upload). The Principal goes to
    ``request.state.principal`` and ``PRINCIPAL``; with ``keys`` None (--no-auth) it is None."""

    def __init__(self, app, keys: KeyRing | None):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        principal = None
        if self.keys is not None:
            header = next((v.decode("latin-1") for k, v in scope["headers"]
                           if k == b"authorization"), None)
            try:
                principal = self.keys.authenticate(header)
            except ApiError as e:
                return await e.response()(scope, receive, send)
        scope.setdefault("state", {})["principal"] = principal
        token = PRINCIPAL.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            PRINCIPAL.reset(token)


def principal_of(request: Request) -> Principal | None:
    return getattr(request.state, "principal", None)


async def admin_only(request: Request) -> None:
    """A route dependency: 403 unless the caller's key is an admin key (runs before the body is
    read). Without keys (--no-auth on loopback) everyone may."""
    p = principal_of(request)
    if p is not None and not p.may("admin"):
        raise ApiError(403, f"{request.url.path} needs an admin key; key {p.key_id} is a "
                            f"{p.role} key", code="insufficient_permissions")


class OwnedRecorder:
    """The recorder the routes write through: stamps each ServedResponse with the key_id of the
    key that asked for it (``PRINCIPAL``), so feedback on it is taken from that key only."""

    def __init__(self, recorder):
        self.recorder = recorder

    async def record(self, rows) -> None:
        principal = PRINCIPAL.get()
        for row in rows:
            row.key_id = principal.key_id if principal is not None else None
        await self.recorder.record(rows)
