"""Numerics shared by the engine and the trainer: the op sets the one fused forward runs on
(opset.py), the start-up probe that picks batch-invariant paths (probe.py), and how far apart
the engine's and the trainer's logprobs and routing are (metrics.py). A leaf: it imports torch
and itself, never the model."""

from __future__ import annotations

import torch

from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics

MODES = ("fast", "deterministic")


def make_ops(mode: str, dtype: torch.dtype, shapes, device: torch.device | str = "cpu"):
    """The op set for ``mode`` computing in ``dtype`` on ``device``; ``shapes`` (probe.ProbeShapes)
    are the model's sizes, at which the deterministic paths are probed (cached per process)."""
    if mode not in MODES:
        raise ValueError(f"unknown numerics mode {mode!r}; choose one of {MODES}")
    if torch.device(device).type == "cuda":
        from tidal.kernels.triton_ops import TritonOps

        return TritonOps(mode)
    if mode == "fast":
        from tidal.numerics.fast import FastOps

        return FastOps()
    from tidal.numerics.deterministic import DeterministicOps
    from tidal.numerics.probe import choose_paths

    return DeterministicOps(choose_paths(dtype, shapes))


__all__ = ["MODES", "make_ops", "mismatch_metrics", "routing_flip_metrics"]
