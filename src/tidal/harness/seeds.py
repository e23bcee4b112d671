"""Seeds of units of work, derived from the run's seed and what the work is.

    episode seed = derive_seed(batch seed, group id, sample index)   # run_episodes
    request seed = derive_seed(episode seed, request index)          # Episode, one per turn/summary

A rollout's batch seed is derived from (run.seed, "rollout", step) and held-out evaluation's from
(run.seed, "heldout"), so an episode samples the same tokens whichever worker runs it, beside
whatever else, after whatever ran before (each request has its own stream in the engine:
GenerationRequest.seed). Every evaluation draws the same numbers, so before and after RL differ
by the weights only.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (not of Python's hash seed)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
