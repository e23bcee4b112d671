"""`tidal worker --join URL`: start a pool of rollout workers anywhere (another machine, a
container, another Ray cluster) with nothing shared with the trainer but HTTP (tidal.fleet.join).

    tidal worker --join URL [--pool NAME] [--workers N] [--token T | env TIDAL_FLEET_TOKEN] [--relay URL]

URL: what the trainer wrote to RUN_DIR/fleet_url. SIGTERM or Ctrl-C leaves cleanly (the leases
are released, so the orchestrator re-queues what they held at once).
"""

from __future__ import annotations

import copy
import os
import signal
import threading
import time

from tidal.orchestrator.worker import RolloutWorker


def cmd_worker(args, rest) -> int:
    from tidal.config import ConfigError
    from tidal.fleet.auth import TOKEN_ENV
    from tidal.fleet.join import run_workers

    if rest:
        raise ConfigError(f"tidal worker takes no config overrides ({' '.join(rest)}): the run's "
                          "config comes from the coordinator")
    token = args.token or os.environ.get(TOKEN_ENV)
    if not token:
        raise ConfigError(f"tidal worker: give the run's fleet token with --token or {TOKEN_ENV} "
                          "(the trainer keeps it in RUN_DIR/fleet_token)")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_workers(args.join, token, remote_worker, args.pool, args.workers, args.relay, stop)
    return 0


def remote_worker(config_json: dict, weight_urls: list[str], tokenizer_dir: str, worker_id: int):
    """A rollout worker built from what the coordinator sent (tidal.fleet.join's make_worker)."""
    from tidal.config import TidalConfig

    return RemoteRolloutWorker(TidalConfig.model_validate(config_json), weight_urls, tokenizer_dir, worker_id)


class RemoteRolloutWorker(RolloutWorker):
    """A RolloutWorker without an init checkpoint: the model is the first version pulled."""

    def __init__(self, cfg, weight_urls: list[str], tokenizer_dir: str, worker_id: int):
        import torch

        from tidal.engine.engine import Engine
        from tidal.env import from_config
        from tidal.fleet.join import MultiSource
        from tidal.model import load_tokenizer
        from tidal.sandbox import Sandbox

        if cfg.run.worker_threads:
            torch.set_num_threads(cfg.run.worker_threads)
        self.cfg, self.worker_id = cfg, worker_id
        self.dtype = getattr(torch, cfg.model.dtype)
        self.store = MultiSource(weight_urls, cfg.sync)
        version = self._first_version()
        model = copy.deepcopy(self.store.load(version, self.dtype))  # the puller's arrays change later
        if cfg.engine.backend == "remote":  # an OpenAI-compatible server generates (docs/scale.md)
            from tidal.engine.remote.build import RemoteSetup, build_remote

            self.engine = build_remote(RemoteSetup.of(cfg), model.config, load_tokenizer(tokenizer_dir),
                                       weight_urls[0], first_model=model)
        else:
            self.engine = Engine(model, load_tokenizer(tokenizer_dir), cfg.engine, version=version)
        self.env = from_config(cfg.env, Sandbox(cfg.env.sandbox))
        self.in_flight_updates = cfg.orchestrator.in_flight_updates

    def _first_version(self, timeout_s: float = 300.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            v = self.store.latest_version()
            if v is not None:
                return v
            time.sleep(0.2)
        from tidal.sync.errors import SyncError

        raise SyncError(f"no weight version reachable at {self.store.puller.upstreams} in {timeout_s:.0f} s")


def add_parsers(sub) -> None:
    w = sub.add_parser("worker", help="join a run's remote pool with rollout workers over HTTP")
    w.add_argument("--join", required=True, metavar="URL", help="the coordinator (RUN_DIR/fleet_url)")
    w.add_argument("--pool", help="the remote pool to join (default: the run's only remote pool)")
    w.add_argument("--workers", type=int, help="workers in this process (default: the pool's workers)")
    w.add_argument("--token", help="the run's fleet token (default: env TIDAL_FLEET_TOKEN)")
    w.add_argument("--relay", help="a weight relay to pull from first (then the URLs the coordinator gives)")
    w.set_defaults(fn=cmd_worker)
