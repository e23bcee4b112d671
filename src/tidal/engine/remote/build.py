"""A RemoteEngine for a rollout worker, from the run's config, and the folder a vllm / sglang
server reloads from."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from tidal.engine.remote.engine import RemoteEngine
from tidal.errors import UserError

RELOADED_FILES = ("config.json", "model.safetensors")
"""What ``write_version`` replaces in the server's folder (tokenizer files stay as they are)."""


def write_version(model, folder: str | Path) -> None:
    """Write ``model`` into ``folder`` (config.json + model.safetensors) with one rename per file,
    so a server reloading at any moment reads either the old file or the new one whole."""
    from tidal.model import save_pretrained

    folder = Path(folder)
    staging = folder.parent / f".{folder.name}.write-{uuid.uuid4().hex[:8]}"
    save_pretrained(model, staging)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for name in RELOADED_FILES:
            os.replace(staging / name, folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remote_engine(cfg, init_checkpoint: str, weights_address: str) -> RemoteEngine:
    """The worker's engine for engine.backend = "remote": the served model's config and
    tokenizer from ``init_checkpoint`` (no weights are loaded here), the run's weight transport
    at ``weights_address`` for the server to pull from, the staleness bound of the run."""
    from tidal.model.checkpoint import config_from_hf

    mcfg = config_from_hf(json.loads((Path(init_checkpoint) / "config.json").read_text()))
    folder = cfg.engine.remote.weights_dir
    server = None
    if cfg.engine.remote.launch:
        from tidal.engine.vllm_server import VllmServer

        if cfg.engine.remote.kind != "vllm":
            raise UserError("engine.remote.launch starts vLLM only: set engine.remote.kind = "
                            "'vllm', or start the server yourself and set launch = false")
        server = VllmServer.for_config(cfg.engine, init_checkpoint, cfg.model.dtype,
                                       cfg.run.seed).start()
    try:
        engine = _engine(cfg, init_checkpoint, weights_address, mcfg, folder)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    engine.supervisor = server
    return engine


def _engine(cfg, init_checkpoint, weights_address, mcfg, folder) -> RemoteEngine:
    from tidal.model import load_tokenizer

    return RemoteEngine(cfg.engine, load_tokenizer(init_checkpoint), mcfg, weights=weights_address,
                        transport=cfg.sync.transport, max_lag=cfg.orchestrator.max_staleness,
                        router_replay=cfg.trainer.router_replay,
                        write_folder=(lambda model, _v: write_version(model, folder)) if folder else None)
