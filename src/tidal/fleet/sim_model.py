"""The simulator's model of what takes time (SimModel: the ``[simulate]`` table of a simulate
recipe, fitted by calibrate.py) and its errors: constants only, no clock, so the recipe loader,
the calibration and the simulation share one definition of every field."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from tidal.errors import UserError
from tidal.config_section import Section


class SimulateError(UserError):
    """A simulate recipe or model the user can fix (the message names the field)."""


class Partition(Section):
    region: str
    """The region cut off (its uploads, lease renewals and weight downloads fail)."""
    start_s: float = Field(ge=0)
    """Simulated seconds after the start at which the region is cut off."""
    end_s: float = Field(gt=0)
    """When it is back."""

    @model_validator(mode="after")
    def _ordered(self) -> Partition:
        if self.end_s <= self.start_s:
            raise ValueError(f"simulate.partitions: end_s ({self.end_s}) must be after start_s ({self.start_s})")
        return self


class SimModel(Section):
    tokens_per_s: float = Field(2000.0, gt=0)
    """Generated tokens per second of one worker at pool.speed 1 (its engine's throughput with its
    batch of G episodes: calibrated as generated tokens over engine seconds)."""
    rollout_tokens_mean: float = Field(48.0, gt=0)
    """Mean generated tokens per trajectory (all its turns)."""
    rollout_tokens_sigma: float = Field(0.5, ge=0)
    """Sigma of the lognormal of generated tokens per trajectory (0 = every rollout the mean)."""
    rollout_tokens_max: int = Field(0, ge=0)
    """Longest rollout in tokens (the engine's budget); 0 = no cap."""
    prompt_tokens: float = Field(0.0, ge=0)
    """Tokens per trajectory the trainer processes besides the generated ones (prompt and
    environment turns)."""
    grade_s: float = Field(0.01, ge=0)
    """Worker seconds per trajectory outside the engine (environment, tools, grading)."""
    worker_start_s: float = Field(0.0, ge=0)
    """Seconds a new worker takes before its first assignment (process, model load, warm-up)."""
    train_fixed_s: float = Field(0.5, ge=0)
    """Seconds of one trainer step besides its tokens (optimizer, gate)."""
    train_per_token_s: float = Field(5e-4, ge=0)
    """Trainer seconds per trained token (forward + backward)."""
    publish_s: float = Field(0.1, ge=0)
    """Seconds the driver spends publishing a version (encoding the delta)."""
    eval_s: float = Field(0.0, ge=0)
    """Seconds the driver spends on each held-out evaluation (every orchestrator.eval_every steps;
    the workers get no new work meanwhile)."""
    full_bytes: float = Field(6.5e6, gt=0)
    """Bytes of the full serving weights (what a late joiner's anchor carries, and what the
    receiving CPU decodes and verifies per update)."""
    delta_bytes: float = Field(4.5e6, gt=0)
    """Bytes of one update on the wire (the encoded delta)."""
    decode_bytes_per_s: float = Field(2.0e9, gt=0)
    """Receiving CPU's rate of decode + apply + verify, in model bytes per second."""
    lan_bandwidth_mbps: float = Field(10_000.0, gt=0)
    """Bandwidth inside a region (origin or relay to a worker), megabits per second."""
    lan_latency_ms: float = Field(0.5, ge=0)
    """One-way latency inside a region, milliseconds."""
    trajectory_bytes_per_token: float = Field(16.0, ge=0)
    """Upload bytes per generated token (token id, logprob, version, mask)."""
    dispatch_during_train: bool = True
    """True: as orchestrator/loop.py does, a step trains and publishes on a trainer thread and the
    driver keeps dispatching. False: the older loop, which trained in the driver's thread, so a
    worker finishing meanwhile waited for the next dispatch."""
    leave: Literal["expire", "release"] = "expire"
    """How a worker of a pool whose capacity drops leaves: "expire" = it is killed and its lease
    runs out (its work is queued again lease_s after its last heartbeat); "release" = it says so
    and its work is queued again at once."""
    partitions: list[Partition] = Field(default_factory=list)
    """Regions cut off for a while (their leases expire; their results arrive when back)."""

    def rollout_mu(self) -> float:
        """The lognormal's mu for rollout_tokens_mean and rollout_tokens_sigma."""
        return math.log(self.rollout_tokens_mean) - self.rollout_tokens_sigma ** 2 / 2



def sim_model_from(table: dict[str, Any]) -> SimModel:
    """A SimModel from a [simulate] table; one SimulateError naming each bad field."""
    try:
        return SimModel.model_validate(table)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = "simulate." + ".".join(str(x) for x in err["loc"])
            what = ("unknown key: remove it or check its spelling" if err["type"] == "extra_forbidden"
                    else err["msg"].removeprefix("Value error, "))
            lines.append(f"{where}: {what}")
        raise SimulateError("invalid [simulate] table:\n  " + "\n  ".join(lines)) from None
