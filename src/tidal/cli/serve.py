"""`tidal serve`: the policy over an OpenAI-compatible HTTP API (docs: src/tidal/online/).

    tidal serve [CONFIG.toml] --checkpoint DIR [--run-dir RUN_DIR] [--host H] [--port P]
        publish DIR as version 0 into RUN_DIR/weights (RUN_DIR: runs/serve-<timestamp>), serve it
    tidal serve [CONFIG.toml] --run-dir RUN_DIR
        serve the run's live version (RUN_DIR/weights); a `tidal train` run's newest
        checkpoint, as a serving run in RUN_DIR/serve
    keys: TIDAL_API_KEYS / TIDAL_ADMIN_KEYS, or online.serve.keys_file (tidal.online.api.auth);
        --no-auth (loopback hosts only) serves without

``build_server`` assembles the parts (the run's store and version registry, weights, policy
server, a group-committing writer, the app), ``start_learner`` the learner process beside them
(tidal.online.service: learning, gate, canary), and ``run_server`` runs them under uvicorn until
SIGTERM/SIGINT (graceful: requests in flight finish, queued writes commit).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "tidal_tokenizer.txt", "special_tokens_map.json")
"""Files of a checkpoint folder copied to RUN_DIR/tokenizer, so --run-dir finds them again."""


@dataclass
class ServerParts:
    """What ``run_server`` runs. ``store`` is both the recorder and the feedback sink;
    ``live_versions()`` returns the registry's records (live and canary) the app polls;
    ``closers`` run after the server stopped; ``keys``: the API's KeyRing (None: --no-auth),
    where a rollout gateway in this process issues and revokes its episodes' keys."""

    cfg: Any
    run_dir: Path
    app: Any
    policy: Any
    store: Any
    live_versions: Callable
    version: int
    manifest_sha256: str
    host: str
    port: int
    keys: Any = None
    closers: list[Callable] = field(default_factory=list)


def _copy_tokenizer(checkpoint: Path, run_dir: Path) -> Path:
    out = run_dir / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out / name)
    return out


def _initial_records(cfg, run_dir: Path, checkpoint: Path | None, registry) -> list:
    """The registry's live (+ canary) records: version 0 published from ``checkpoint`` and
    registered live in a new run, or what a run's registry lists."""
    from tidal.online.records import VersionRecord
    from tidal.online.version_sync import publish_checkpoint
    from tidal.sync.origin import VersionStore

    store_root = run_dir / "weights"
    latest = VersionStore(store_root).latest() if store_root.is_dir() else None
    known = registry.all()
    if checkpoint is not None:
        if not (checkpoint / "config.json").is_file():
            raise UserError(f"--checkpoint {checkpoint}: not a checkpoint folder (no config.json)")
        if latest is not None or known:
            raise UserError(f"{run_dir} already holds a serving run (versions "
                            f"{[r.version for r in known] or latest}): serve it with --run-dir "
                            "alone, or give --checkpoint a new --run-dir")
        sha = publish_checkpoint(checkpoint, store_root, 0, cfg.model.dtype, cfg.sync)
        registry.register(VersionRecord(0, None, sha, "live", time.time(), weights=str(store_root),
                                        share=1.0, gate={"verdict": "skipped",
                                                         "reason": "the initial version"},
                                        note=f"published from {checkpoint}"))
    elif not known:
        raise UserError(f"{run_dir} has no version registry (no online.db or an empty one): "
                        "start a serving run with --checkpoint DIR")
    records = registry.live_versions()
    if not any(r.status == "live" for r in records):
        raise UserError(f"the version registry of {run_dir} has no live version: promote one "
                        f"with `tidal versions promote V --run-dir {run_dir}`")
    return records


