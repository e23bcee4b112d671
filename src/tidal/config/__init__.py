"""The run configuration: one section per component, loaded from TOML with dotted CLI overrides.

    cfg = load_config("recipe.toml", ["--trainer.lr", "1e-6"])

Each component owns its section's class and defaults (tidal/<component>/config.py); the run-wide
settings (seed, thread counts) are the ``[run]`` section (config/run.py). An extension adds its
section through the ``tidal.sections`` entry points (tidal.plugins: ``[online]``). This module
only assembles them and checks the fields that span sections.
"""

from __future__ import annotations

from pydantic import Field, create_model, model_validator

from tidal.config_section import Section
from tidal.config.loader import ConfigError, load_config, parse_overrides
from tidal.config.run import RunConfig
from tidal.engine.config import EngineConfig
from tidal.harness.config import HarnessConfig
from tidal.orchestrator.topology import FleetConfig
from tidal.model.config import ModelConfig
from tidal.orchestrator.config import OrchestratorConfig
from tidal.parallel.config import ShardingConfig
from tidal.pretrain.config import PretrainConfig
from tidal.sync.config import SyncConfig
from tidal.env.config import EnvConfig
from tidal.plugins import plugins
from tidal.trainer.config import TrainerConfig


class CoreConfig(Section):
    """The core's sections; TidalConfig adds the extensions' (below)."""

    run: RunConfig = Field(default_factory=RunConfig)
    # Factories, not instances: each config resolves its "auto" dtypes when it is built.
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sharding: ShardingConfig = Field(default_factory=ShardingConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)

    @model_validator(mode="after")
    def _check_cross_section(self) -> "CoreConfig":
        if self.engine.max_seq_len > self.model.max_position_embeddings:
            raise ValueError(
                f"engine.max_seq_len ({self.engine.max_seq_len}) exceeds "
                f"model.max_position_embeddings ({self.model.max_position_embeddings})"
            )
        if self.pretrain.seq_len > self.model.max_position_embeddings:
            raise ValueError(
                f"pretrain.seq_len ({self.pretrain.seq_len}) exceeds "
                f"model.max_position_embeddings ({self.model.max_position_embeddings})"
            )
        if self.engine.numerics == "deterministic" and self.trainer.dtype != self.model.dtype:
            raise ValueError(
                f"engine.numerics = 'deterministic' needs the trainer to compute in the engine's "
                f"dtype: trainer.dtype is {_shown(self.trainer, 'dtype')} but model.dtype is "
                f"{_shown(self.model, 'dtype')}; set both to one dtype (or both to \"auto\"), "
                "or engine.numerics = 'fast'"
            )
        if self.harness.context_window > self.engine.max_seq_len:
            raise ValueError(
                f"harness.context_window ({self.harness.context_window}) exceeds "
                f"engine.max_seq_len ({self.engine.max_seq_len})"
            )
        remote = self.engine.remote
        if (self.engine.backend == "remote" and remote.kind != "tidal" and self.model.is_moe
                and self.trainer.router_replay == "required"):
            raise ValueError(
                f"trainer.router_replay = 'required' needs the experts of every token, which a "
                f"{remote.kind} server (engine.remote.kind) does not report; set "
                "trainer.router_replay = 'if_available' (or 'off'), or engine.remote.kind = 'tidal'")
        return self

    def dtype_choices(self) -> dict[str, dict[str, str]]:
        """Every dtype this config chooses, as asked and as resolved on this machine:
        ``{"model.dtype": {"requested": "auto", "resolved": "float32"}, ...}``."""
        return {
            f"{name}.{field}": {"requested": section.requested_dtype(field), "resolved": getattr(section, field)}
            for name, section in self
            for field in section.auto_dtype_fields()
        }


def _with_extensions() -> type[CoreConfig]:
    sections = plugins("tidal.sections")
    clash = sorted(set(sections) & set(CoreConfig.model_fields))
    if clash:
        raise ValueError(f"an extension's tidal.sections entry point reuses a core section: {clash}")
    fields = {name: (cls, Field(default_factory=cls)) for name, cls in sorted(sections.items())}
    return create_model("TidalConfig", __base__=CoreConfig, __module__=__name__, **fields)


TidalConfig = _with_extensions()
"""The run configuration: the core's sections and every installed extension's."""


def _shown(section: Section, field: str) -> str:
    value = getattr(section, field)
    if section.requested_dtype(field) == "auto":
        return f"{value!r} (what \"auto\" is on this machine)"
    return repr(value)


__all__ = ["ConfigError", "TidalConfig", "load_config", "parse_overrides"]
