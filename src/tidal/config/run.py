"""Run-wide settings: the seed and the CPU thread counts of every phase, in one place.

These were spread over component sections (orchestrator.seed also seeded mid-training and model
init; thread counts lived in orchestrator and pretrain); ``MOVED_KEYS`` names where each went, so
an old recipe or flag gets an error naming its new key.
"""

from pydantic import Field

from tidal.config_section import Section


class RunConfig(Section):
    seed: int = 0
    """Seed of the whole run: the fresh model's initial weights, the mid-training corpus and its
    batch order, the RL tasks of every step, and the sampling of every rollout and held-out
    evaluation (each episode draws from its own stream, derived from this seed and which episode
    it is; see tidal.harness.seeds). Same seed, config and machine: the same bits (docs/numerics.md,
    "Reproducibility")."""
    trainer_threads: int = Field(2, ge=0)
    """torch CPU threads of the RL trainer's process (trainer and held-out evaluation); 0 =
    torch's default (one per core). 2 by default: on 2 cores beside one-thread rollout workers the
    trainer's step is still faster on both cores than on one (docs/training.md)."""
    worker_threads: int = Field(1, ge=0)
    """torch CPU threads in each rollout worker; 0 = torch's default."""
    trainer_cpus: list[int] = Field(default_factory=list)
    """CPUs the trainer's process is pinned to (e.g. [0]); empty = not pinned. With worker_cpus
    it lays a run out as a real deployment is: trainer and rollout workers on separate cores."""
    worker_cpus: list[int] = Field(default_factory=list)
    """CPUs every Ray rollout worker process is pinned to (e.g. [1]); empty = not pinned.
    Ignored for threads in the trainer's process (orchestrator.backend = 'local')."""
    pretrain_threads: int = Field(0, ge=0)
    """CPU threads of mid-training while it runs; 0 = measured: torch's default (one per core) or
    1, whichever runs steps faster, re-checked now and then (pretrain.loop.ThreadTuner). On a
    machine whose cores other processes also use, 1 is faster: an OpenMP parallel region waiting
    for a thread whose core is busy can make each step several times slower; on free cores all
    of them are. The choice changes no bit of the result:
    mid-training runs MKL in its strict reproducible mode, where a matmul's bits do not depend on
    the thread count (tidal.numerics.mkl_cnr); where that mode cannot be had (MKL already ran in
    the process, as when a script calls pretrain() after other work) the count stays fixed."""


MOVED_KEYS = {
    "orchestrator.seed": "run.seed",
    "orchestrator.num_threads": "run.trainer_threads",
    "orchestrator.worker_threads": "run.worker_threads",
    "pretrain.num_threads": "run.pretrain_threads",
    "trainer.sharding": "sharding",
    "engine.on_mismatch": "orchestrator.guard.numerics_mismatch",
}
"""Old dotted key -> its key now; the loader names the new key when a config uses an old one."""
