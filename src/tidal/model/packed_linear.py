"""A serving copy of a weight matrix that picks the faster CPU GEMM per call.

Why: torch's fp32 ``F.linear`` on CPU calls MKL's sgemm. On this project's AMD EPYC (Zen 5) MKL
takes a generic path and runs the multi-row matmuls of a batched decode step at ~55-75 GFLOP/s;
oneDNN (also inside the torch wheel) with the weight reordered once into its blocked layout runs
them ~1.5-2x faster. Measured, 1 thread, torch 2.13, us per call (MKL F.linear / oneDNN packed):

    rows x out x in       MKL   oneDNN          rows x out x in      MKL   oneDNN
    16 x 1024 x 192        75     40            64 x 1024 x 192      250    113
    16 x  192 x 512        36     23            64 x  192 x 512      122     62
    16 x  320 x 192        23     17             1 x 1024 x 192       12     19
    16 x  192 x 192        14     14             4 x  320 x 192       10     13

oneDNN costs ~11 us per call whatever the size, so a single row (batch-1 decode) stays on MKL;
the switch is at ~0.5M multiply-adds, where the two meet (moving it from 0.25M to 1M changed a
16-row decode step by under 2%). The two may sum in different orders: outputs agree to float
rounding (~1e-6 relative), not necessarily bit for bit.

On the tiny preset this choice is worth ~30% of decode throughput at 16 and 64 rows (engine
A/B, same process). The table is this CPU's: on Intel CPUs MKL's small-matrix path is much
better, and the threshold should be re-measured there before trusting it.

oneDNN is used only where it exists and was measured: CPU tensors, fp32, torch built with
mkldnn. Elsewhere (GPU, bf16, other builds) this is plain ``F.linear``. The packed copy is a
second copy of the weight (serving memory for matrices doubles); it is derived data, rebuilt by
ServingWeights whenever its source changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tidal.numerics.ops import onednn_usable, pack_for_onednn

ONEDNN_MIN_MACS = 1 << 19
"""Multiply-adds per call (rows x out x in) from which oneDNN beats MKL on the measured CPU."""


class PackedLinear:
    """y = x @ weight.T for x [..., in]; ``weight`` [out, in] is kept as given (not copied)."""

    __slots__ = ("weight", "packed", "_macs_per_row")

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self._macs_per_row = weight.numel()
        self.packed = pack_for_onednn(weight) if onednn_usable(weight) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.packed is not None and rows * self._macs_per_row >= ONEDNN_MIN_MACS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return F.linear(x, self.weight)
