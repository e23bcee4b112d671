"""What mid-training reads of a run's config: five sections, as a typed view.

Mid-training and the processes it spawns (a child for other OpenMP settings, the sharded ranks)
hold this view, never the whole run config, so what mid-training depends on is written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidal.config.run import RunConfig
    from tidal.env.config import EnvConfig
    from tidal.model.config import ModelConfig
    from tidal.parallel.config import ShardingConfig
    from tidal.pretrain.config import PretrainConfig


@dataclass(frozen=True)
class MidTrainingView:
    pretrain: PretrainConfig
    model: ModelConfig
    """The model trained (its fresh weights are seeded by ``run.seed``)."""
    env: EnvConfig
    """The environment that writes the corpus when ``pretrain.corpus`` names no files."""
    sharding: ShardingConfig
    run: RunConfig
    """The seed and ``pretrain_threads``."""

    @classmethod
    def of(cls, cfg) -> MidTrainingView:
        """The view of a run config (a view is returned as it is)."""
        if isinstance(cfg, cls):
            return cfg
        return cls(pretrain=cfg.pretrain, model=cfg.model, env=cfg.env, sharding=cfg.sharding, run=cfg.run)
