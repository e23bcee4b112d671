"""Numerics shared by the engine and the trainer: the op sets the one fused forward runs on
(opset.py), the start-up probe that picks batch-invariant paths (probe.py), and how far apart
the engine's and the trainer's logprobs and routing are (metrics.py). A leaf: it imports torch
and itself, never the model."""

from __future__ import annotations

import os

import torch

from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics

MODES = ("fast", "deterministic")
OPS_BACKENDS = ("auto", "gpu")
"""``TIDAL_OPS``: "auto" (unset): the GPU op sets (tidal.kernels) on CUDA tensors, the CPU op sets
elsewhere; "gpu": the GPU op sets on any device -- on CPU tensors they need Triton's interpreter
(``TRITON_INTERPRET=1``): tests and the CPU rehearsal of scripts/gpu_numerics.sh run the Triton
path that way."""


def ops_backend(device: torch.device | str) -> str:
    """"gpu" or "cpu": which op sets serve tensors on ``device`` (``TIDAL_OPS``, read only here;
    set it before the first fused forward, whose op set is cached with its weights)."""
    choice = os.environ.get("TIDAL_OPS", "auto") or "auto"
    if choice not in OPS_BACKENDS:
        raise ValueError(f"TIDAL_OPS={choice!r}; choose one of {OPS_BACKENDS}")
    return "gpu" if choice == "gpu" or torch.device(device).type == "cuda" else "cpu"


def make_ops(mode: str, dtype: torch.dtype, shapes, device: torch.device | str = "cpu"):
    """The op set for ``mode`` computing in ``dtype`` on ``device``; ``shapes`` (probe.ProbeShapes)
    are the model's sizes, at which the CPU deterministic paths are probed (cached per process).
    On the GPU (``ops_backend``): kernels/triton_ops.py's TritonOps (deterministic) or
    kernels/fast_ops.py's FastGpuOps (fast)."""
    if mode not in MODES:
        raise ValueError(f"unknown numerics mode {mode!r}; choose one of {MODES}")
    if ops_backend(device) == "gpu":  # the GPU kernels are an extension (tidal.plugins)
        from tidal.plugins import plugin

        return plugin("tidal.gpu_ops", mode, f"engine.numerics = {mode!r} on a GPU")()
    if mode == "fast":
        from tidal.numerics.fast import FastOps

        return FastOps()
    from tidal.numerics.deterministic import DeterministicOps
    from tidal.numerics.probe import choose_paths

    return DeterministicOps(choose_paths(dtype, shapes))


__all__ = ["MODES", "OPS_BACKENDS", "make_ops", "ops_backend", "mismatch_metrics", "routing_flip_metrics"]
