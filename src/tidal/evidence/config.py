"""The ``[env.integrity]`` section: what a run does about cheating, per environment.

Detectors run on every episode whose environment keeps evidence (``Environment.evidence()``);
this section decides what their findings do to training. It sits under ``[env]`` because the
right answer depends on the environment: a family whose tests the agent can write needs
screening, one graded entirely by construction may only log.
"""

from typing import Literal

from pydantic import Field

from tidal.config_section import Section


class IntegrityConfig(Section):
    policy: Literal["log", "screen", "penalise"] = "screen"
    """What a flagged episode (a finding at least min_confidence sure) does to training.
    log = nothing: counted in the metrics only (detection off, as far as training goes);
    screen = dropped from the trained batch (its GRPO group is normalised without it);
    penalise = trained with its reward replaced by ``penalty``."""
    min_confidence: float = Field(0.5, ge=0.0, le=1.0)
    """A finding flags its episode when its confidence is at least this, in [0, 1]."""
    penalty: float = -1.0
    """The reward a flagged episode is trained with under policy "penalise" (the environment's
    rewards are usually in [0, 1], so below any honest outcome)."""
    canary_rate: float = Field(0.05, ge=0.0, le=0.5)
    """Fraction of training tasks replaced by impossible versions of themselves (canaries:
    their tests contradict their specification, so any pass is cheating), where the
    environment can make one (``EnvironmentSpec.make_canary``); ignored elsewhere. In [0, 0.5]."""
    eval_canaries: int = Field(64, ge=0)
    """Canary tasks (made from held-out tasks) run at every evaluation, so each checkpoint has a
    cheat rate; 0 = none. Ignored where the environment cannot make canaries."""
