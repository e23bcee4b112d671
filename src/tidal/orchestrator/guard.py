"""The guard that watches an RL run: it detects a collapse and restores the best checkpoint or
stops (orchestrator.guard; docs/training.md, "Stable RL: schedule, controls, guard").

    StepRecord ──> RewardCollapse, PassCrash, InvalidSurge, BudgetSurge, ToolErrorSurge,
                   EntropySurge ─────────────────────────────────────────────────────────┐
    EvalRecord ──> heldout_drop (against the best checkpoint so far) ─────────────────────┴─> Finding
        ──> Guard.decide: "restore" | "stop" | "log" (policy, max_restores) ──> GuardEvent
        ──> Run: restore_weights (the best checkpoint, a fresh optimizer for the model RL began
            from), lr_scale × lr_factor, the version counter goes on (published as a new
            version); or the RL loop ends

The detectors are plain functions and small classes over the run's own records
(tidal.orchestrator.records), so they are tested without a model. A surge detector keeps a
window of recent values (its "recent level"); a value beyond its threshold is flagged and kept
out of the window, and the detector fires after ``surge_steps`` flagged steps in a row. After
an action the detectors start again with empty windows (their history was the collapse).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.orchestrator.config import GuardConfig
from tidal.orchestrator.pool import OrchestratorError
from tidal.orchestrator.records import BestCheckpoint, EvalRecord, StepRecord


@dataclass
class Finding:
    """A detector fired: its name, the figures it judged, and a line saying so."""

    detector: str
    evidence: dict[str, Any]
    summary: str


# ---------------------------------------------------------------- held-out pass@1


def heldout_noise(pass1: float, tasks: int) -> float:
    """Binomial standard error of a pass@1 of ``pass1`` over ``tasks`` held-out tasks."""
    return math.sqrt(max(pass1 * (1 - pass1), 0.0) / max(tasks, 1))


def heldout_drop(best: BestCheckpoint, record: EvalRecord, tasks: int,
                 cfg: GuardConfig) -> Finding | None:
    """Held-out pass@1 below the best so far by more than its noise (heldout_sigmas standard
    errors of the best) and by at least heldout_min_drop."""
    noise = heldout_noise(best.heldout_pass1, tasks)
    threshold = max(cfg.heldout_sigmas * noise, cfg.heldout_min_drop)
    drop = best.heldout_pass1 - record.heldout_pass1
    if drop <= threshold:
        return None
    return Finding("heldout_drop", {
        "heldout_pass1": record.heldout_pass1, "best": best.heldout_pass1, "best_step": best.step,
        "drop": drop, "threshold": threshold, "noise": noise, "tasks": tasks},
        f"held-out pass@1 {record.heldout_pass1:.3f} is {100 * drop:.1f} points below the best "
        f"{best.heldout_pass1:.3f} (step {best.step}; threshold {100 * threshold:.1f} points)")


# ---------------------------------------------------------------- training steps


class RewardCollapse:
    """At least ``collapse_steps`` steps in a row in which every reward was one value and every
    advantage 0 while the training pass rate was below 1, as unlikely by chance as
    ``collapse_chance`` at the recent pass rate of steps with reward spread (a run without such
    steps has nothing that could collapse)."""

    name = "reward_collapse"

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.level: deque[float] = deque(maxlen=cfg.window)
        """Pass rates of recent steps with reward spread; kept across resets."""
        self.dead = 0
        self.chance = 1.0

    def reset(self) -> None:
        self.dead, self.chance = 0, 1.0

    def feed(self, record: StepRecord) -> Finding | None:
        n = episodes(record)
        if n == 0:
            return None  # nothing trained: no evidence either way
        r = record.rollout
        flat = r.reward_std == 0 and (record.train is None or record.train.adv_abs_mean == 0)
        if not flat:
            self.level.append(r.pass_rate)
            self.reset()
            return None
        if r.pass_rate >= 1 or not self.level:
            self.reset()
            return None
        p = statistics.fmean(self.level)
        self.dead += 1
        self.chance *= p ** n + (1 - p) ** n
        if self.dead < self.cfg.collapse_steps or self.chance >= self.cfg.collapse_chance:
            return None
        return Finding(self.name, {"steps": self.dead, "reward": r.reward_mean, "pass_rate": r.pass_rate,
                                   "recent_pass_rate": p, "chance": self.chance},
                       f"every reward was {r.reward_mean:g} with zero advantage for {self.dead} "
                       f"steps (training pass rate {r.pass_rate:.2f}, recently {p:.2f})")


def episodes(record: StepRecord) -> int:
    """Episodes the step's rollout figures are over."""
    return sum(record.rollout.reasons.values()) or record.trajectories


