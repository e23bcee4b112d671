"""Where rollout workers run: threads in this process (tests, debugging), Ray actors, or — through
tidal.fleet — remote pools that join over HTTP.

Every pool has the same small interface, and every handle is a ``concurrent.futures.Future``
(Ray's ``ObjectRef.future()``), so one ``FleetPool`` waits on all of them at once:

    members(now) -> (joined, left)   workers that joined / left since the last call (a pool
                                     follows its capacity schedule, tidal.fleet.config.capacity_at)
    submit(worker, assignment) -> Future
    replace(worker)                  a fresh worker after a failure
    late_results() -> [RolloutResult]  results of workers that had already left (remote pools)
    close()

Workers are named by fleet-wide ints (0 .. n − 1 for the default single pool, as before); a pool
that grows takes the next free ids. The orchestrator never sees Ray directly.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import time
from collections.abc import Callable, Iterator

from tidal.errors import UserError
from tidal.fleet.config import PoolConfig, capacity_at


class OrchestratorError(UserError, RuntimeError):
    """The orchestrator cannot run (e.g. Ray failed to start); the message says why and what to do."""


class ElasticPool:
    """A pool whose size follows its config's capacity schedule: ``members`` spawns workers up
    to the capacity at ``now`` and retires the newest beyond it. Subclasses say how a worker is
    made, run and dropped."""

    def __init__(self, cfg: PoolConfig, ids: Iterator[int], t0: float):
        self.cfg, self.name, self._ids, self.t0 = cfg, cfg.name, ids, t0
        self.workers: dict[int, object] = {}

    def members(self, now: float) -> tuple[list[int], list[int]]:
        target = capacity_at(self.cfg, now - self.t0)
        joined, left = [], []
        while len(self.workers) < target:
            w = next(self._ids)
            self.workers[w] = self._spawn(w)
            joined.append(w)
        while len(self.workers) > target:
            w = max(self.workers)
            self._retire(self.workers.pop(w))
            left.append(w)
        return joined, left

    def replace(self, worker: int) -> None:
        if worker in self.workers:
            self._retire(self.workers[worker])
            self.workers[worker] = self._spawn(worker)

    def late_results(self) -> list:
        return []

    def _spawn(self, worker: int):
        raise NotImplementedError

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


def start_ray(num_cpus: int) -> None:
    """Join RAY_ADDRESS if set, else start a small local Ray (no dashboard). One clear error."""
    try:
        import ray
    except ImportError as e:
        raise OrchestratorError(f"orchestrator.backend = 'ray' needs the ray package ({e}); "
                                "install tidal's dependencies or use --orchestrator.backend local") from None
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=False, _system_config={"automatic_object_spilling_enabled": False})
    except Exception as e:  # Ray raises many types (ConnectionError, RuntimeError, TimeoutError...)
        where = f"the cluster at RAY_ADDRESS={address}" if address else "a local Ray instance"
        raise OrchestratorError(f"Ray failed to start {where}: {type(e).__name__}: {e}. "
                                "Check RAY_ADDRESS, free memory and /tmp space, or run without Ray "
                                "with --orchestrator.backend local") from None


class RayPool(ElasticPool):
    """Workers as Ray actors (``cpus_per_worker`` CPUs each); a retired or replaced actor is
    killed, and what it ran fails (and is re-queued)."""

    def __init__(self, worker_args: tuple, cfg: PoolConfig, ids: Iterator[int], num_cpus: int,
                 cpus_per_worker: float, t0: float = 0.0):
        import ray

        from tidal.orchestrator.worker import RolloutWorker

        super().__init__(cfg, ids, t0)
        start_ray(num_cpus)
        self._ray = ray
        self._actor_cls = ray.remote(RolloutWorker).options(num_cpus=cpus_per_worker, max_restarts=0)
        self._args = worker_args

    def _spawn(self, worker: int):
        cfg, init, root = self._args
        return self._actor_cls.remote(cfg, init, root, worker, cpus=cfg.run.worker_cpus or None)

    def _retire(self, actor) -> None:
        self._ray.kill(actor, no_restart=True)

    def submit(self, worker: int, assignment) -> cf.Future:
        return self.workers[worker].rollout.remote(assignment).future()

    def close(self) -> None:
        for w in self.workers.values():
            self._ray.kill(w, no_restart=True)


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
