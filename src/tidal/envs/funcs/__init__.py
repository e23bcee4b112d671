"""The "funcs" family: write a Python function from a one-line description (see tasks.py)."""

from tidal.envs.funcs.environment import load_environment

__all__ = ["load_environment"]