def binomial_noise(level: float, n: int, sigmas: float) -> float:
    """``sigmas`` standard errors of a share near ``level`` over ``n`` episodes, the level
    smoothed as (k + 1) / (n + 2) so a level of 0 or 1 still has noise."""
    if n <= 0:
        return math.inf
    p = (level * n + 1) / (n + 2)
    return sigmas * math.sqrt(p * (1 - p) / n)


class Surge:
    """A value judged against its recent level: ``flagged(value, window, n)`` (n: the step's
    episodes) for ``surge_steps`` steps in a row fires; flagged values stay out of the window."""

    def __init__(self, cfg: GuardConfig, flagged: Callable[[float, list[float], int], bool]):
        self.cfg, self.flagged = cfg, flagged
        self.window: deque[float] = deque(maxlen=cfg.window)
        self.run: list[float] = []

    def reset(self) -> None:
        self.window.clear()
        self.run = []

    def level(self) -> float:
        return statistics.fmean(self.window) if self.window else 0.0

    def feed(self, value: float, n: int = 0) -> list[float] | None:
        """The flagged run of values when it fires, else None."""
        if len(self.window) >= self.cfg.min_history and self.flagged(value, list(self.window), n):
            self.run.append(value)
            return list(self.run) if len(self.run) >= self.cfg.surge_steps else None
        self.run = []
        self.window.append(value)
        return None


class PassCrash:
    """The training pass rate below its recent mean by ``pass_drop``, by ``noise_sigmas``
    binomial standard errors over the step's episodes and by ``noise_sigmas`` times the recent
    steps' own spread, ``surge_steps`` steps running.

    Why the spread: a step's pass rate depends on which tasks it drew, and the episodes of one
    task are not independent samples (a near-deterministic policy solves all of a group or none),
    so with few tasks a step the binomial error over episodes understates the noise; the binomial
    margin alone restored a healthy multi-turn run (docs/training.md; tests/test_guard.py keeps
    the sequence)."""

    name = "pass_crash"

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.surge = Surge(cfg, lambda v, w, n: v < statistics.fmean(w) - self.margin(w, n))

    def margin(self, window: list[float], n: int) -> float:
        spread = self.cfg.noise_sigmas * statistics.stdev(window) if len(window) > 1 else 0.0
        return max(self.cfg.pass_drop, binomial_noise(statistics.fmean(window), n, self.cfg.noise_sigmas),
                   spread)

    def reset(self) -> None:
        self.surge.reset()

    def feed(self, record: StepRecord) -> Finding | None:
        n = episodes(record)
        if n == 0:
            return None
        level, window = self.surge.level(), list(self.surge.window)
        run = self.surge.feed(record.rollout.pass_rate, n)
        if run is None:
            return None
        return Finding(self.name, {"pass_rate": run, "recent_mean": level,
                                   "threshold": level - self.margin(window, n)},
                       "training pass rate crashed: " + " -> ".join(f"{v:.2f}" for v in run)
                       + f" against a recent mean of {level:.2f}")


def reason_share(record: StepRecord, reasons: list[str]) -> float | None:
    """The share of the step's episodes whose reason is one of ``reasons`` (None: no episodes)."""
    counts = record.rollout.reasons
    total = sum(counts.values())
    return sum(counts.get(r, 0) for r in reasons) / total if total else None


class ShareSurge:
    """A share of each step (of its episodes, of its turns) above its recent mean by ``rise()``
    (and by ``noise_sigmas`` binomial standard errors over the step's episodes), ``surge_steps``
    steps running. Subclasses say what share, how far, and how to say it."""

    name = ""

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.surge = Surge(cfg, lambda v, w, n: v >= statistics.fmean(w) + self.margin(statistics.fmean(w), n))

    def rise(self) -> float:
        raise NotImplementedError

    def share(self, record: StepRecord) -> float | None:
        raise NotImplementedError

    def describe(self, run: list[float], level: float) -> tuple[dict[str, Any], str]:
        """Evidence beyond the shares and level, and the finding's line."""
        raise NotImplementedError

    def margin(self, level: float, n: int) -> float:
        return max(self.rise(), binomial_noise(level, n, self.cfg.noise_sigmas))

    def reset(self) -> None:
        self.surge.reset()

    def feed(self, record: StepRecord) -> Finding | None:
        share = self.share(record)
        if share is None:
            return None
        level = self.surge.level()
        run = self.surge.feed(share, episodes(record))
        if run is None:
            return None
        extra, line = self.describe(run, level)
        return Finding(self.name, {"share": run, "recent_mean": level,
                                   "threshold": level + self.margin(level, episodes(record)), **extra}, line)


