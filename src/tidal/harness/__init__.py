"""The agent harness: multi-turn episodes of a model and an environment, budgets, and
self-summarization (or a sliding window) beyond the context window. See episode.py."""

from tidal.harness.config import HarnessConfig
from tidal.harness.episode import SUMMARY_CLOSE, SUMMARY_OPEN, EpisodeResult
from tidal.harness.runner import RolloutStats, run_episodes, run_episodes_async, to_trajectory

__all__ = ["SUMMARY_CLOSE", "SUMMARY_OPEN", "EpisodeResult", "HarnessConfig", "RolloutStats",
           "run_episodes", "run_episodes_async", "to_trajectory"]
