"""The ledger family as tidal loads it (``env.name = "ledger"``): its environment, tasks and the
expert's demonstrations as its corpus, in one EnvironmentSpec."""

from __future__ import annotations

from tidal.env import EnvironmentSpec, Rubric
from tidal.families.ledger import tasks as family
from tidal.families.ledger.config import LedgerConfig
from tidal.families.ledger.demos import demo_documents
from tidal.families.ledger.environment import (PARTIAL_CREDIT, LedgerEnvironment, make_tests_pass, solved,
                                           steps_right)


def load_environment(sandbox=None, config: LedgerConfig | None = None) -> EnvironmentSpec:
    """``config``: the validated ``env.args`` (None = the defaults)."""
    cfg = config or LedgerConfig()
    rubric = Rubric([(make_tests_pass(sandbox), 1.0), (steps_right, PARTIAL_CREDIT)])
    return EnvironmentSpec(
        name="ledger",
        make=lambda: LedgerEnvironment(sandbox, rubric),
        sample_tasks=lambda n, seed, heldout: family.sample_tasks(cfg, n, seed, heldout),
        build_corpus=lambda n_docs, seed: build_corpus(cfg, n_docs, seed),
        corpus_version=family.GENERATOR_VERSION,
        success=solved,
    )


def build_corpus(cfg: LedgerConfig, n_docs: int, seed: int) -> list[str]:
    """The expert's demonstrations as text (they play through the harness)."""
    return demo_documents(cfg, n_docs, seed)
