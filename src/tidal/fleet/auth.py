"""Who may join the fleet and whose batches count.

Three keys, each checked in constant time:

  run token     one per run, shared by every pool and relay of the run: ``fleet_token`` reads
                TIDAL_FLEET_TOKEN or keeps a generated one in ``run_dir/fleet_token`` (mode 0600)
                so a restarted orchestrator accepts the pools that still hold it. Sent as
                ``Authorization: Bearer <token>`` (``bearer`` / ``bearer_token``); checked by
                ``check_token`` before anything else is read.
  lease secret  one per lease (``new_lease_secret``), handed to the worker when it joins; it
                signs every batch the lease uploads (``sign``: HMAC-SHA256 of the exact body
                bytes, hex, in the ``SIGNATURE_HEADER``), so a batch is bound to the lease that
                produced it and tampering with any byte is caught (``verify_signature``).
  batch id      unique per lease; a retry resends the same id. ``ReplayGuard`` remembers the
                accepted ones, so a replayed (or retried-after-success) batch is refused and
                never trained twice.

``open_batch`` runs the checks of an upload in the one safe order: signature (nothing of an
unsigned body is parsed or remembered), then the body, then the lease it names, then replay.

No key is ever part of an error message or a repr; ``redact`` and ``RedactFilter`` scrub log
lines that might carry one (a URL, a header dump).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from tidal.errors import UserError
from tidal.fleet.wire import WireBatch, decode_results

TOKEN_ENV = "TIDAL_FLEET_TOKEN"
"""The environment variable that sets the run token (else one is generated)."""
TOKEN_FILE = "fleet_token"
"""The generated token's file inside the run directory."""
MIN_TOKEN_CHARS = 16
"""Shortest token accepted from the environment (a generated one has 43 characters)."""
SIGNATURE_HEADER = "X-Tidal-Signature"
"""The HTTP header carrying a batch's signature."""

MISSING_TOKEN, WRONG_TOKEN = "missing token", "wrong token"
BAD_SIGNATURE, WRONG_LEASE, REPLAYED_BATCH = "bad signature", "wrong lease", "replayed batch"
REASONS = (MISSING_TOKEN, WRONG_TOKEN, BAD_SIGNATURE, WRONG_LEASE, REPLAYED_BATCH)
"""Every ``AuthError.reason``."""


