"""Rollout workers as Ray actors inside a region: the local Ray instance, or the cluster at
RAY_ADDRESS. A pool places its actors by device kind (the custom resource "device:<kind>" that
the cluster's nodes declare), records each worker's node, and follows the cluster: a pool whose
resource left has no workers until it comes back (docs/fleet.md, "Ray placement"). Behind the
pool interface of pool.py, so the orchestrator never sees Ray directly.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from collections.abc import Iterator

from tidal.orchestrator.topology import PoolConfig
from tidal.orchestrator.pool import ElasticPool, OrchestratorError


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
            # address="local": a Ray of this process's own; a plain init() would join any
            # cluster another process started on this machine, with other settings
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=False, _system_config={"automatic_object_spilling_enabled": False})
    except Exception as e:  # Ray raises many types (ConnectionError, RuntimeError, TimeoutError...)
        where = f"the cluster at RAY_ADDRESS={address}" if address else "a local Ray instance"
        raise OrchestratorError(f"Ray failed to start {where}: {type(e).__name__}: {e}. "
                                "Check RAY_ADDRESS, free memory and /tmp space, or run without Ray "
                                "with --orchestrator.backend local") from None


PROBE_S = 1.0
"""How often (seconds) a Ray pool re-reads the cluster's nodes for its resource (a replacement
re-reads at once)."""

MAX_START_FAILURES = 3
"""Ray workers of one pool that may fail to start in a row (their actor's constructor raised,
the resource still there) before the run stops with the last error."""


class RayWorker:
    """The Ray actor around one RolloutWorker. It is created empty, so ``placement`` answers as
    soon as Ray has placed it on a node (the bounded wait), and ``start`` then builds the worker
    (loads the model), which takes as long as it takes."""

    def placement(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address()}

    def start(self, cfg, init_checkpoint: str, weights_root: str, worker_id: int,
              cpus: list[int] | None) -> None:
        from tidal.orchestrator.worker import RolloutWorker

        self.worker = RolloutWorker(cfg, init_checkpoint, weights_root, worker_id, cpus=cpus)

    def rollout(self, assignment):
        return self.worker.rollout(assignment)


class RayPool(ElasticPool):
    """Workers as Ray actors, placed by the pool's device kind: "cpu" asks for
    ``cpus_per_worker`` CPUs; any other kind K for one unit of the custom Ray resource
    "device:K", which the cluster's nodes declare (``ray start --resources '{"device:h100": 8}'``
    hosts 8 such workers), and the pool's gpus_per_worker GPUs (Ray then sets each actor's
    CUDA_VISIBLE_DEVICES). A pool asking for a kind no node has, or for GPUs where the nodes
    of its kind have none, is one clear error at start.

    A worker joins once Ray has placed its actor and it has loaded its model; ``node_of`` says
    where. A retired or replaced actor is killed, and what it ran fails (and is re-queued). The
    pool's capacity is its schedule's, at most the units the cluster's live nodes have: when the
    resource leaves the cluster (its nodes were removed) the capacity is 0, every worker leaves,
    and the pool grows again when a node declares it again. A worker not placed within
    ``place_timeout_s`` (the resource is listed but taken) is dropped, and the pool tries again
    after as long again. ``events`` and ``report`` record all of it."""

    def __init__(self, worker_args: tuple, cfg: PoolConfig, ids: Iterator[int], num_cpus: int,
                 cpus_per_worker: float, t0: float = 0.0, place_timeout_s: float | None = None):
        import ray

        super().__init__(cfg, ids, t0)
        start_ray(num_cpus)
        self._ray = ray
        self._args = worker_args
        self.place_timeout_s = (worker_args[0].orchestrator.ray_place_timeout_s
                                if place_timeout_s is None else place_timeout_s)
        self.gpus = 0.0 if cfg.device == "cpu" else cfg.gpus_per_worker
        """GPUs each worker asks for (Ray sets its CUDA_VISIBLE_DEVICES)."""
        if cfg.device == "cpu":
            self.resource, self.ask, options = "CPU", cpus_per_worker, {"num_cpus": cpus_per_worker}
        else:
            self.resource, self.ask = f"device:{cfg.device}", 1.0
            options = {"num_cpus": 0, "num_gpus": self.gpus, "resources": {self.resource: 1}}
        from tidal.engine.remote.build import key_environment

        if keys := key_environment(worker_args[0].engine):  # a Ray cluster's workers lack our env
            options["runtime_env"] = {"env_vars": keys}
        self._actor_cls = ray.remote(RayWorker).options(max_restarts=0, **options)
        self.nodes: dict[int, dict] = {}
        """worker -> the node its (latest) actor was placed on: node_id, node_ip."""
        self.events: list[dict] = []
        """What happened to the pool: placed, lost / back (its resource left / came back to the
        cluster), unplaced, start_failed; each with at_s (seconds after t0)."""
        self._placed: dict[int, cf.Future] = {}
        self._ready: dict[int, cf.Future] = {}
        self._deadline: dict[int, float] = {}
        self._noted: set[int] = set()
        """Workers whose latest actor's placement is in ``nodes``."""
        self._up: set[int] = set()
        """Workers whose latest actor has started."""
        self._slots, self._lost, self._probed, self._hold_until, self._start_failures = 0, False, -1e18, 0.0, 0
        self._refresh(force=True)
        if self._lost:
            raise self._missing()
        self._first = True
        for _ in range(self.capacity(time.time())):  # start now: every Ray pool loads at once
            w = next(self._ids)
            self.starting[w] = self._spawn(w)

    def node_of(self, worker: int) -> dict | None:
        """The node (node_id, node_ip) worker's latest actor was placed on; None if not yet."""
        return self.nodes.get(worker)

    def report(self) -> dict:
        """For summary.json's fleet: the pool's resource, its units in the cluster, each
        worker's node and the events."""
        return {"device": self.cfg.device, "resource": self.resource, "slots": self._slots,
                "nodes": {str(w): n for w, n in sorted(self.nodes.items())}, "events": self.events}

    def members(self, now: float) -> tuple[list[int], list[int]]:
        if self._first:  # the fleet's first look: let the initial workers start (bounded)
            self._first = False
            cf.wait([self._ready[w] for w in self.starting], timeout=self.place_timeout_s)
        return super().members(now)

    def capacity(self, now: float) -> int:
        self._refresh()
        return 0 if self._lost else min(super().capacity(now), self._slots)

    def replace(self, worker: int) -> None:
        self._refresh(force=True)  # a failed actor may mean its node, and the resource, went away
        super().replace(worker)

    def submit(self, worker: int, assignment) -> cf.Future:
        return self.workers[worker].rollout.remote(assignment).future()

    def close(self) -> None:
        for actor in [*self.workers.values(), *self.starting.values()]:
            self._retire(actor)

    # ------------------------------------------------------------------ ElasticPool's hooks

    def _spawn(self, worker: int):
        cfg, init, root = self._args
        actor = self._actor_cls.remote()
        self._placed[worker] = actor.placement.remote().future()
        self._ready[worker] = actor.start.remote(cfg, init, root, worker, cfg.run.worker_cpus or None).future()
        self._deadline[worker] = time.monotonic() + self.place_timeout_s
        self._noted.discard(worker)
        self._up.discard(worker)
        return actor

    def _started(self, worker: int) -> str:
        placed, ready = self._placed[worker], self._ready[worker]
        if worker not in self._noted and placed.done() and placed.exception() is None:
            self._noted.add(worker)
            self.nodes[worker] = placed.result()
            self._event("placed", worker=worker, **self.nodes[worker])
        if ready.done():
            if ready.exception() is not None:
                return self._start_failed(worker, ready.exception())
            if worker not in self._up:
                self._up.add(worker)
                self._start_failures = 0
            return "started"
        if placed.done():
            return "starting" if placed.exception() is None else self._start_failed(worker, placed.exception())
        if time.monotonic() > self._deadline[worker]:
            self._hold_until = time.monotonic() + self.place_timeout_s
            self._event("unplaced", worker=worker,
                        reason=f"not placed within {self.place_timeout_s:g} s although the cluster "
                               f"lists {self.resource} (taken by other actors?); retrying in as long")
            return "failed"
        return "starting"

    def _may_grow(self) -> bool:
        return not self._lost and time.monotonic() >= self._hold_until

    def _retire(self, actor) -> None:
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001, S110 - an actor already gone with its node needs no kill
            pass

    # ------------------------------------------------------------------ the cluster

    def _start_failed(self, worker: int, error: BaseException) -> str:
        self._refresh(force=True)
        why = _describe(error)
        self._event("start_failed", worker=worker, error=why[:500])
        if self._lost:  # its node went away with the resource: not the worker's fault
            return "failed"
        self._start_failures += 1
        if self._start_failures >= MAX_START_FAILURES:
            raise OrchestratorError(f"fleet pool {self.name!r}: {self._start_failures} Ray workers in a row "
                                    f"failed to start; last error: {why}"[:2000])
        return "failed"

    def _event(self, event: str, **fields) -> None:
        self.events.append({"event": event, "at_s": round(time.time() - self.t0, 3), **fields})

    def _refresh(self, force: bool = False) -> None:
        """Re-read how many workers the cluster's live nodes can host (at most every PROBE_S)."""
        if not force and time.monotonic() - self._probed < PROBE_S:
            return
        self._probed = time.monotonic()
        try:
            nodes = self._ray.nodes()
        except Exception:  # noqa: BLE001 - the control store did not answer this time: keep what we knew
            return
        slots = sum(self._slots_on(n["Resources"]) for n in nodes if n.get("Alive"))
        lost = slots == 0
        if lost != self._lost:
            self._event("lost" if lost else "back", slots=slots,
                        reason=f"no live node has {self.resource}" if lost else f"{slots} slots again")
        self._lost, self._slots = lost, slots

    def _slots_on(self, resources: dict) -> int:
        """Workers of this pool one node can host: its units of the resource, and of GPUs."""
        slots = int(resources.get(self.resource, 0) / self.ask + 1e-9)
        if self.gpus:
            slots = min(slots, int(resources.get("GPU", 0) / self.gpus + 1e-9))
        return slots

    def _missing(self) -> OrchestratorError:
        """The error of a pool whose resource no node of the cluster has."""
        address = os.environ.get("RAY_ADDRESS")
        where = (f"the Ray cluster at RAY_ADDRESS={address}" if address else
                 "the local Ray this run started (it declares no device resources: set RAY_ADDRESS "
                 "to a cluster whose nodes do)")
        resources = self._ray.cluster_resources()
        have = _resources_summary(resources)
        if self.cfg.device == "cpu":
            return OrchestratorError(
                f"fleet pool {self.name!r} (device 'cpu') needs {self.ask:g} CPUs per worker on one node, "
                f"and no node of {where} has that many; the cluster has {have}. Lower "
                "orchestrator.cpus_per_worker, or give the nodes more CPUs (ray start --num-cpus N; "
                "orchestrator.ray_num_cpus for a local Ray)")
        if self.gpus and resources.get(self.resource):
            return OrchestratorError(
                f"fleet pool {self.name!r} (device {self.cfg.device!r}) asks for {self.gpus:g} GPU per worker, "
                f"and the nodes of {where} that declare {self.resource!r} have no GPU Ray can see (the "
                f"cluster has {have}). Start those nodes where the GPUs are visible (their driver, "
                "CUDA_VISIBLE_DEVICES; ray start --num-gpus N), or set the pool's gpus_per_worker = 0 "
                "for a device kind that is not a GPU")
        return OrchestratorError(
            f"fleet pool {self.name!r} asks for device kind {self.cfg.device!r}: each of its workers needs "
            f"one unit of the Ray resource {self.resource!r}, and no node of {where} declares it; the "
            f"cluster has {have}. Declare it on the nodes that have such devices, e.g. "
            f"ray start --resources '{{\"{self.resource}\": 8}}' (8 workers per node), or set the "
            "pool's device to a kind the cluster has")


def _describe(error: BaseException) -> str:
    """``Type: message`` of what a Ray actor raised (the worker's own exception, not Ray's
    wrapper with its remote traceback)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    return f"{type(error).__name__}: {error}"


def _resources_summary(resources: dict) -> str:
    """"CPU 3, device:gpu-a 2" — the cluster's CPUs, GPUs and device kinds."""
    keep = {k: v for k, v in sorted(resources.items())
            if k in ("CPU", "GPU") or k.startswith("device:")}
    kinds = [k for k in keep if k.startswith("device:")]
    text = ", ".join(f"{k} {v:g}" for k, v in keep.items()) or "no CPUs"
    return text if kinds else text + " and no device:* resources"
