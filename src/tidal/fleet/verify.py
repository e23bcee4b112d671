"""The orchestrator's checks of a rollout uploaded by a pool it does not trust.

A pool may be buggy, out of date or malicious; a signed batch (``auth``) only says which lease
sent it. Before anything of it is trained:

  check_result              every result, cheap: it answers the assignment it names, with
                            exactly the assigned tasks and groups, ``group_size`` samples each;
                            every generated token's policy version is one the worker could have
                            held ([assignment.min_version, newest published]); the per-token
                            lists line up; logprobs are finite and <= 0; the token count adds up.
  recompute_logprobs_check  a random fraction, expensive (as prime-rl checks untrusted rollouts
                            with TOPLOC): the model of each token's version scores the
                            trajectory's own tokens, and a recorded sampling logprob farther than
                            ``atol`` from that score marks the trajectory as fabricated or
                            corrupted. With the deterministic numerics (the engine's default) an
                            honest rollout scores bit for bit what it recorded, so any atol > 0
                            passes it; with "fast" numerics allow for the engine-trainer
                            mismatch (the ``train/mismatch_*`` metrics show its size).

The scoring is the trainer's own: ``collate`` lays tokens out, ``token_logprobs`` scores them,
and the forward is the trainer's (the engine's batch-invariant forward in the model's dtype, MoE
routing replayed from the recorded experts, the router's own choice where none was recorded).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from tidal.orchestrator.worker import Assignment, RolloutResult
from tidal.trainer.grpo import NO_REPLAY, TrainBatch, collate, token_logprobs
from tidal.trainer.trainer import DEFAULT_NUMERICS
from tidal.trajectory import Segment, Trajectory

MAX_PROBLEMS = 50
"""check_result reports at most this many problems (the last line counts the rest)."""


# ------------------------------------------------------------------ the cheap checks


def check_result(assignment: Assignment, result: RolloutResult, group_size: int,
                 max_version: int) -> list[str]:
    """What is wrong with ``result`` as the answer to ``assignment`` (empty: nothing found).

    group_size: samples per task (orchestrator.group_size); max_version: the newest policy
    version published when the result arrived (no honest token is newer)."""
    problems = _identity(assignment, result) + _groups(assignment, result.trajectories, group_size)
    for i, t in enumerate(result.trajectories):
        problems += _trajectory(i, t, assignment.min_version, max_version)
    generated = sum(t.num_generated_tokens for t in result.trajectories)
    if generated != result.generated_tokens:
        problems.append(f"the result counts {result.generated_tokens} generated tokens, its "
                        f"trajectories hold {generated}")
    return _capped(problems)


def _identity(a: Assignment, r: RolloutResult) -> list[str]:
    out = []
    if r.assignment_id != a.assignment_id:
        out.append(f"the result answers assignment {r.assignment_id}, not {a.assignment_id}")
    if r.step != a.step:
        out.append(f"the result is for step {r.step}, the assignment for step {a.step}")
    return out


def _groups(a: Assignment, trajs: list[Trajectory], group_size: int) -> list[str]:
    """The trajectories are group_size samples of each assigned (task, group), nothing else."""
    expected: Counter = Counter()
    assigned_groups: dict[str, list[int]] = {}
    for task, g in zip(a.tasks, a.group_ids):
        expected[(task.task_id, g)] += group_size
        assigned_groups.setdefault(task.task_id, []).append(g)
    got = Counter((t.task_id, t.group_id) for t in trajs)
    out = []
    for (tid, g), n in got.items():
        want = expected.get((tid, g), 0)
        if want == 0 and tid not in assigned_groups:
            out.append(f"task {_short(tid)} (group {g}) was never assigned: {n} trajectories")
        elif want == 0:
            out.append(f"task {_short(tid)} came back in group {g}; it was assigned group "
                       f"{assigned_groups[tid]}")
        elif n != want:
            out.append(f"task {_short(tid)} (group {g}): {n} trajectories, expected {want}")
    out += [f"task {_short(tid)} (group {g}): no trajectories, expected {want}"
            for (tid, g), want in expected.items() if (tid, g) not in got]
    return out


def _trajectory(i: int, t: Trajectory, lo: int, hi: int) -> list[str]:
    where = f"trajectory {i} (task {_short(t.task_id)})"
    out = [] if math.isfinite(t.reward) else [f"{where}: reward {t.reward} is not finite"]
    faults = _TokenFaults(where, lo, hi)
    for s, seg in enumerate(t.segments):
        shape = _segment_shape(seg)
        if seg.reward is not None and not math.isfinite(seg.reward):
            out.append(f"{where}, segment {s}: reward {seg.reward} is not finite")
        if shape:
            out.append(f"{where}, segment {s}: {shape}")
            continue
        for j, (lp, v, m) in enumerate(zip(seg.logprobs, seg.versions, seg.loss_mask)):
            faults.token(s, j, lp, v, m)
    return out + faults.report()


def _segment_shape(seg: Segment) -> str:
    """Why the segment's per-token lists do not line up ("" if they do)."""
    n = len(seg.completion_ids)
    if not len(seg.logprobs) == len(seg.versions) == len(seg.loss_mask) == n:
        return (f"{n} completion tokens, {len(seg.logprobs)} logprobs, {len(seg.versions)} "
                f"versions, {len(seg.loss_mask)} loss-mask entries")
    if seg.experts is not None and len(seg.experts) != n:
        return f"{n} completion tokens, {len(seg.experts)} expert entries"
    return ""


