"""A remote pool: workers that join over HTTP (`tidal worker --join URL`), behind the same pool
interface as the local and Ray pools (tidal.orchestrator.pool).

    join          a lease per worker (LeaseTable) and a fleet-wide worker id
    members(now)  leases granted since the last call (joined), and leases that expired
                  (LeaseTable.expire) or were released (left); what a leaver held fails here,
                  after the loop has heard it left, so it is re-queued, not counted as a failure
    submit        the assignment goes into the worker's mailbox (its long-poll takes it); the
                  Future resolves when the verified result is uploaded
    late_results  results a lease uploaded after it had ended (a region cut off, then back):
                  the scheduler takes them if they are first, drops them as duplicates otherwise

State only, guarded by one lock: the coordinator's HTTP handlers (tidal.fleet.coordinator) call
it from their threads, the orchestrator's loop from its own.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tidal.orchestrator.topology import PoolConfig
from tidal.fleet.lease import Lease, LeaseError, LeaseTable
from tidal.orchestrator.worker import Assignment, RolloutResult

REMEMBER_ENDED = 4096
"""Ended leases whose secret and holdings are kept, so their late results can still count."""
REMEMBER_DELIVERED = 64
"""Delivered assignments remembered per lease (a re-sent result of one is a duplicate)."""


class LeaseEnded(RuntimeError):
    """What a leaver's pending Future fails with (its assignment was queued again)."""


@dataclass
class Held:
    """An assignment a lease holds: queued in its mailbox or taken by the worker."""

    assignment: Assignment
    future: cf.Future
    taken: bool = False
    delivered: bool = False


@dataclass
class Member:
    """One live (or just ended, not yet reported) lease of this pool."""

    lease: Lease
    worker: int
    mailbox: deque = field(default_factory=deque)
    held: dict[int, Held] = field(default_factory=dict)


@dataclass
class Ended:
    """An ended lease: its secret (to check a late upload's signature) and what it held."""

    worker: int
    secret: str
    why: str
    held: dict[int, Held]