def build_server(cfg, run_dir: str | Path, checkpoint: str | Path | None = None,
                 host: str | None = None, port: int | None = None) -> ServerParts:
    """Open the run's store and registry, publish/find the weights, load the live version (and a
    canary) with their digests checked, and build the app on a group-committing writer. The API
    keys are read first (auth.serving_keys): without any, nothing else starts."""
    from tidal.model.tokenizer import load_tokenizer
    from tidal.online.api import create_app
    from tidal.online.api.auth import serving_keys
    from tidal.chat.template import ChatTemplate
    from tidal.online.serving import PolicyServer
    from tidal.online.store import GroupCommitter, OnlineStore, VersionRegistry
    from tidal.online.version_sync import VersionLoader

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    online = cfg.online
    host = host or online.serve.host
    keys = serving_keys(online.serve, host)
    store = OnlineStore.open(online.store.database_url, run_dir)
    registry = VersionRegistry(store)
    records = _initial_records(cfg, run_dir, checkpoint, registry)
    tok_dir = _copy_tokenizer(checkpoint, run_dir) if checkpoint is not None else run_dir / "tokenizer"
    loader = VersionLoader(run_dir / "weights", cfg.sync)
    policy = PolicyServer(cfg.engine, load_tokenizer(tok_dir), loader, cfg.model.dtype,
                          online.canary.share, cfg.run.seed, ChatTemplate.from_checkpoint(tok_dir))
    policy.refresh(records)
    if policy.live is None:
        loader.close()
        errors = "; ".join(e["message"] for e in policy.errors) or "unknown reason"
        raise UserError(f"no version could be served: {errors}")
    from tidal.online.update import WeightUpdater

    writer = GroupCommitter(store, online.store, online.learner.max_backlog)
    updater = WeightUpdater(policy, registry, cfg.model.dtype, cfg.sync)
    app = create_app(online, policy, writer, writer, registry.live_versions, updater, keys=keys,
                     registry=registry)
    return ServerParts(cfg, run_dir, app, policy, writer, registry.live_versions, policy.live,
                       policy.sha_of(policy.live), host, online.serve.port if port is None else port,
                       keys, [writer.close, updater.close, loader.close, store.close])


LEARNER_RESTARTS = 5
"""How often the server starts a learner process again that died, before it gives up (and keeps
serving what the registry lists)."""


def start_learner(parts: ServerParts):
    """The learner process (tidal.online.service): learns from the store's feedback when
    online.learner.enabled, and always gates candidates and watches canaries. A learner that
    dies is started again (it resumes from the store's cursor and the registry), at most
    ``LEARNER_RESTARTS`` times; its traceback is in RUN_DIR/learner.log."""
    import multiprocessing
    import sys
    import threading

    from tidal.online.service import learner_main

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    args = (parts.cfg.model_dump_json(), str(parts.run_dir), parts.cfg.online.store.database_url,
            stop)

    def spawn():
        proc = ctx.Process(target=learner_main, name="tidal-learner", daemon=True, args=args)
        proc.start()
        return proc

    state = {"proc": spawn(), "restarts": 0}

    def supervise():
        while not stop.wait(1.0):
            proc = state["proc"]
            if proc.is_alive():
                continue
            if state["restarts"] >= LEARNER_RESTARTS:
                print(f"tidal serve: the learner died {state['restarts'] + 1} times (exit code "
                      f"{proc.exitcode}); serving goes on without it. See "
                      f"{parts.run_dir / 'learner.log'}", file=sys.stderr, flush=True)
                return
            state["restarts"] += 1
            print(f"tidal serve: the learner exited with code {proc.exitcode}; starting it again "
                  f"({state['restarts']}/{LEARNER_RESTARTS}). See {parts.run_dir / 'learner.log'}",
                  file=sys.stderr, flush=True)
            state["proc"] = spawn()

    threading.Thread(target=supervise, daemon=True, name="learner-supervisor").start()

    def close():
        stop.set()
        proc = state["proc"]
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()

    parts.closers.insert(0, close)
    return state


def freeze_startup_objects() -> None:
    """Move everything built so far (torch, transformers, the models) out of the garbage
    collector's sight (``gc.freeze``), so a full collection does not walk them while requests
    wait (it shortened the feedback latency tail: docs/online.md, "Learning")."""
    import gc

    gc.collect()
    gc.freeze()