@dataclass
class _TokenFaults:
    """Bad tokens of one trajectory by kind: how many, and where the first one is."""

    where: str
    lo: int
    hi: int
    counts: Counter = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def token(self, s: int, j: int, lp: float, v: int, m: int) -> None:
        if m == 1:
            if not self.lo <= v <= self.hi:
                self._add("version", f"segment {s} token {j}, version {v}")
            if not -math.inf < lp <= 0.0:  # NaN fails too
                self._add("logprob", f"segment {s} token {j}, logprob {lp}")
        elif m == 0:
            if v != -1 or lp != 0.0:
                self._add("env", f"segment {s} token {j}, version {v}, logprob {lp}")
        else:
            self._add("mask", f"segment {s} token {j}, loss mask {m}")

    def _add(self, kind: str, at: str) -> None:
        self.counts[kind] += 1
        self.first.setdefault(kind, at)

    def report(self) -> list[str]:
        what = {"version": f"generated tokens with a version outside [{self.lo}, {self.hi}]",
                "logprob": "generated tokens whose logprob is not finite and <= 0",
                "env": "environment tokens (loss mask 0) with a version other than -1 or a "
                       "logprob other than 0",
                "mask": "loss-mask entries other than 0 and 1"}
        return [f"{self.where}: {self.counts[k]} {what[k]} (first: {self.first[k]})"
                for k in what if self.counts[k]]


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _capped(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return problems[: MAX_PROBLEMS - 1] + [f"... and {len(problems) - MAX_PROBLEMS + 1} more"]


# ------------------------------------------------------------------ the expensive check


@dataclass
class RecomputeReport:
    """What recomputing a sample of trajectories' logprobs found."""

    checked: int
    """Sampled trajectories with generated tokens that were compared (or found unscorable)."""
    mismatched: int
    """Of those, trajectories whose largest |recorded − recomputed| exceeds atol, or whose tokens
    or experts no model could score (ids outside the vocabulary, inconsistent experts)."""
    max_abs_diff: float
    """Largest |recorded − recomputed| over every compared token (inf for an unscorable one;
    0.0 when nothing was compared)."""
    mismatched_indices: list[int] = field(default_factory=list)
    """Positions in the given list of the mismatched trajectories."""
    compared_tokens: int = 0
    """Generated tokens compared."""
    unchecked_tokens: int = 0
    """Generated tokens of sampled trajectories whose version's model ``model_for`` no longer
    had (None): not compared, not counted as mismatched."""


ModelFor = Callable[[int], "nn.Module | None"]
"""``version -> the model of that policy version``, or None if it is no longer available."""


@torch.inference_mode()
def recompute_logprobs_check(model_for: ModelFor, trajectories: list[Trajectory],
                             temperature: float, rng: random.Random, fraction: float, atol: float,
                             numerics: str = DEFAULT_NUMERICS) -> RecomputeReport:
    """Score each trajectory with probability ``fraction`` (drawn from ``rng``: give it a seed
    the pools cannot know) and compare with the recorded sampling logprobs.

    model_for: tokens carry the version that produced them, so each version's tokens are scored
    by ``model_for(version)`` (the trainer's current model for the newest; kept snapshots for
    older ones; None skips them, counted as unchecked). temperature: the engine's sampling
    temperature. atol: the largest |diff| an honest token may show (see the module docstring).
    numerics: the engine's ``engine.numerics``."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if not atol >= 0.0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    report = RecomputeReport(0, 0, 0.0)
    for i, traj in enumerate(trajectories):
        if rng.random() >= fraction or traj.num_generated_tokens == 0:
            continue
        before = report.compared_tokens
        diff = _trajectory_diff(traj, model_for, temperature, numerics, report)
        if report.compared_tokens == before and diff == 0.0:
            continue  # no model for any of its versions: unchecked, not checked
        report.checked += 1
        report.max_abs_diff = max(report.max_abs_diff, diff)
        if diff > atol:
            report.mismatched += 1
            report.mismatched_indices.append(i)
    return report


def _trajectory_diff(traj: Trajectory, model_for: ModelFor, temperature: float, numerics: str,
                     report: RecomputeReport) -> float:
    """The largest |recorded − recomputed| logprob over the trajectory's generated tokens, one
    segment (row) at a time so memory stays that of one context window."""
    try:
        tb = collate([traj], pad_id=0, advantages=torch.zeros(1))
    except ValueError:  # some segments carry MoE experts and some do not: no engine does that
        return math.inf
    worst = 0.0
    for r in range(tb.num_rows):
        row = tb.rows(r, r + 1)
        trained = row.loss_mask > 0
        for v in sorted({int(x) for x in row.versions[trained]}):
            mine = trained & (row.versions == v)
            model = model_for(v)
            if model is None:
                report.unchecked_tokens += int(mine.sum())
                continue
            if not _scorable(model, row):
                return math.inf
            new = _logprobs(model, row, temperature, numerics)
            diff = (new.float() - row.old_logprobs)[mine].abs().nan_to_num(nan=math.inf)
            worst = max(worst, float(diff.max()))
            report.compared_tokens += int(mine.sum())
    return worst


def _scorable(model: nn.Module, row: TrainBatch) -> bool:
    """Token ids inside the vocabulary; recorded experts (if any) valid ids of an MoE model."""
    cfg = model.config
    ids = torch.cat([row.input_ids, row.targets], dim=1)
    if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        return False
    if row.experts is None or not getattr(cfg, "is_moe", False):
        return True
    return int(row.experts.min()) >= NO_REPLAY and int(row.experts.max()) < cfg.num_experts


def _logprobs(model: nn.Module, row: TrainBatch, temperature: float, numerics: str) -> torch.Tensor:
    """The trainer's scores of ``row``'s targets [1, T] (Trainer._forward, _replay_experts)."""
    weight = next(model.parameters())
    row = row.to(weight.device)
    kw = {"deterministic": True, "dtype": weight.dtype} if numerics == "deterministic" else {}
    replay = row.experts if getattr(model.config, "is_moe", False) else None
    if replay is not None and bool((replay == NO_REPLAY).any()):
        _, own = model(row.input_ids, return_experts=True, **kw)
        replay = torch.where(replay == NO_REPLAY, own, replay)
    logits = model(row.input_ids, replay_experts=replay, **kw)
    return token_logprobs(logits, row.targets, temperature).cpu()
