"""``env.name = "harness"``: a task family's tasks and grader, episodes run by an outside
harness through the gateway (``EnvironmentSpec.outside``: the runner opens a Gateway around its
episodes and runs gateway.episode.HarnessEpisode instead of tidal's own multi-turn loop)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from tidal.env.registry import load_environment as load_family
from tidal.env.spec import EnvironmentSpec
from tidal.errors import UserError
from tidal.gateway.config import GatewayConfig
from tidal.gateway.episode import HarnessEpisode
from tidal.gateway.server import Gateway


@dataclass(frozen=True)
class GatewayEpisodes:
    """env.spec.OutsideEpisodes for an outside harness: a Gateway around a rollout call."""

    config: GatewayConfig

    @contextlib.asynccontextmanager
    async def serve(self, client, tokenizer, engine_cfg, window: int, no_experts):
        async with Gateway(client, tokenizer, engine_cfg, self.config, window, no_experts) as gw:
            yield lambda env, index, seed: HarnessEpisode(env, gw, self.config, index, seed)


def load_environment(sandbox=None, config: GatewayConfig | None = None) -> EnvironmentSpec:
    if config is None:
        raise UserError("env.args.command is required for env.name = 'harness': the command "
                        "line of your harness")
    if config.tasks == "harness":
        raise UserError("env.args.tasks names the family whose tasks the harness solves; it "
                        "cannot be 'harness' itself")
    family = load_family(config.tasks, sandbox=sandbox, **config.task_args)
    corpus = None
    if config.corpus_command is not None:
        from tidal.gateway.corpus import build_corpus

        def corpus(n_docs: int, seed: int) -> list[str]:
            return build_corpus(config, family, n_docs, seed)
    return replace(family, name=f"harness:{family.name}", outside=GatewayEpisodes(config),
                   build_corpus=corpus)
