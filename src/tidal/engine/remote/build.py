"""A RemoteEngine for a rollout worker, from the run's config, and the folder a vllm / sglang
server reloads from."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from tidal.engine.config import EngineConfig
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


@dataclass(frozen=True)
class RemoteSetup:
    """What building a remote engine reads of a run: the engine's section and the facts of the
    run it must follow."""

    engine: EngineConfig
    dtype: str
    """model.dtype: the served weights' dtype."""
    seed: int
    """run.seed: the launched server's sampling seed."""
    transport: str
    """sync.transport: how the server pulls new versions."""
    max_lag: int
    """orchestrator.max_staleness: how many versions behind the server may serve."""
    router_replay: str
    """trainer.router_replay: whether experts must be reported."""

    @classmethod
    def of(cls, cfg) -> RemoteSetup:
        """The view of a run config."""
        return cls(engine=cfg.engine, dtype=cfg.model.dtype, seed=cfg.run.seed, transport=cfg.sync.transport,
                   max_lag=cfg.orchestrator.max_staleness, router_replay=cfg.trainer.router_replay)


def key_environment(engine: EngineConfig, env=os.environ) -> dict[str, str]:
    """The remote server's key (engine.remote.api_key_env) from this process's environment, as
    ``{name: key}`` for a worker started elsewhere (a Ray actor's runtime_env); {} when the
    remote backend is off or no key is set."""
    name = engine.remote.api_key_env
    if engine.backend != "remote" or not env.get(name):
        return {}
    return {name: env[name]}


def remote_engine(setup: RemoteSetup, init_checkpoint: str, weights_address: str) -> RemoteEngine:
    """The worker's engine for engine.backend = "remote": the served model's config and
    tokenizer from ``init_checkpoint`` (no weights are loaded here), the run's weight transport
    at ``weights_address`` for the server to pull from, the staleness bound of the run."""
    from tidal.model import load_tokenizer
    from tidal.model.checkpoint import config_from_hf

    mcfg = config_from_hf(json.loads((Path(init_checkpoint) / "config.json").read_text()))
    return build_remote(setup, mcfg, load_tokenizer(init_checkpoint), weights_address,
                        init_checkpoint)


def build_remote(setup: RemoteSetup, model_config, tokenizer, weights_address: str, init_checkpoint=None,
                 first_model=None) -> RemoteEngine:
    """A RemoteEngine (and, with engine.remote.launch, the vLLM server it talks to, started on
    ``init_checkpoint`` or, without one, on ``first_model`` written to weights_dir)."""
    remote = setup.engine.remote
    server = None
    if remote.launch:
        from tidal.engine.vllm_server import VllmServer

        if remote.kind != "vllm":
            raise UserError("engine.remote.launch starts vLLM only: set engine.remote.kind = "
                            "'vllm', or start the server yourself and set launch = false")
        if init_checkpoint is None:
            write_version(first_model, remote.weights_dir)
        server = VllmServer.for_config(setup.engine, init_checkpoint or remote.weights_dir,
                                       setup.dtype, setup.seed).start()
    folder = remote.weights_dir
    try:
        engine = RemoteEngine(
            setup.engine, tokenizer, model_config, weights=weights_address,
            transport=setup.transport, max_lag=setup.max_lag, router_replay=setup.router_replay,
            write_folder=(lambda model, _v: write_version(model, folder)) if folder else None)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    engine.supervisor = server
    return engine
