"""The long-horizon family "ledger": facts read early are needed many context windows later
(tasks.py: the tasks and the scripted expert; environment.py: the tools and rubric; demos.py:
the expert's demonstrations through the harness, its mid-training corpus; spec.py: all of them
as one EnvironmentSpec)."""

from tidal.families.ledger.config import LedgerConfig
from tidal.families.ledger.environment import LedgerEnvironment
from tidal.families.ledger.spec import load_environment

Config = LedgerConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["Config", "LedgerConfig", "LedgerEnvironment", "load_environment"]
