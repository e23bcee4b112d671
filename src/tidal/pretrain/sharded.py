"""Mid-training over ``sharding.processes`` ranks with FSDP2: the RL trainer's sharding
(tidal.parallel), the same loop (loop.py), each rank on its slice of every batch.

    rank 0 (this process) ┐  same seed: same model, same shuffled batch indices on every rank
    ranks 1..N-1          ┘  rank r trains rows r, r + N, ... of each batch; the loss is the whole
                             batch's token mean (its token count all-reduced), FSDP sums the
                             gradients, so one step is the single-process step up to float order
    every step: the clock is all-reduced (max), so all ranks stop and schedule the LR alike
    at the end: rank 0 gathers the weights one parameter at a time and saves the HF folder

Launch: "spawn" starts ranks 1..N-1 from this process (one machine); "torchrun" takes the ranks
torchrun started (`torchrun --nproc-per-node N -m tidal pretrain ... --sharding.launcher
torchrun`), where every rank runs the CLI and only rank 0 writes.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import torch

from tidal.parallel.group import (
    Group,
    WorldSizeError,
    close_group,
    free_port,
    init_group,
    torchrun_group,
)
from tidal.pretrain.view import MidTrainingView

JOIN_TIMEOUT_S = 60.0
"""How long rank 0 waits for a spawned rank to exit after the run (they only return)."""


def check_batch(cfg: MidTrainingView) -> None:
    """pretrain.batch_size must split evenly: every rank trains the same rows per step."""
    n, b = cfg.sharding.processes, cfg.pretrain.batch_size
    if b % n:
        raise WorldSizeError(
            f"pretrain.batch_size = {b} rows cannot be split evenly over sharding.processes "
            f"= {n}; make pretrain.batch_size a multiple of {n}, or change the processes")


def pretrain_sharded(cfg: MidTrainingView, out_dir: Path, docs: list[str] | None, progress: bool, train) -> Path:
    """Run the sharded mid-training; returns the saved model folder (written by rank 0).
    ``train``: each rank's training loop (loop._pretrain, handed in: loop.py dispatches here)."""
    sharding = cfg.sharding
    check_batch(cfg)
    if sharding.launcher == "torchrun":
        group = torchrun_group(sharding)
        return _run_rank(cfg, out_dir, docs, progress and group.rank == 0, group, train)
    port, n = free_port(), sharding.processes
    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_spawned_rank, args=(cfg, out_dir, docs, r, n, port, train), daemon=True)
             for r in range(1, n)]
    for p in ranks:
        p.start()
    try:
        group = init_group(0, n, "127.0.0.1", port, backend=sharding.backend, timeout_s=sharding.timeout_s)
        return _run_rank(cfg, out_dir, docs, progress, group, train)
    finally:
        for p in ranks:
            p.join(JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()


def rank_threads(cfg: MidTrainingView) -> int:
    """Threads per rank: run.pretrain_threads, or (0 = tuned) this machine's cores shared out."""
    n = cfg.sharding.processes
    return cfg.run.pretrain_threads or max(1, (os.cpu_count() or 1) // n)


def _spawned_rank(cfg: MidTrainingView, out_dir: Path, docs, rank: int, world: int, port: int, train) -> None:
    from tidal.numerics import mkl_cnr

    mkl_cnr.enable_strict()
    sharding = cfg.sharding
    group = init_group(rank, world, "127.0.0.1", port, backend=sharding.backend, timeout_s=sharding.timeout_s)
    _run_rank(cfg, out_dir, docs, False, group, train)


def _run_rank(cfg: MidTrainingView, out_dir: Path, docs, progress: bool, group: Group, train) -> Path:
    torch.set_num_threads(rank_threads(cfg))
    try:
        return train(cfg, out_dir, docs, progress, None, thread_invariant=True, group=group)
    finally:
        close_group()
