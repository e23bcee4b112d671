"""tidal.engine: continuous-batching sampler with per-token logprobs, versions and MoE experts,
and hot weight reload. See engine.py for the step loop and request.py for what a result holds."""

from tidal.engine.config import EngineConfig
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationRequest, GenerationResult

__all__ = ["Engine", "EngineConfig", "GenerationRequest", "GenerationResult"]
