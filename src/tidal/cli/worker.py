"""`tidal worker --join URL`: start a pool of rollout workers anywhere (another machine, a
container, another Ray cluster) with nothing shared with the trainer but HTTP (tidal.fleet.join).

    tidal worker --join URL [--pool NAME] [--workers N] [--token T | env TIDAL_FLEET_TOKEN] [--relay URL]

URL: what the trainer wrote to RUN_DIR/fleet_url. SIGTERM or Ctrl-C leaves cleanly (the leases
are released, so the orchestrator re-queues what they held at once).
"""

from __future__ import annotations

import os
import signal
import threading


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
    run_workers(args.join, token, args.pool, args.workers, args.relay, stop)
    return 0


def add_parsers(sub) -> None:
    w = sub.add_parser("worker", help="join a run's remote pool with rollout workers over HTTP")
    w.add_argument("--join", required=True, metavar="URL", help="the coordinator (RUN_DIR/fleet_url)")
    w.add_argument("--pool", help="the remote pool to join (default: the run's only remote pool)")
    w.add_argument("--workers", type=int, help="workers in this process (default: the pool's workers)")
    w.add_argument("--token", help="the run's fleet token (default: env TIDAL_FLEET_TOKEN)")
    w.add_argument("--relay", help="a weight relay to pull from first (then the URLs the coordinator gives)")
    w.set_defaults(fn=cmd_worker)