class RemotePool:
    """The pool interface over leases (see the module docstring). ``on_change()`` is called
    (under no lock) whenever the set of live leases changes, so they can be persisted."""

    def __init__(self, cfg: PoolConfig, ids: Iterator[int], lease_s: float,
                 on_change: Callable[[], None] | None = None):
        self.cfg, self.name, self._ids = cfg, cfg.name, ids
        self.table = LeaseTable(lease_s)
        self.lock = threading.RLock()
        self.members_by_lease: dict[str, Member] = {}
        """lease id -> member, for every lease not yet reported as left."""
        self.by_worker: dict[int, str] = {}
        """worker id -> its lease id, for every member."""
        self.ended: OrderedDict[str, Ended] = OrderedDict()
        self.resolved: set[int] = set()
        """Assignment ids whose result this pool already delivered."""
        self._joined: list[int] = []
        self._late: list[RolloutResult] = []
        self._on_change = on_change or (lambda: None)

    # ------------------------------------------------------------------ the coordinator's side

    def grant(self, now: float, lease_id: str | None = None, secret: str | None = None) -> Member:
        """A new member (a fresh lease; or, reloading a persisted lease, that lease again)."""
        with self.lock:
            worker = next(self._ids)
            if lease_id is None:
                lease = self.table.grant(self.name, now, f"{self.name}/{worker}", secret)
            else:
                lease = Lease(lease_id, self.name, f"{self.name}/{worker}", secret, now, now + self.table.lease_s)
                self.table.live[lease_id] = lease
            m = self.members_by_lease[lease.lease_id] = Member(lease, worker)
            self.by_worker[worker] = lease.lease_id
            self._joined.append(worker)
        self._on_change()
        return m

    def live(self, lease_id: str, now: float, renew: bool = False) -> Member:
        """The member holding live lease ``lease_id`` (renewed if asked); LeaseError if none."""
        with self.lock:
            lease = self.table.renew(lease_id, now) if renew else self.table.check(lease_id, now)
            return self.members_by_lease[lease.lease_id]

    def release(self, lease_id: str, now: float) -> None:
        with self.lock:
            self.table.release(lease_id, now)
        self._on_change()

    def revoke(self, lease_id: str) -> None:
        """End the lease of a worker whose upload was refused as wrong (it failed the checks or
        the recompute): it leaves, so what it held is queued again for another worker, and a
        late upload from it is refused. Joining again gets it a new lease, and the same checks."""
        with self.lock:
            if lease_id in self.table.live:
                self.table.revoke(lease_id)
        self._on_change()

    def take(self, lease_id: str, now: float) -> Assignment | None:
        """The next assignment in the lease's mailbox (None if empty); LeaseError if not live."""
        with self.lock:
            m = self.live(lease_id, now, renew=True)
            if not m.mailbox:
                return None
            a = m.mailbox.popleft()
            m.held[a.assignment_id].taken = True
            return a

    def secret_of(self, lease_id: str, now: float) -> tuple[str, bool]:
        """(the lease's secret, whether it is live); LeaseError("unknown") when it is neither live
        nor a remembered ended lease."""
        with self.lock:
            try:
                return self.live(lease_id, now).lease.secret, True
            except LeaseError:
                m = self.members_by_lease.get(lease_id)
                if m is not None and self.table.ended.get(lease_id) != "revoked":
                    return m.lease.secret, False  # ended, not yet reported by members()
                e = self.ended.get(lease_id)
                if e is None or e.why == "revoked":
                    raise
                return e.secret, False

    def lookup(self, lease_id: str, aid: int) -> tuple[Assignment | None, bool]:
        """(assignment ``aid`` if lease ``lease_id`` was given it, live or ended, else None;
        whether its result was already delivered, by this lease or another of this pool)."""
        with self.lock:
            m = self.members_by_lease.get(lease_id)
            e = self.ended.get(lease_id)
            held = m.held if m is not None else e.held if e is not None else {}
            h = held.get(aid)
            return (None if h is None else h.assignment), aid in self.resolved

    def deliver(self, lease_id: str, result: RolloutResult) -> str:
        """A verified result of lease ``lease_id``: "duplicate" (already delivered: dropped),
        "accepted" (its Future resolves) or "late" (the lease had ended: late_results)."""
        with self.lock:
            aid = result.assignment_id
            if aid in self.resolved:
                return "duplicate"
            self.resolved.add(aid)
            m = self.members_by_lease.get(lease_id)
            _rename(result, m.worker if m is not None else self.ended[lease_id].worker)
            if m is not None and lease_id in self.table.live and aid in m.held:
                h = m.held[aid]
                h.delivered = True
                h.future.set_result(result)
                _forget_delivered(m.held)
                return "accepted"
            self._late.append(result)  # an ended lease's Future fails at members()
            return "late"

    def snapshot(self) -> list[dict]:
        """The live leases as JSON (persisted so a restarted trainer keeps them)."""
        with self.lock:
            return [{"lease_id": m.lease.lease_id, "pool": self.name, "secret": m.lease.secret}
                    for lid, m in self.members_by_lease.items() if lid in self.table.live]

    # ------------------------------------------------------------------ the pool interface

    def members(self, now: float) -> tuple[list[int], list[int]]:
        with self.lock:
            self.table.expire(now)
            joined, self._joined = self._joined, []
            gone = [lid for lid in self.members_by_lease if lid not in self.table.live]
            left = [self._end(lid) for lid in gone]
        if gone:
            self._on_change()
        return joined, left

    def _end(self, lease_id: str) -> int:
        m = self.members_by_lease.pop(lease_id)
        self.by_worker.pop(m.worker, None)
        why = self.table.ended.get(lease_id, "expired")
        self.ended[lease_id] = Ended(m.worker, m.lease.secret, why, m.held)
        while len(self.ended) > REMEMBER_ENDED:
            self.ended.popitem(last=False)
        for h in m.held.values():
            if not h.future.done():
                h.future.set_exception(LeaseEnded(f"worker {m.worker}'s lease {why}"))
        return m.worker

    def submit(self, worker: int, assignment: Assignment) -> cf.Future:
        future: cf.Future = cf.Future()
        with self.lock:
            m = self.members_by_lease[self.by_worker[worker]]
            m.held[assignment.assignment_id] = Held(assignment, future)
            m.mailbox.append(assignment)
        return future

    def replace(self, worker: int) -> None:
        """A remote worker cannot be restarted from here; its failed assignment is queued again
        and it is asked for the next one."""

    def late_results(self) -> list[RolloutResult]:
        with self.lock:
            out, self._late = self._late, []
        return out

    def close(self) -> None:
        with self.lock:
            for m in self.members_by_lease.values():
                for h in m.held.values():
                    h.future.cancel()

    def mailbox_size(self, lease_id: str) -> int:
        with self.lock:
            m = self.members_by_lease.get(lease_id)
            return len(m.mailbox) if m is not None else 0


def _rename(result: RolloutResult, worker: int) -> None:
    """The result (and its spans) as this run names the worker, whatever the worker said."""
    result.worker = worker
    for span in result.spans:
        span.worker = worker



def _forget_delivered(held: dict[int, Held]) -> None:
    """Keep only the newest REMEMBER_DELIVERED delivered assignments of one lease."""
    done = [aid for aid, h in held.items() if h.delivered]
    for aid in done[:-REMEMBER_DELIVERED]:
        del held[aid]
