"""The long-horizon family "ledger": facts read early are needed many context windows later
(tasks.py: the tasks and the scripted expert; environment.py: the tools and rubric; demos.py:
the expert's demonstrations through the harness, its mid-training corpus)."""

from tidal.envs.ledger.config import LedgerConfig
from tidal.envs.ledger.environment import LedgerEnvironment, load_environment

Config = LedgerConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["Config", "LedgerConfig", "LedgerEnvironment", "load_environment"]
