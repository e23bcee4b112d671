"""The agent harness: multi-turn episodes of a model and an environment, budgets, and
self-summarization (or a sliding window) beyond the context window. See episode.py.

``GenerationRequest`` / ``GenerationResult`` are what a client passed to ``run_episodes`` (or an
``Episode``) answers: a scripted policy (demonstrations, tests) implements
``async generate(GenerationRequest) -> GenerationResult``."""

from tidal.engine.request import GenerationRequest, GenerationResult
from tidal.harness.config import HarnessConfig
from tidal.harness.episode import PROMPT_TOO_LONG, SUMMARY_CLOSE, SUMMARY_OPEN, Episode, EpisodeResult
from tidal.harness.runner import RolloutStats, run_episodes, run_episodes_async, to_trajectory

__all__ = ["PROMPT_TOO_LONG", "SUMMARY_CLOSE", "SUMMARY_OPEN", "Episode", "EpisodeResult",
           "GenerationRequest", "GenerationResult", "HarnessConfig", "RolloutStats",
           "run_episodes", "run_episodes_async", "to_trajectory"]
