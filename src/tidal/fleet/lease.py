"""Leases: how a worker is a member of the fleet. A worker joins by being granted a lease (a
deadline ``lease_s`` ahead), stays by renewing it (a heartbeat), and leaves by releasing it or by
letting it expire. Whatever an expired lease held is queued again (the scheduler's
``remove_worker``).

Pure state with the clock passed in (``now``), so the orchestrator and the simulator run the same
code, one on time.time(), the other on a simulated clock.
"""

from __future__ import annotations

import itertools
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from tidal.errors import UserError

FORGET_AFTER = 10_000
"""Ended leases remembered (so a late heartbeat is told "expired", not "unknown")."""


class LeaseError(UserError):
    """A worker presented a lease that is not live; ``reason`` says why ("unknown", "expired",
    "released", "revoked")."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Lease:
    lease_id: str
    pool: str
    worker: str
    """The worker's fleet-wide name, "<pool>/<n>"."""
    secret: str
    """Shared with the worker at grant: it signs the worker's uploads (tidal.fleet.auth)."""
    granted_at: float
    deadline: float


class LeaseTable:
    def __init__(self, lease_s: float):
        self.lease_s = lease_s
        self.live: dict[str, Lease] = {}
        """lease id -> live lease."""
        self.ended: OrderedDict[str, str] = OrderedDict()
        """lease id -> why it ended ("expired" / "released"), the newest FORGET_AFTER."""
        self._counter = itertools.count()

    def grant(self, pool: str, now: float, worker: str | None = None, secret: str | None = None) -> Lease:
        """A new lease for a worker of ``pool`` (named "<pool>/<n>" unless ``worker`` is given)."""
        n = next(self._counter)
        lease = Lease(f"L{n}-{secrets.token_hex(6)}", pool, worker or f"{pool}/{n}",
                      secret or secrets.token_hex(32), now, now + self.lease_s)
        self.live[lease.lease_id] = lease
        return lease

    def check(self, lease_id: str, now: float) -> Lease:
        """The live lease ``lease_id``, or a LeaseError saying why it is not."""
        lease = self.live.get(lease_id)
        if lease is not None and now > lease.deadline:
            self._end(lease_id, "expired")
            lease = None
        if lease is None:
            why = self.ended.get(lease_id, "unknown")
            raise LeaseError(f"lease {lease_id!r} is {why}: join again to get a new lease", why)
        return lease

    def renew(self, lease_id: str, now: float) -> Lease:
        """The heartbeat: the deadline moves to ``now + lease_s``."""
        lease = self.check(lease_id, now)
        lease.deadline = now + self.lease_s
        return lease

    def release(self, lease_id: str, now: float) -> Lease:
        """The worker leaves on purpose."""
        lease = self.check(lease_id, now)
        self._end(lease_id, "released")
        return lease

    def revoke(self, lease_id: str, why: str = "revoked") -> None:
        """End a lease whose worker sent what it must not (a tampered or failing batch): its
        worker has left, and a heartbeat is told ``why``."""
        self._end(lease_id, why)

    def expire(self, now: float) -> list[Lease]:
        """End and return every lease whose deadline has passed."""
        gone = [lease for lease in self.live.values() if now > lease.deadline]
        for lease in gone:
            self._end(lease.lease_id, "expired")
        return gone

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live lease (the simulator's next lease event)."""
        return min((lease.deadline for lease in self.live.values()), default=None)

    def _end(self, lease_id: str, why: str) -> None:
        self.live.pop(lease_id, None)
        self.ended[lease_id] = why
        while len(self.ended) > FORGET_AFTER:
            self.ended.popitem(last=False)
