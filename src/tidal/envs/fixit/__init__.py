"""The example environment "fixit" (see environment.py)."""

from tidal.envs.fixit.environment import load_environment

__all__ = ["load_environment"]
