"""The long-horizon family "ledger" (see tasks.py)."""

from tidal.envs.ledger.environment import load_environment

__all__ = ["load_environment"]