class ReasonSurge(ShareSurge):
    """The share of a step's episodes whose reason is one of ``reasons()`` rising by ``rise()``;
    ``what`` names those episodes in the finding's line."""

    what = ""

    def reasons(self) -> list[str]:
        raise NotImplementedError

    def share(self, record: StepRecord) -> float | None:
        return reason_share(record, self.reasons())

    def describe(self, run: list[float], level: float) -> tuple[dict[str, Any], str]:
        return {"reasons": self.reasons()}, (
            f"{self.what} (" + ", ".join(self.reasons()) + ") rose to "
            + " -> ".join(f"{v:.0%}" for v in run) + f" of episodes from {level:.0%}")


class InvalidSurge(ReasonSurge):
    """The share of a step's episodes whose reason is an invalid-output one (``invalid_reasons``)
    rising by ``invalid_rise``."""

    name, what = "invalid_surge", "invalid output"

    def rise(self) -> float:
        return self.cfg.invalid_rise

    def reasons(self) -> list[str]:
        return self.cfg.invalid_reasons


class BudgetSurge(ReasonSurge):
    """The share of a step's episodes that the harness ended on its turn or token budget
    (``budget_reasons``) rising by ``budget_rise``. A multi-turn policy that loses its way keeps
    calling tools and never submits, before (or without) its calls turning malformed, so this
    fires steps before tool_error_surge (docs/training.md; tests/test_guard.py keeps the
    sequence)."""

    name, what = "budget_surge", "episodes ended on a budget"

    def rise(self) -> float:
        return self.cfg.budget_rise

    def reasons(self) -> list[str]:
        return self.cfg.budget_reasons


def tool_error_share(record: StepRecord) -> float | None:
    """Tool errors per model turn over the step's episodes (None: no harness statistics)."""
    e = record.rollout.episode
    return e.tool_errors / e.turns if e is not None and e.turns > 0 else None


class ToolErrorSurge(ShareSurge):
    """The share of model turns that were tool errors rising by ``tool_error_rise``. A
    multi-turn policy that drifts into malformed calls keeps calling until its token budget ends
    the episode: its episodes still end "wrong_answer" or "token_budget", not with an invalid
    reason, and its entropy rises only a little (ledger, W384: tool errors 0.02 -> 0.11 -> 0.30
    -> 0.40 -> 0.55 of turns in four steps, entropy 0.009 -> 0.027), so neither invalid_surge
    nor entropy_surge sees it."""

    name = "tool_error_surge"

    def rise(self) -> float:
        return self.cfg.tool_error_rise

    def share(self, record: StepRecord) -> float | None:
        return tool_error_share(record)

    def describe(self, run: list[float], level: float) -> tuple[dict[str, Any], str]:
        return {}, ("tool errors rose to " + " -> ".join(f"{v:.0%}" for v in run)
                    + f" of model turns from {level:.0%}")


class EntropySurge:
    """Train entropy above ``entropy_factor`` × its recent median and above ``entropy_floor``."""

    name = "entropy_surge"

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.surge = Surge(cfg, lambda v, w, n: v > cfg.entropy_floor
                           and v > cfg.entropy_factor * statistics.median(w))

    def reset(self) -> None:
        self.surge.reset()

    def feed(self, record: StepRecord) -> Finding | None:
        if record.train is None:
            return None
        median = statistics.median(self.surge.window) if self.surge.window else 0.0
        run = self.surge.feed(record.train.entropy)
        if run is None:
            return None
        return Finding(self.name, {"entropy": run, "recent_median": median,
                                   "threshold": max(self.cfg.entropy_floor, self.cfg.entropy_factor * median)},
                       "entropy surged: " + " -> ".join(f"{v:.3f}" for v in run)
                       + f" against a recent median of {median:.3f}")


STEP_DETECTORS = (RewardCollapse, PassCrash, InvalidSurge, BudgetSurge, ToolErrorSurge, EntropySurge)
"""In the order an event names them when several fire on one step."""


