"""``env.name = "harness"``: a task family's tasks and grader, episodes run by an outside
harness through the gateway (the runner sees ``EnvironmentSpec.external`` and runs
gateway.episode.HarnessEpisode instead of tidal's own multi-turn loop)."""

from __future__ import annotations

from dataclasses import replace

from tidal.env.registry import load_environment as load_family
from tidal.env.spec import EnvironmentSpec
from tidal.errors import UserError
from tidal.gateway.config import GatewayConfig


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
    return replace(family, name=f"harness:{family.name}", external=config, build_corpus=corpus)
