"""The example environment "fixit": fix the one wrong line of calc.py with tools (environment.py;
its mid-training corpus: corpus.py; spec.py puts them together)."""

from tidal.families.fixit.environment import Fixit, FixitConfig, FixitTask
from tidal.families.fixit.spec import load_environment

Config = FixitConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["Config", "Fixit", "FixitConfig", "FixitTask", "load_environment"]