# ---------------------------------------------------------------- deciding


class Guard:
    """The detectors of one run and the decision each finding gets. Pure: the Run acts."""

    def __init__(self, cfg: GuardConfig, heldout_tasks: int):
        self.cfg, self.heldout_tasks = cfg, heldout_tasks
        self.detectors = [d(cfg) for d in STEP_DETECTORS]

    @property
    def on(self) -> bool:
        return self.cfg.policy != "off"

    def after_step(self, record: StepRecord) -> list[Finding]:
        """Every step detector is fed (so each keeps its history); what fired, in order."""
        if not self.on:
            return []
        found = [d.feed(record) for d in self.detectors]
        return [f for f in found if f is not None]

    def after_eval(self, record: EvalRecord, best: BestCheckpoint | None) -> list[Finding]:
        if not self.on or best is None:
            return []
        found = heldout_drop(best, record, self.heldout_tasks, self.cfg)
        return [] if found is None else [found]

    def decide(self, restores: int) -> str:
        """The action for a finding after ``restores`` restores."""
        if self.cfg.policy == "restore":
            return "restore" if restores < self.cfg.max_restores else "stop"
        return self.cfg.policy

    def reset(self) -> None:
        for d in self.detectors:
            d.reset()


def event_message(step: int, findings: list[Finding], action: str, best: BestCheckpoint | None,
                  lr_scale: float, exhausted: bool = False) -> str:
    """``guard: <detector> at step N: <what it saw>; <what the run does>``."""
    first = findings[0]
    if action == "restore":
        did = (f"restoring the best checkpoint (step {best.step}, held-out pass@1 "
               f"{best.heldout_pass1:.3f}) with lr_scale {lr_scale:g}")
    elif action == "stop":
        did = "stopping RL" + (" (orchestrator.guard.max_restores reached)" if exhausted else "")
    else:
        did = "recorded only (orchestrator.guard.policy = 'log')"
    also = f" (also: {', '.join(f.detector for f in findings[1:])})" if len(findings) > 1 else ""
    return f"guard: {first.detector} at step {step}: {first.summary}{also}; {did}"


def evidence_of(findings: list[Finding]) -> dict[str, Any]:
    out = dict(findings[0].evidence)
    if len(findings) > 1:
        out["also"] = {f.detector: f.evidence for f in findings[1:]}
    return out


# ---------------------------------------------------------------- acting


def check_supported(cfg) -> None:
    """Refuse, at start-up, what the guard cannot do: restoring the sharded trainer."""
    if cfg.orchestrator.guard.policy == "restore" and cfg.sharding.processes > 1:
        raise OrchestratorError(
            "orchestrator.guard.policy = 'restore' is not supported with the sharded trainer "
            f"(sharding.processes = {cfg.sharding.processes}); set "
            "orchestrator.guard.policy = 'stop' (or 'log' / 'off'), or sharding.processes = 1")


def is_trainer_checkpoint(path: str | Path) -> bool:
    from tidal.trainer.checkpoint import TRAINER_STATE

    return (Path(path) / TRAINER_STATE).is_file()


def restore_weights(trainer, best: BestCheckpoint, fresh_optimizer: dict) -> None:
    """The best checkpoint's weights and optimizer state into ``trainer``; for the model RL
    began from (a Hugging Face folder without trainer state), its weights and a fresh optimizer
    (``fresh_optimizer``: the state_dict of the optimizer as built). The trainer's version and
    lr_scale are left to the caller."""
    from tidal.trainer.checkpoint import load_checkpoint, load_weights

    if is_trainer_checkpoint(best.path):
        load_checkpoint(best.path, trainer)
        return
    load_weights(best.path, trainer.model)
    masters = [p.detach().float().clone() for p in trainer.params] if trainer.separate_masters else None
    trainer.load_state_dict({"version": trainer.version, "lr_scale": trainer.lr_scale,
                             "optimizer": fresh_optimizer, "masters": masters})


def restore(trainer, best: BestCheckpoint, fresh_optimizer: dict, lr_factor: float) -> int:
    """Restore ``best`` into ``trainer`` with lr_scale × lr_factor; the version goes on counting
    (the restored weights become the next version: workers and weight sync need versions that
    only increase). Returns that version."""
    version, scale = trainer.version, trainer.lr_scale
    restore_weights(trainer, best, fresh_optimizer)
    trainer.version = version + 1
    trainer.lr_scale = scale * lr_factor
    return trainer.version
