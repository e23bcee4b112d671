"""Where rollout workers run: threads in this process (tests, debugging) or Ray actors.

Both pools have the same small interface: ``submit(worker, assignment) -> handle``,
``wait(handles, timeout) -> ready handles``, ``result(handle)`` (re-raises the worker's error) and
``replace(worker)`` (a fresh worker after a failure). The orchestrator never sees Ray directly.
"""

from __future__ import annotations

import concurrent.futures as cf
import os

from tidal.errors import UserError


class OrchestratorError(UserError, RuntimeError):
    """The orchestrator cannot run (e.g. Ray failed to start); the message says why and what to do."""


class LocalPool:
    """Workers as plain objects, one thread each. ``worker_factory(i)`` builds worker i."""

    def __init__(self, worker_factory, num_workers: int):
        self._factory = worker_factory
        self.workers = [worker_factory(i) for i in range(num_workers)]
        self._threads = cf.ThreadPoolExecutor(max_workers=num_workers)

    def submit(self, worker: int, assignment):
        return self._threads.submit(self.workers[worker].rollout, assignment)

    def wait(self, handles, timeout: float | None = None):
        done, _ = cf.wait(handles, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return list(done)

    def result(self, handle):
        return handle.result()

    def replace(self, worker: int) -> None:
        self.workers[worker] = self._factory(worker)

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


class RayPool:
    """Workers as Ray actors (one CPU each by default)."""

    def __init__(self, worker_factory_args, num_workers: int, num_cpus: int, cpus_per_worker: float):
        import ray

        from tidal.orchestrator.worker import RolloutWorker

        start_ray(num_cpus)
        self._ray = ray
        self._actor_cls = ray.remote(RolloutWorker).options(num_cpus=cpus_per_worker, max_restarts=0)
        self._args = worker_factory_args
        self.workers = [self._spawn(i) for i in range(num_workers)]

    def _spawn(self, i: int):
        cfg, init, root = self._args
        return self._actor_cls.remote(cfg, init, root, i)

    def submit(self, worker: int, assignment):
        return self.workers[worker].rollout.remote(assignment)

    def wait(self, handles, timeout: float | None = None):
        ready, _ = self._ray.wait(list(handles), num_returns=1, timeout=timeout)
        return ready

    def result(self, handle):
        return self._ray.get(handle)

    def replace(self, worker: int) -> None:
        self._ray.kill(self.workers[worker], no_restart=True)
        self.workers[worker] = self._spawn(worker)

    def close(self) -> None:
        for w in self.workers:
            self._ray.kill(w, no_restart=True)
