"""Numerics shared by the engine and the trainer: how far apart their logprobs and routing are."""

from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics

__all__ = ["mismatch_metrics", "routing_flip_metrics"]
