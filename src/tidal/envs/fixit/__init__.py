"""The example environment "fixit": fix the one wrong line of calc.py with tools (environment.py;
its mid-training corpus: corpus.py)."""

from tidal.envs.fixit.environment import Fixit, FixitConfig, FixitTask, load_environment

Config = FixitConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["Config", "Fixit", "FixitConfig", "FixitTask", "load_environment"]