class AuthError(UserError):
    """A request refused; ``reason`` is one of REASONS (for counting and for the reply)."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


# ------------------------------------------------------------------ the run token


def fleet_token(env: Mapping[str, str] = os.environ, run_dir: str | Path | None = None) -> str:
    """The run's token: TIDAL_FLEET_TOKEN if set; else the one kept in ``run_dir/fleet_token``,
    made (random, 256 bits) on first use; without a run_dir a fresh one this process only."""
    if TOKEN_ENV in env:
        return _valid_token(env[TOKEN_ENV], TOKEN_ENV)
    if run_dir is None:
        return secrets.token_urlsafe(32)
    path = Path(run_dir) / TOKEN_FILE
    if not path.exists():
        _create_private(path, secrets.token_urlsafe(32))
    return _read_private(path)


def _valid_token(value: str, source: str) -> str:
    token = value.strip()
    if len(token) < MIN_TOKEN_CHARS or not all(33 <= ord(c) <= 126 for c in token):
        raise UserError(f"{source}: the fleet token must be at least {MIN_TOKEN_CHARS} printable "
                        "ASCII characters without spaces (for example from "
                        "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return token


def _create_private(path: Path, token: str) -> None:
    """Write ``token`` to ``path`` readable by its owner only, unless another process made it
    first (then theirs stands: a hard link never replaces an existing file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _read_private(path: Path) -> str:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise UserError(f"{path}: the fleet token file is readable by others (mode {mode:o}); "
                        f"run `chmod 600 {path}`")
    return _valid_token(path.read_text(), str(path))


def check_token(presented: str | None, expected: str) -> None:
    """Raise AuthError("missing token" / "wrong token") unless ``presented`` is ``expected``.
    Compares digests, so neither the contents nor the length of the token leak by timing."""
    if not presented:
        raise AuthError(MISSING_TOKEN, f"send the run's fleet token as `Authorization: Bearer "
                                       f"<token>` (the orchestrator's {TOKEN_ENV})")
    if not hmac.compare_digest(_digest(presented), _digest(expected)):
        raise AuthError(WRONG_TOKEN, f"the token is not this run's; use the orchestrator's "
                                     f"{TOKEN_ENV}")


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def bearer(token: str) -> str:
    """The Authorization header value that presents ``token``."""
    return f"Bearer {token}"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value; None if there is none."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


# ------------------------------------------------------------------ lease secrets and signatures


def new_lease_secret() -> str:
    """A fresh lease secret (256 random bits, hex)."""
    return secrets.token_hex(32)


def sign(secret: str, body: bytes) -> str:
    """HMAC-SHA256 of ``body`` under ``secret``, hex: the signature of an uploaded batch."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, signature: str | None) -> None:
    """Raise AuthError("bad signature") unless ``signature`` is ``sign(secret, body)``."""
    if not signature:
        raise AuthError(BAD_SIGNATURE, f"the batch is unsigned; sign it with the lease secret "
                                       f"in {SIGNATURE_HEADER}")
    if not hmac.compare_digest(sign(secret, body).encode("ascii"),
                               signature.strip().encode("utf-8", "surrogateescape")):
        raise AuthError(BAD_SIGNATURE, "the batch was changed after signing, or signed with "
                                       "another lease's secret")


# ------------------------------------------------------------------ replay


class ReplayGuard:
    """The batch ids accepted per lease, in bounded memory.

    Exact for the newest ``per_lease`` batches of each of the ``max_leases`` most recently active
    leases (at most per_lease × max_leases ids). An older batch replayed would pass here, but its
    assignment is no longer running, so the scheduler refuses it; an expired lease's batches are
    refused by the lease table before they get here (``forget`` its ids then). Thread-safe:
    check-and-remember is one step, so two copies of one batch arriving at once are not both
    accepted.
    """

    def __init__(self, per_lease: int = 4096, max_leases: int = 1024):
        if per_lease < 1 or max_leases < 1:
            raise ValueError(f"ReplayGuard needs per_lease >= 1 and max_leases >= 1, got "
                             f"{per_lease}, {max_leases}")
        self.per_lease, self.max_leases = per_lease, max_leases
        self._leases: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, lease_id: str, batch_id: str) -> None:
        """Remember ``batch_id`` of ``lease_id``; AuthError("replayed batch") if it was already."""
        with self._lock:
            ids = self._leases.get(lease_id)
            if ids is not None and batch_id in ids:
                raise AuthError(REPLAYED_BATCH, f"batch {batch_id[:80]!r} of lease "
                                                f"{lease_id[:80]!r} was accepted before")
            if ids is None:
                ids = self._leases[lease_id] = OrderedDict()
            self._leases.move_to_end(lease_id)
            ids[batch_id] = None
            if len(ids) > self.per_lease:
                ids.popitem(last=False)
            if len(self._leases) > self.max_leases:
                self._leases.popitem(last=False)

    def seen(self, lease_id: str, batch_id: str) -> bool:
        """Whether ``batch_id`` of ``lease_id`` was accepted (a retry of a delivered batch)."""
        with self._lock:
            return batch_id in self._leases.get(lease_id, ())

    def discard(self, lease_id: str, batch_id: str) -> None:
        """Forget one accepted batch: the orchestrator could not take it for a fault of its own,
        so the worker's retry must be accepted."""
        with self._lock:
            self._leases.get(lease_id, {}).pop(batch_id, None)

    def forget(self, lease_id: str) -> None:
        """Forget a lease that ended (its batches are refused by the lease table from now on)."""
        with self._lock:
            self._leases.pop(lease_id, None)


def open_batch(body: bytes, signature: str | None, lease_id: str, secret: str,
               guard: ReplayGuard) -> WireBatch:
    """An uploaded batch of lease ``lease_id`` (the lease the request names, known to the lease
    table, with its ``secret``), checked in order: signature, body (WireError), the body names
    the same lease ("wrong lease"), not seen before ("replayed batch")."""
    verify_signature(secret, body, signature)
    batch = decode_results(body)
    if batch.lease_id != lease_id:
        raise AuthError(WRONG_LEASE, f"the batch names lease {batch.lease_id[:80]!r}, "
                                     f"uploaded as lease {lease_id[:80]!r}")
    guard.check(lease_id, batch.batch_id)
    return batch


# ------------------------------------------------------------------ logs

REDACTED = "[redacted]"


def redact(text: str, *keys: str) -> str:
    """``text`` with every occurrence of each key (the run token, a lease secret) replaced by
    "[redacted]"; empty keys are ignored."""
    for key in sorted((k for k in keys if k), key=len, reverse=True):
        text = text.replace(key, REDACTED)
    return text


class RedactFilter(logging.Filter):
    """A logging filter that redacts ``keys`` from every record's message (install it on the
    handlers of a process that holds the run token)."""

    def __init__(self, *keys: str):
        super().__init__()
        self._keys = keys

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message, *self._keys)
        if clean != message:
            record.msg, record.args = clean, None
        return True

    def __repr__(self) -> str:
        return f"RedactFilter({len(self._keys)} keys)"
