"""OpenMP's wait policy: set by the command line before torch loads (OpenMP reads it once per
process), and undone for the mid-training child that has the cores to itself."""

from __future__ import annotations

import os

ALONE_ON_THE_MACHINE = {"pretrain"}
"""Commands whose torch threads have the cores to themselves (no rollout workers, no sandboxes):
their idle OpenMP threads may spin (OpenMP's default), see ``set_wait_policy``."""


PASSIVE_BY_DEFAULT = False
"""Set by ``set_wait_policy``: whether this process runs with tidal's default OMP_WAIT_POLICY=PASSIVE."""


def set_wait_policy(command: str) -> bool:
    """Before torch loads (OpenMP reads its wait policy once per process): PASSIVE for commands
    that share the cores with rollout workers and sandboxes, so idle OpenMP threads sleep instead
    of spinning on a core someone else needs; OpenMP's default (spin a while, then sleep) for
    commands alone on the machine. A policy the user set is kept. Returns whether PASSIVE is
    tidal's default here (``tidal train`` then mid-trains in a child process without it).

    Why: spinning threads steal cores that rollout workers and sandboxes need, while alone on
    the machine waking a sleeping thread at every parallel region makes a mid-training step
    slower (docs/results/notes-midtraining.md)."""
    global PASSIVE_BY_DEFAULT
    PASSIVE_BY_DEFAULT = "OMP_WAIT_POLICY" not in os.environ and command not in ALONE_ON_THE_MACHINE
    if PASSIVE_BY_DEFAULT:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return PASSIVE_BY_DEFAULT


def pretrain_child_env() -> dict:
    """Mid-training runs in a child process: MKL's strict reproducible mode (which it turns on,
    numerics/mkl_cnr.py) then stays out of the RL phase, where it would slow one-row matmuls;
    and it has the cores to itself (Ray and the sandboxes start after it), so when this process
    runs with tidal's default OMP_WAIT_POLICY=PASSIVE (right for the RL phase) the child runs
    without it (see set_wait_policy)."""
    return {"OMP_WAIT_POLICY": None} if PASSIVE_BY_DEFAULT else {}
