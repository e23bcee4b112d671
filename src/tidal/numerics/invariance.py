"""The check every deterministic op's candidate path must pass (numerics/probe.py): a call's
rows equal the same rows computed in calls of other sizes, bit for bit, at every thread count
the processes of a machine may use. Also the probe's inputs (normal, and sums that nearly cancel)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

ROW_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 33, 51, 57, 64, 65, 129)
"""Row counts a probe compares against the whole batch: vector bodies and tails, GEMM block
edges (7, 13, 51 and 57 rows are where bf16 ``F.linear`` broke on an Intel Xeon without native
bf16), the MoE stacked route's limit (64) and typical decode batches."""
OTHER_THREAD_COUNTS = (1, 7, 64)
"""Row counts also checked at the other thread counts (the whole batch always is)."""
PROBE_BATCH = 136
"""Rows of the reference batch (>= the largest count + offset)."""
OFFSETS = (0, 3)
"""Where slices start: aligned and unaligned rows."""
LARGE_ROWS = 8189
"""Rows of the large call each op is also checked at: the trainer runs a micro-batch's every
token through one call (16 rows x 256 tokens = 4096 by default) and the engine's prefill up to
engine.max_prefill_tokens (8192), where a kernel may block differently than at 136 rows. Odd,
so the call has a tail."""
LARGE_FLOPS = 2e9
"""A linear whose large call would cost more floating-point operations is checked at fewer
rows (``large_rows``): the probe runs in every process at start-up."""


def probe_threads() -> tuple[int, ...]:
    """Thread counts the check runs at: 1, 2 and all the CPUs (up to 16), the same in every
    process of a machine so that they choose the same paths, plus this process's own count if it
    is another (a process at an unusual count may then choose differently: the engine-vs-trainer
    mismatch metrics would show it)."""
    cpus = os.cpu_count() or 1
    return tuple(sorted({1, min(2, cpus), min(cpus, 16), torch.get_num_threads()}))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) and bool(
        (torch.isnan(a) == torch.isnan(b)).all())


def _each_thread_count(threads: tuple[int, ...]):
    """Yield each thread count with torch set to it; restore the process's count after."""
    before = torch.get_num_threads()
    try:
        for n in threads:
            torch.set_num_threads(n)
            yield n
    finally:
        torch.set_num_threads(before)


def rows_invariant(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                   threads: tuple[int, ...]) -> str:
    """'' if ``fn``'s output rows for every slice of ``x`` [R, ...] equal the whole batch's, at
    every thread count; else what differed. Every row is also checked alone: a kernel can give
    one row alone other bits than in a batch (a value-dependent last-bit difference) that slices
    at two offsets never see, and decode (one row per sequence) then parts from the full
    forward (docs/numerics.md)."""
    full = None
    with torch.no_grad():
        for n in _each_thread_count(threads):
            if full is None:
                full = fn(x)
            elif not _same_bits(fn(x), full):
                return f"whole batch differs at {n} threads"
            for rows in ROW_COUNTS if n == threads[0] else OTHER_THREAD_COUNTS:
                for start in OFFSETS:
                    if start + rows <= x.shape[0] and not _same_bits(
                            fn(x[start : start + rows]), full[start : start + rows]):
                        return f"{rows} rows at offset {start}, {n} threads"
            if n == threads[0]:
                for start in range(x.shape[0]):  # a decode step's one row, wherever it sits
                    if not _same_bits(fn(x[start : start + 1]), full[start : start + 1]):
                        return f"1 row at offset {start}, {n} threads"
    return ""


def large_rows_invariant(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                         threads: tuple[int, ...]) -> str:
    """'' if the first and the last PROBE_BATCH rows of ``fn(x)``, ``x`` a large call's rows,
    equal a PROBE_BATCH-row call's on them (which ``rows_invariant`` ties to every smaller
    call), at every thread count; else what differed."""
    with torch.no_grad():
        for n in _each_thread_count(threads):
            full = fn(x)
            for start in (0, x.shape[0] - PROBE_BATCH):
                if not _same_bits(fn(x[start : start + PROBE_BATCH]), full[start : start + PROBE_BATCH]):
                    return (f"rows {start}..{start + PROBE_BATCH - 1} of a {x.shape[0]}-row call "
                            f"differ from a {PROBE_BATCH}-row call, {n} threads")
    return ""


def large_rows(out_dim: int, in_dim: int) -> int:
    """Rows of a linear's large check: LARGE_ROWS, fewer where that would cost over LARGE_FLOPS;
    0 (no large check) where even 2 x PROBE_BATCH rows would (a large vocabulary's head, whose
    136-row checks already cost that much)."""
    rows = min(LARGE_ROWS, int(LARGE_FLOPS / (2 * out_dim * in_dim)) | 1)
    return rows if rows >= 2 * PROBE_BATCH else 0


def _time_us(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    with torch.no_grad():
        fn(x)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(5):
                fn(x)
            best = min(best, (time.perf_counter() - start) / 5)
    return best * 1e6


# ------------------------------------------------------------------ per-op probes


def _inputs(rows: int, width: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width, generator=g) * scale).to(dtype)


def cancelling_linear_inputs(rows: int, out_dim: int, in_dim: int, dtype: torch.dtype,
                             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [rows, in], weight [out, in]) whose dot products nearly cancel: x's second half repeats
    its first, the weight's second half is minus its first plus 1% noise, so every output is a
    small sum of large terms. Why: a kernel that re-associates its sum for some row counts changes
    a bf16 output only where the fp32 rounding error reaches half a bf16 ulp: on plain normal
    inputs to ~1e-4 of the outputs, so a non-invariant kernel can pass by luck; on these to
    ~1e-2 (docs/numerics.md)."""
    g = torch.Generator().manual_seed(seed)
    half, rest = in_dim // 2, in_dim - 2 * (in_dim // 2)
    x = torch.randn(rows, half, generator=g)
    x = torch.cat((x, x, torch.randn(rows, rest, generator=g)), 1)
    w = torch.randn(out_dim, half, generator=g)
    w = torch.cat((w, 0.01 * torch.randn(out_dim, half, generator=g) - w,
                   torch.randn(out_dim, rest, generator=g)), 1)
    return x.to(dtype), w.to(dtype)