def learner_line(cfg) -> str:
    """What the learner trains with, said once: its learning rate is online.learner.lr, not
    trainer.lr (that one is `tidal train`'s), and the rest is the trainer section."""
    return (f"the online learner trains at online.learner.lr = {cfg.online.learner.lr:g} "
            f"(trainer.lr = {cfg.trainer.lr:g} is tidal train's; the rest of [trainer] applies)")


def run_server(parts: ServerParts) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's graceful shutdown), then close the parts."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else parts.port
                print(f"tidal serve: listening on http://{parts.host}:{port} (version "
                      f"{parts.version}, sha {parts.manifest_sha256}; {keys_line(parts.keys)})",
                      flush=True)
                print(f"tidal serve: {learner_line(parts.cfg)}", flush=True)

    config = uvicorn.Config(parts.app, host=parts.host, port=parts.port, log_level="warning",
                            timeout_graceful_shutdown=30)
    freeze_startup_objects()
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again under the
    # handler it found: a quiet one here, so a requested stop exits with status 0.
    quiet = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        Server(config).run()
    finally:
        for sig, handler in quiet.items():
            signal.signal(sig, handler)
        for close in parts.closers:
            close()


def keys_line(keys) -> str:
    if keys is None:
        return "NO API KEYS (--no-auth): anyone who reaches this port may call it"
    counts = keys.counts()
    return f"API keys required: {counts['user']} user, {counts['admin']} admin"


def serving_run(cfg, run_dir: Path, checkpoint: Path | None) -> tuple[Path, Path | None]:
    """Where to serve from. ``--run-dir`` of a `tidal train` run (``checkpoints/``, no store of
    its own) serves the run's newest checkpoint, as a serving run in ``RUN/serve`` (started from
    that checkpoint the first time, from its registry after); anything else as given."""
    from tidal.trainer.checkpoint import latest_checkpoint

    if checkpoint is not None or cfg.online.store.database_url or (run_dir / "online.db").exists():
        return run_dir, checkpoint
    newest = latest_checkpoint(run_dir)
    if newest is None:
        return run_dir, checkpoint
    serve_dir = run_dir / "serve"
    if (serve_dir / "online.db").exists():
        return serve_dir, None
    print(f"tidal serve: {run_dir} is a training run; serving its newest checkpoint {newest} "
          f"as a serving run in {serve_dir}", flush=True)
    return serve_dir, newest


def cmd_serve(args, rest) -> int:
    from tidal.config import load_config
    from tidal.plugins import plugin

    plugin("tidal.sections", "online", "tidal serve (its [online] section)")

    if args.checkpoint is None and args.run_dir is None:
        raise UserError("give --checkpoint DIR (serve a checkpoint) or --run-dir DIR (serve a run)")
    cfg = load_config(args.config, rest)
    if args.no_auth:
        cfg.online.serve.require_keys = False
    if cfg.run.worker_threads:
        import torch

        # The engine runs as in a rollout worker (run.worker_threads): on 2 shared cores two
        # threads made one request's tokens ~2x slower than one thread (tiny ops, idle waits).
        torch.set_num_threads(cfg.run.worker_threads)
    run_dir = Path(args.run_dir or f"runs/serve-{time.strftime('%Y%m%d-%H%M%S')}")
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    run_dir, checkpoint = serving_run(cfg, run_dir, checkpoint)
    parts = build_server(cfg, run_dir, checkpoint, args.host, args.port)
    start_learner(parts)
    run_server(parts)
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("serve", help="serve the policy over an OpenAI-compatible HTTP API")
    s.add_argument("config", nargs="?", help="TOML recipe (default: the built-in recipe)")
    s.add_argument("--checkpoint", help="Hugging Face checkpoint folder: published as version 0")
    s.add_argument("--run-dir", help="run folder (weights, store); default runs/serve-<timestamp>")
    s.add_argument("--host", help="listen address (default online.serve.host)")
    s.add_argument("--port", type=int, help="port (default online.serve.port; 0 = any free one)")
    s.add_argument("--no-auth", action="store_true",
                   help="serve without API keys (online.serve.require_keys = false); only on a "
                        "loopback host such as 127.0.0.1")
    s.set_defaults(fn=cmd_serve)
