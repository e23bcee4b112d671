"""Where rollout workers run: threads in this process (tests, debugging), Ray actors, or remote
pools that join over the network (an extension plugs them in through ``RemotePools``: tidal.fleet).

Every pool has the same small interface, and every handle is a ``concurrent.futures.Future``
(Ray's ``ObjectRef.future()``), so one ``FleetPool`` waits on all of them at once:

    members(now) -> (joined, left)   workers that joined / left since the last call (a pool
                                     follows its capacity schedule, tidal.orchestrator.topology.capacity_at)
    submit(worker, assignment) -> Future
    replace(worker)                  a fresh worker after a failure
    late_results() -> [RolloutResult]  results of workers that had already left (remote pools)
    close()

Workers are named by fleet-wide ints (0 .. n − 1 for the default single pool, as before); a pool
that grows takes the next free ids. A worker joins once it has started (a Ray actor: placed on a
node and its model loaded), so nothing waits on a worker that may never exist. The orchestrator
never sees Ray directly: a Ray pool places its actors by device kind (resource "device:<kind>",
declared by the cluster's nodes), records each worker's node, and follows the cluster — a pool
whose resource left has no workers until it comes back (docs/fleet.md, "Ray placement").
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from tidal.errors import UserError
from tidal.orchestrator.topology import PoolConfig, capacity_at


class OrchestratorError(UserError, RuntimeError):
    """The orchestrator cannot run (e.g. Ray failed to start); the message says why and what to do."""


class RemotePools(Protocol):
    """Pools placed "remote", whose workers join over the network, behind one endpoint: how an
    extension (tidal.fleet.pools.RemoteFleet) plugs remote workers into a run."""

    def pool(self, cfg: PoolConfig, ids: Iterator[int], t0: float) -> Any:
        """A pool with the interface above for one ``[[fleet.pools]]`` entry."""

    def start(self) -> None:
        """Open the endpoint (after the first weights are published)."""

    def stop(self) -> None: ...

    def summary(self) -> dict:
        """What it adds to summary.json's ``fleet`` (refused uploads, ...)."""


RemotePoolsFactory = Callable[[Any, Path, str, str, Callable[[], int]], RemotePools]
"""``(run config, run dir, weights address, initial checkpoint, latest published version)``."""


class ElasticPool:
    """A pool whose size follows its config's capacity schedule: ``members`` spawns workers up
    to the capacity at ``now`` and retires the newest beyond it. Subclasses say how a worker is
    made, run and dropped, and — where starting takes a while (a Ray actor waiting for a node
    and loading its model) — when it has started: a worker joins only then, so nothing is
    dispatched to a worker that may never exist.

    Worker states: ``starting`` (spawned, not yet a member), ``workers`` (members). A member
    whose replacement cannot start (``_started`` says "failed") leaves."""

    def __init__(self, cfg: PoolConfig, ids: Iterator[int], t0: float):
        self.cfg, self.name, self._ids, self.t0 = cfg, cfg.name, ids, t0
        self.workers: dict[int, object] = {}
        """Member worker -> its handle."""
        self.starting: dict[int, object] = {}
        """Spawned worker that has not started yet (not a member) -> its handle."""

    def capacity(self, now: float) -> int:
        """How many workers the pool should have at ``now``: its schedule's capacity."""
        return capacity_at(self.cfg, now - self.t0)

    def members(self, now: float) -> tuple[list[int], list[int]]:
        joined, left = [], []
        for w in list(self.workers):  # a member whose replacement cannot start has left
            if self._started(w) == "failed":
                self._retire(self.workers.pop(w))
                left.append(w)
        target = self.capacity(now)
        while len(self.workers) + len(self.starting) < target and self._may_grow():
            w = next(self._ids)
            self.starting[w] = self._spawn(w)
        while len(self.workers) + len(self.starting) > target:
            if self.starting:  # the newest not yet started first: it never joined
                self._retire(self.starting.pop(max(self.starting)))
            else:
                w = max(self.workers)
                self._retire(self.workers.pop(w))
                left.append(w)
        for w in list(self.starting):
            state = self._started(w)
            if state == "started":
                self.workers[w] = self.starting.pop(w)
                joined.append(w)
            elif state == "failed":
                self._retire(self.starting.pop(w))
        return joined, left

    def replace(self, worker: int) -> None:
        if worker in self.workers:
            self._retire(self.workers[worker])
            self.workers[worker] = self._spawn(worker)

    def late_results(self) -> list:
        return []

    def _spawn(self, worker: int):
        raise NotImplementedError

    def _started(self, worker: int) -> str:
        """"started", "starting" or "failed" (it will not start: drop it). Default: at once."""
        return "started"

    def _may_grow(self) -> bool:
        """Whether to spawn workers now (False while the pool cannot place any)."""
        return True

    def _retire(self, handle) -> None:
        pass


class LocalPool(ElasticPool):
    """Workers as plain objects, run in threads. ``worker_factory(i)`` builds worker i. A retired
    worker finishes what it runs (threads cannot be killed); its result still counts if it is
    the first back for that assignment."""

    def __init__(self, worker_factory: Callable[[int], object], cfg: PoolConfig, ids: Iterator[int],
                 t0: float = 0.0):
        super().__init__(cfg, ids, t0)
        self._factory = worker_factory
        self._threads = cf.ThreadPoolExecutor(max_workers=64, thread_name_prefix=f"pool-{cfg.name}")

    def _spawn(self, worker: int):
        return self._factory(worker)

    def submit(self, worker: int, assignment) -> cf.Future:
        return self._threads.submit(self.workers[worker].rollout, assignment)

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)


class FleetPool:
    """Several pools behind the one interface; routes each worker's calls to the pool it is in."""

    def __init__(self, pools: list):
        self.pools = pools
        self.owner: dict[int, object] = {}
        """worker -> its pool, for every member."""
        self.pool_of: dict[int, str] = {}
        """worker -> its pool's name, for every worker ever seen (records name it)."""

    def members(self, now: float | None = None) -> tuple[list[int], list[int]]:
        now = time.time() if now is None else now
        joined, left = [], []
        for pool in self.pools:
            j, lft = pool.members(now)
            for w in j:
                self.owner[w], self.pool_of[w] = pool, pool.name
            for w in lft:
                self.owner.pop(w, None)
            joined += j
            left += lft
        return joined, left

    def submit(self, worker: int, assignment) -> cf.Future:
        return self.owner[worker].submit(worker, assignment)

    def wait(self, handles, timeout: float | None = None) -> list:
        done, _ = cf.wait(list(handles), timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return list(done)

    def result(self, handle):
        return handle.result()

    def replace(self, worker: int) -> None:
        if worker in self.owner:
            self.owner[worker].replace(worker)

    def late_results(self) -> list:
        return [r for pool in self.pools for r in pool.late_results()]

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def worker_ids() -> Iterator[int]:
    """The fleet-wide worker ids, shared by every pool of one run."""
    return itertools.count()
