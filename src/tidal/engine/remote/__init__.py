"""Generation through an OpenAI-compatible server (tidal serve, vLLM, SGLang) behind the
Engine interface: engine.backend = "remote" (docs/scale.md, "Remote inference")."""

from tidal.engine.remote.engine import RemoteEngine, RemoteEngineError, StaleReply

__all__ = ["RemoteEngine", "RemoteEngineError", "StaleReply"]
