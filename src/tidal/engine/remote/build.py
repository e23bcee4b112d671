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


def key_environment(cfg, env=os.environ) -> dict[str, str]:
    """The remote server's key (engine.remote.api_key_env) from this process's environment, as
    ``{name: key}`` for a worker started elsewhere (a Ray actor's runtime_env); {} when the
    remote backend is off or no key is set."""
    name = cfg.engine.remote.api_key_env
    if cfg.engine.backend != "remote" or not env.get(name):
        return {}
    return {name: env[name]}


def remote_engine(cfg, init_checkpoint: str, weights_address: str) -> RemoteEngine:
    """The worker's engine for engine.backend = "remote": the served model's config and
    tokenizer from ``init_checkpoint`` (no weights are loaded here), the run's weight transport
    at ``weights_address`` for the server to pull from, the staleness bound of the run."""
    from tidal.model import load_tokenizer
    from tidal.model.checkpoint import config_from_hf

    mcfg = config_from_hf(json.loads((Path(init_checkpoint) / "config.json").read_text()))
    return build_remote(cfg, mcfg, load_tokenizer(init_checkpoint), weights_address,
                        init_checkpoint)


def build_remote(cfg, model_config, tokenizer, weights_address: str, init_checkpoint=None,
                 first_model=None) -> RemoteEngine:
    """A RemoteEngine (and, with engine.remote.launch, the vLLM server it talks to, started on
    ``init_checkpoint`` or, without one, on ``first_model`` written to weights_dir)."""
    remote = cfg.engine.remote
    server = None
    if remote.launch:
        from tidal.engine.vllm_server import VllmServer

        if remote.kind != "vllm":
            raise UserError("engine.remote.launch starts vLLM only: set engine.remote.kind = "
                            "'vllm', or start the server yourself and set launch = false")
        if init_checkpoint is None:
            write_version(first_model, remote.weights_dir)
        server = VllmServer.for_config(cfg.engine, init_checkpoint or remote.weights_dir,
                                       cfg.model.dtype, cfg.run.seed).start()
    folder = remote.weights_dir
    try:
        engine = RemoteEngine(
            cfg.engine, tokenizer, model_config, weights=weights_address,
            transport=cfg.sync.transport, max_lag=cfg.orchestrator.max_staleness,
            router_replay=cfg.trainer.router_replay,
            write_folder=(lambda model, _v: write_version(model, folder)) if folder else None)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    engine.supervisor = server
    return engine
