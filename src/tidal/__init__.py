"""tidal: asynchronous, distributed reinforcement learning of LLM coding agents."""

__version__ = "0.1.0"
