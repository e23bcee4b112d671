"""The guard (tidal.orchestrator.guard): each detector fires on issue 17's collapse and stays
quiet on a noisy healthy run; a real tiny run made to collapse is restored (or stopped), and the
best checkpoint survives a resume."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from typing import ClassVar

import pytest
import torch
from test_orchestrator import cfg_with, ckpt, records  # noqa: F401  (the module-scoped checkpoint)

from tidal.orchestrator import guard, loop, planning
from tidal.orchestrator.config import GuardConfig
from tidal.orchestrator.records import (
    BestCheckpoint,
    EpisodeMeans,
    EvalRecord,
    RolloutMetrics,
    RunState,
    StepRecord,
)
from tidal.orchestrator.worker import RolloutWorker
from tidal.trainer.stats import MismatchStats, TrainStats

EPISODES = 64
"""Episodes per step (8 tasks x 8 samples, the default recipe)."""


def train_stats(entropy: float, adv_abs_mean: float) -> TrainStats:
    return TrainStats(loss=0.1, pg_loss=0.1, kl=0.0, clip_frac=0.0, ratio_mean=1.0, ratio_max=1.0,
                      entropy=entropy, tokens=100.0, replay_filled_positions=0.0,
                      mismatch=MismatchStats(100.0, 1.0, 0.0, 0.0, 0.0), grad_norm=1.0, lr=3e-4,
                      sequences=64.0, adv_mean=0.0, adv_abs_mean=adv_abs_mean, step_time_s=1.0,
                      staleness_max=1.0)


def step(n: int, pass_rate: float, entropy: float, invalid: float, flat: bool = False,
         episodes: int = EPISODES) -> StepRecord:
    """Step ``n`` of ``episodes`` episodes: ``pass_rate`` solved (reward 1), ``invalid`` of them
    a syntax error, the rest wrong answers; ``flat``: every reward 0, every advantage 0."""
    passed = round(pass_rate * episodes)
    bad = min(round(invalid * episodes), episodes - passed)
    reasons = {"pass": passed, "syntax_error": bad, "wrong_answer": episodes - passed - bad}
    p = passed / episodes
    std = 0.0 if flat or p in (0.0, 1.0) else math.sqrt(p * (1 - p) * episodes / (episodes - 1))
    rollout = RolloutMetrics(p, std, p, {k: v for k, v in reasons.items() if v}, None)
    return StepRecord(step=n, version=n, wall_s=float(n), rollout=rollout, trajectories=episodes,
                      dropped_stale=0, kept_stale=0, staleness_hist={1: episodes}, staleness_max=1,
                      gen_tokens_per_s=1.0, train_tokens_per_s=1.0, generate_s=1.0, grade_s=1.0,
                      train_s=1.0, publish_s=0.0, worker_busy_fraction=0.5, worker_failures=0,
                      step_time_s=1.0, train=train_stats(entropy, 0.0 if flat or std == 0 else 0.4))


ONSET = 141
"""The first step of issue 17's collapse."""


def issue_example() -> list[StepRecord]:
    """Issue 17's run: pass rate rising to 0.97 as entropy falls to 0.006 (step 140), then
    within 8 steps syntax errors (pass rate 0.48 -> 0.08 -> 0.00, entropy 0.02 -> 0.33), then
    from step 149 every reward 0 and every advantage 0."""
    rng = random.Random(17)
    out = []
    for n in range(1, ONSET):
        p = 0.3 + 0.67 * (n / 140)
        out.append(step(n, min(1.0, max(0.0, p + rng.gauss(0, 0.05 * (1 - p) + 0.01))),
                        0.5 * math.exp(-n / 31.5) * math.exp(rng.gauss(0, 0.1)), 0.03 * rng.random()))
    falling = [(0.95, 0.008, 0.02), (0.9, 0.01, 0.05), (0.8, 0.02, 0.15), (0.48, 0.05, 0.45),
               (0.3, 0.12, 0.65), (0.08, 0.25, 0.9), (0.02, 0.33, 0.97), (0.0, 0.3, 1.0)]
    out += [step(ONSET + i, p, e, b) for i, (p, e, b) in enumerate(falling)]
    out += [step(n, 0.0, 0.3, 1.0, flat=True) for n in range(ONSET + len(falling), 241)]
    return out


def healthy(seed: int, steps: int = 1000, tasks: int = 8, samples: int = 8) -> list[StepRecord]:
    """A noisy healthy run: ``tasks`` tasks of spread-out difficulty x ``samples`` samples a
    step (with 8 x 8 the pass rate jumps by +-0.15 between steps), entropy falling slowly with
    30% noise, 8% syntax errors."""
    rng = random.Random(seed)
    out, n_eps = [], tasks * samples
    for n in range(1, steps + 1):
        trend = 0.3 + 0.4 * n / steps
        rates = [min(1.0, max(0.0, rng.gauss(trend, 0.25))) for _ in range(tasks)]
        p = sum(rng.random() < r for r in rates for _ in range(samples)) / n_eps
        invalid = sum(rng.random() < 0.08 for _ in range(n_eps)) / n_eps
        out.append(step(n, p, 0.5 * math.exp(-n / 300) * math.exp(rng.gauss(0, 0.3)), invalid,
                        episodes=n_eps))
    return out


def first_firing(detector, steps: list[StepRecord]) -> int | None:
    for r in steps:
        if detector.feed(r) is not None:
            return r.step
    return None


@pytest.mark.parametrize("cls,within", [(guard.PassCrash, 6), (guard.InvalidSurge, 6),
                                        (guard.EntropySurge, 7), (guard.RewardCollapse, 11)])
def test_each_step_detector_catches_the_issue_collapse_within_a_few_steps(cls, within):
    fired = first_firing(cls(GuardConfig()), issue_example())
    assert fired is not None and ONSET <= fired < ONSET + within, fired


@pytest.mark.parametrize("seed", range(5))
def test_step_detectors_stay_quiet_on_a_noisy_healthy_run(seed):
    run = healthy(seed)
    jumps = [abs(a.rollout.pass_rate - b.rollout.pass_rate) for a, b in itertools.pairwise(run)]
    assert statistics.fmean(jumps) > 0.1 and max(jumps) > 0.3  # as noisy as the issue says, or more
    g = guard.Guard(GuardConfig(), heldout_tasks=256)
    assert [(r.step, f) for r in run if (f := g.after_step(r))] == []


@pytest.mark.parametrize("seed", range(5))
def test_small_steps_are_judged_by_their_noise(seed):
    """4 tasks x 2 samples a step (the test runs' size): a pass rate that jumps by 0.5 and whole
    steps without a pass are noise there, not a crash or a collapse; a collapse is still caught."""
    run = healthy(seed, tasks=4, samples=2)
    assert sum(r.rollout.pass_rate == 0 for r in run) > 10  # all-zero steps happen by chance
    g = guard.Guard(GuardConfig(), heldout_tasks=4)
    assert [(r.step, f) for r in run if (f := g.after_step(r))] == []
    dead = [step(n, 0.0, 0.5, 1.0, flat=True, episodes=8) for n in range(1001, 1020)]
    assert first_firing(guard.RewardCollapse(GuardConfig()), run[-20:] + dead) is not None


def test_the_guard_names_the_first_detector_and_the_others_that_fired():
    g = guard.Guard(GuardConfig(), heldout_tasks=256)
    fired = next((r.step, f) for r in issue_example() if (f := g.after_step(r)))
    n, findings = fired
    assert n == 145 and [f.detector for f in findings] == ["pass_crash", "invalid_surge"]
    assert findings[0].evidence["pass_rate"] == [0.484375, 0.296875]
    evidence = guard.evidence_of(findings)
    assert set(evidence["also"]) == {"invalid_surge"}
    message = guard.event_message(n, findings, "stop", None, 1.0)
    assert message.startswith("guard: pass_crash at step 145: training pass rate crashed: 0.48 -> 0.30")
    assert "also: invalid_surge" in message and "stopping RL" in message


LEDGER_W384_HEALTHY = [(6, 0.003), (9, 0.0023), (2, 0.0023), (2, 0.0032), (4, 0.0031), (14, 0.0012),
                       (8, 0.0019), (13, 0.0012), (13, 0.0009), (8, 0.0023), (4, 0.0016), (7, 0.0019),
                       (13, 0.0007), (12, 0.0008), (0, 0.003), (10, 0.0019), (4, 0.0022), (3, 0.0034),
                       (6, 0.0029)]
"""A measured healthy run: the first 19 RL steps of `tidal bench horizon` (ledger, W384, summary
check, 4 tasks x 4 episodes a step, from a model at held-out 0.344 that still had it after RL):
per step the episodes solved of 16 and the train entropy. A near-deterministic policy solves a
task in all of its group or in none, so the step's pass rate moves with the tasks it drew."""


def test_a_pass_rate_that_moves_with_the_tasks_drawn_is_not_a_crash():
    run = [step(n, passed / 16, entropy, 0.0, episodes=16)
           for n, (passed, entropy) in enumerate(LEDGER_W384_HEALTHY, start=1)]
    # Against the binomial error over 16 episodes alone, steps 17-18 (0.25, 0.19 against a
    # recent mean of 0.64) are a crash: that restored this run's step-0 model at step 18.
    window = [r.rollout.pass_rate for r in run[5:16] if r.step != 15]
    level = statistics.fmean(window)
    assert all(r.rollout.pass_rate < level - guard.binomial_noise(level, 16, 3.0) for r in run[16:18])
    assert first_firing(guard.PassCrash(GuardConfig()), run) is None
    g = guard.Guard(GuardConfig(), heldout_tasks=32)
    assert [(r.step, f) for r in run if (f := g.after_step(r))] == []


LEDGER_W384 = [
    (2.875, 53.69, 0.0083, {"syntax_error": 1, "token_budget": 1, "wrong_answer": 14}),
    (0.3125, 49.06, 0.0107, {"pass": 1, "syntax_error": 1, "wrong_answer": 14}),
    (0.125, 48.88, 0.0089, {"wrong_answer": 16}), (0.125, 48.94, 0.0107, {"wrong_answer": 16}),
    (0.25, 48.56, 0.0062, {"pass": 1, "wrong_answer": 15}), (0.4375, 48.94, 0.0092, {"pass": 4, "wrong_answer": 12}),
    (0.25, 48.69, 0.0093, {"pass": 3, "wrong_answer": 13}),
    (0.0625, 48.31, 0.0106, {"pass": 4, "syntax_error": 1, "wrong_answer": 11}),
    (0.25, 48.63, 0.008, {"runtime_error": 1, "wrong_answer": 15}), (0.1875, 48.31, 0.0063, {"wrong_answer": 16}),
    (0.25, 48.75, 0.0044, {"pass": 1, "syntax_error": 1, "wrong_answer": 14}), (0.0, 48.0, 0.0089, {"wrong_answer": 16}),
    (1.4375, 52.31, 0.006, {"pass": 3, "token_budget": 1, "wrong_answer": 12}),
    (0.0625, 48.38, 0.005, {"pass": 2, "wrong_answer": 14}), (0.3125, 48.56, 0.0079, {"wrong_answer": 16}),
    (0.5625, 48.81, 0.0139, {"syntax_error": 1, "wrong_answer": 15}), (1.0, 49.19, 0.0087, {"wrong_answer": 16}),
    (6.1875, 54.75, 0.0132, {"pass": 3, "wrong_answer": 13}), (21.06, 69.19, 0.0152, {"wrong_answer": 16}),
    (31.5, 79.31, 0.0268, {"syntax_error": 2, "token_budget": 2, "wrong_answer": 12}),
    (49.81, 91.25, 0.0257, {"token_budget": 10, "wrong_answer": 6}),
    (46.81, 89.0, 0.0233, {"pass": 2, "token_budget": 9, "wrong_answer": 5}),
]
"""A measured multi-turn collapse: the first 22 RL steps of `tidal bench horizon` (ledger, W384,
summary check, 16 episodes a step): per step the tool errors and model turns per episode, the
train entropy and the episodes' reasons. From step 18 the policy made ever more malformed calls
(tool errors 0.02 -> 0.11 -> 0.30 -> 0.40 -> 0.55 of turns) until the token budget ended its
episodes."""


def multi_turn_step(n: int, tool_errors: float, turns: float, entropy: float,
                    reasons: dict[str, int]) -> StepRecord:
    episodes = sum(reasons.values())
    p = reasons.get("pass", 0) / episodes
    r = step(n, p, entropy, 0.0, episodes=episodes)
    r.rollout = RolloutMetrics(p, r.rollout.reward_std, p, reasons,
                               EpisodeMeans(turns, 14.0, 11.0 * turns / 48, 19.0, tool_errors))
    return r


def ledger_collapse() -> list[StepRecord]:
    return [multi_turn_step(n, *row) for n, row in enumerate(LEDGER_W384, start=1)]


def test_a_tool_error_surge_is_caught_where_no_other_detector_sees_it():
    run = ledger_collapse()
    assert first_firing(guard.ToolErrorSurge(GuardConfig()), run) == 20  # 0.30 at 19, 0.40 at 20
    for quiet in (guard.PassCrash, guard.InvalidSurge, guard.EntropySurge, guard.RewardCollapse):
        assert first_firing(quiet(GuardConfig()), run) is None, quiet
    g = guard.Guard(GuardConfig(), heldout_tasks=32)
    n, findings = next((r.step, f) for r in run if (f := g.after_step(r)))
    assert n == 20 and [f.detector for f in findings] == ["tool_error_surge"]
    assert guard.event_message(n, findings, "stop", None, 1.0).startswith(
        "guard: tool_error_surge at step 20: tool errors rose to 30% -> 40% of model turns from 2%")


@pytest.mark.parametrize("seed", range(5))
def test_tool_errors_of_a_healthy_multi_turn_run_are_noise(seed):
    """16 episodes of ~48 turns a step; one episode in ten has a burst of 1-30 malformed calls
    (a step's share then moves between 0 and 15% of turns): quiet for 500 steps."""
    rng = random.Random(seed)
    detector = guard.ToolErrorSurge(GuardConfig())
    for n in range(1, 501):
        errors = [rng.randint(1, 30) if rng.random() < 0.1 else 0 for _ in range(16)]
        turns = [48 + e for e in errors]
        row = (sum(errors) / 16, sum(turns) / 16, 0.008, {"pass": 3, "wrong_answer": 13})
        assert detector.feed(multi_turn_step(n, *row)) is None, n


LEDGER_W384_LR1E3 = [
    (0.0, 48.0, 0.003, {"pass": 6, "wrong_answer": 10}), (0.0, 48.5, 0.002, {"pass": 9, "wrong_answer": 7}),
    (0.12, 49.0, 0.0026, {"pass": 2, "wrong_answer": 14}),
    (0.0, 48.69, 0.0022, {"pass": 3, "syntax_error": 1, "wrong_answer": 12}),
    (1.5, 49.81, 0.0037, {"pass": 3, "syntax_error": 1, "wrong_answer": 12}),
    (2.88, 54.88, 0.0038, {"pass": 7, "syntax_error": 1, "token_budget": 1, "wrong_answer": 7}),
    (6.75, 64.06, 0.0068, {"pass": 2, "syntax_error": 2, "token_budget": 3, "wrong_answer": 9}),
    (2.69, 53.25, 0.0024, {"pass": 12, "token_budget": 2, "wrong_answer": 2}),
    (0.19, 48.62, 0.0024, {"pass": 8, "wrong_answer": 8}),
    (0.12, 48.5, 0.0029, {"pass": 8, "syntax_error": 1, "wrong_answer": 7}),
    (0.56, 49.56, 0.0049, {"syntax_error": 2, "wrong_answer": 14}), (0.06, 48.06, 0.0025, {"pass": 6, "wrong_answer": 10}),
    (0.06, 48.62, 0.0016, {"pass": 6, "wrong_answer": 10}),
    (0.06, 48.62, 0.0023, {"pass": 11, "syntax_error": 1, "wrong_answer": 4}),
    (0.12, 48.19, 0.0025, {"wrong_answer": 16}), (0.06, 48.06, 0.0026, {"pass": 7, "wrong_answer": 9}),
    (0.0, 48.0, 0.0023, {"pass": 5, "wrong_answer": 11}),
    (0.0, 48.69, 0.0031, {"pass": 3, "runtime_error": 1, "wrong_answer": 12}),
    (0.06, 46.38, 0.0027, {"pass": 8, "wrong_answer": 8}), (0.38, 49.38, 0.0051, {"pass": 4, "wrong_answer": 12}),
    (0.06, 48.5, 0.0026, {"pass": 5, "wrong_answer": 11}), (0.12, 48.62, 0.0023, {"pass": 8, "wrong_answer": 8}),
    (0.38, 48.38, 0.0033, {"wrong_answer": 16}), (0.06, 48.38, 0.0018, {"pass": 7, "wrong_answer": 9}),
    (0.31, 48.69, 0.002, {"pass": 7, "wrong_answer": 9}), (1.0, 51.19, 0.0041, {"pass": 4, "wrong_answer": 12}),
    (5.06, 90.0, 0.0062, {"pass": 3, "token_budget": 3, "turn_budget": 8, "wrong_answer": 2}),
    (16.81, 78.75, 0.1123, {"token_budget": 10, "turn_budget": 2, "wrong_answer": 4}),
    (17.31, 97.75, 0.0124, {"token_budget": 10, "turn_budget": 5, "wrong_answer": 1}),
    (41.88, 68.19, 0.0308, {"token_budget": 15, "wrong_answer": 1}),
    (55.94, 55.94, 0.0216, {"token_budget": 16}),
]
"""A second measured multi-turn collapse: the first 31 RL steps of `tidal bench horizon` (ledger,
W384, summary check, lr 1e-3, from a model at held-out 0.344). From step 27 the episodes stopped
finishing (turns per episode 51 -> 90, 11 of 16 ended on the turn or token budget) while tool
errors were still 6% of turns; at step 31 every call was malformed. The guard of the time fired
tool_error_surge at step 31 and restored the step-0 model."""


def test_episodes_that_stop_finishing_are_caught_before_their_calls_turn_malformed():
    run = [multi_turn_step(n, *row) for n, row in enumerate(LEDGER_W384_LR1E3, start=1)]
    assert first_firing(guard.BudgetSurge(GuardConfig()), run) == 28  # 11/16, then 12/16
    assert first_firing(guard.ToolErrorSurge(GuardConfig()), run) == 31
    g = guard.Guard(GuardConfig(), heldout_tasks=32)
    n, findings = next((r.step, f) for r in run if (f := g.after_step(r)))
    assert n == 28 and findings[0].detector == "budget_surge"
    assert guard.event_message(n, findings, "stop", None, 1.0).startswith(
        "guard: budget_surge at step 28: episodes ended on a budget (turn_budget, token_budget) "
        "rose to 69% -> 75% of episodes from")


@pytest.mark.parametrize("seed", range(5))
def test_a_few_episodes_on_their_budget_are_noise(seed):
    """16 episodes a step, each ending on a budget with chance 0.06 (the healthy steps above: 6
    of 400 episodes): quiet for 500 steps."""
    rng = random.Random(seed)
    detector = guard.BudgetSurge(GuardConfig())
    for n in range(1, 501):
        budget = sum(rng.random() < 0.06 for _ in range(16))
        reasons = {"token_budget": budget, "wrong_answer": 16 - budget}
        assert detector.feed(multi_turn_step(n, 0.1, 48.0, 0.003, reasons)) is None, n


def test_reward_collapse_needs_signal_before_and_is_not_saturation():
    detector = guard.RewardCollapse(GuardConfig())
    never_solved = [step(n, 0.0, 0.5, 0.0) for n in range(1, 20)]
    assert first_firing(detector, never_solved) is None  # nothing to learn from, not a collapse
    all_solved = [step(n, 0.5, 0.5, 0.0) for n in range(1, 4)] + [step(n, 1.0, 0.5, 0.0) for n in range(4, 20)]
    assert first_firing(guard.RewardCollapse(GuardConfig()), all_solved) is None
    collapsed = [step(n, 0.5, 0.5, 0.0) for n in range(1, 4)] + [step(n, 0.0, 0.5, 0.0, True) for n in range(4, 20)]
    assert first_firing(guard.RewardCollapse(GuardConfig()), collapsed) == 6  # 3 dead steps: 4, 5, 6


def test_a_single_bad_step_is_noise_not_a_crash():
    run = [step(n, 0.5, 0.3, 0.05) for n in range(1, 11)] + [step(11, 0.0, 0.9, 0.9)]
    run += [step(n, 0.5, 0.3, 0.05) for n in range(12, 30)]
    g = guard.Guard(GuardConfig(), heldout_tasks=256)
    assert [r.step for r in run if g.after_step(r)] == []


def evals(values: list[tuple[int, float]]) -> list[EvalRecord]:
    return [EvalRecord(f"step {s}", s, s, float(s), p, {}, {}) for s, p in values]


def test_heldout_drop_catches_the_issue_evaluations_and_not_noise():
    cfg = GuardConfig()
    best = BestCheckpoint(0, 0.0, "init", 0)
    fired = []
    for ev in evals([(0, 0.100), (40, 0.105), (80, 0.123), (120, 0.150), (160, 0.000), (200, 0.0)]):
        if (f := guard.heldout_drop(best, ev, 256, cfg)) is not None:
            fired.append((ev.step, f.evidence["best_step"]))
        elif ev.heldout_pass1 > best.heldout_pass1:
            best = BestCheckpoint(ev.step, ev.heldout_pass1, "x", ev.step)
    assert fired == [(160, 120), (200, 120)]
    # noise: 2 standard errors of 0.5 over 256 tasks is 6.25 points
    half = BestCheckpoint(40, 0.5, "x", 40)
    assert guard.heldout_drop(half, evals([(80, 0.45)])[0], 256, cfg) is None
    assert guard.heldout_drop(half, evals([(80, 0.43)])[0], 256, cfg) is not None
    assert guard.heldout_noise(0.5, 256) == pytest.approx(1 / 32)


def test_policies_decide_and_off_runs_nothing():
    assert guard.Guard(GuardConfig(max_restores=2), 4).decide(1) == "restore"
    assert guard.Guard(GuardConfig(max_restores=2), 4).decide(2) == "stop"
    assert guard.Guard(GuardConfig(policy="log"), 4).decide(9) == "log"
    off = guard.Guard(GuardConfig(policy="off"), 4)
    assert [off.after_step(r) for r in issue_example()] == [[]] * 240


def test_guard_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="min_history .* exceeds .*window"):
        GuardConfig(min_history=12, window=10)
    with pytest.raises(ValueError, match="policy"):
        cfg_with("--orchestrator.guard.policy", "panic")


def test_run_state_keeps_the_best_and_reads_older_checkpoints():
    state = RunState(step=4, best=BestCheckpoint(2, 0.5, "/r/checkpoints/step_000002", 2), restores=1,
                     restored_version=5)
    assert RunState.from_checkpoint(state.to_checkpoint()) == state
    old = {k: v for k, v in RunState(step=3).to_checkpoint().items()
           if k not in ("best", "restores", "restored_version", "guard_events")}
    assert RunState.from_checkpoint(old) == RunState(step=3)


def test_gate_drops_what_a_thrown_away_policy_sampled():
    from test_orchestrator import traj

    state = RunState()
    kept, _ = planning.staleness_gate([traj(0, [6, 7]), traj(0, [7, 7]), traj(1, [5])], trainer_version=7,
                                      max_staleness=2, state=state, keep_stale=True, floor=7)
    assert [t.min_version for t in kept] == [7] and state.dropped_stale == 2


def test_restore_with_the_sharded_trainer_is_refused_at_start_up(tmp_path, ckpt):  # noqa: F811
    from tidal.orchestrator.pool import OrchestratorError

    cfg = cfg_with("--orchestrator.steps", "1", "--sharding.processes", "2")
    with pytest.raises(OrchestratorError, match="guard.policy = 'stop'"):
        loop.run_rl(cfg, tmp_path, ckpt, progress=False)


# ---------------------------------------------------------------- a real tiny run


COLLAPSE = {3, 4}
"""Step indices (0-based, as Assignment.step) whose episodes the worker turns into syntax errors."""


class CollapsingWorker(RolloutWorker):
    """Half of every group solves its task (reward 1, the other half a wrong answer), except in
    ``steps``: every episode a syntax error with reward 0. What the tiny model wrote is trained
    as usual."""

    steps: ClassVar[set[int]] = COLLAPSE

    def rollout(self, assignment):
        res = super().rollout(assignment)
        for i, t in enumerate(res.trajectories):
            if assignment.step in self.steps:
                t.reward, t.solved, t.reason = 0.0, False, "syntax_error"
            else:
                t.reward, t.solved, t.reason = (1.0, True, "pass") if i % 2 == 0 else (0.0, False, "wrong_answer")
        return res


class Forever(CollapsingWorker):
    steps: ClassVar[set[int]] = set(range(3, 1000))


SMALL = ("--orchestrator.guard.window", "3", "--orchestrator.guard.min_history", "2")
"""Surge detectors that judge after 2 steps, so a collapse at step 4 is caught at step 5."""


@pytest.fixture
def scripted_evals(monkeypatch):
    """Held-out pass@1 by evaluation, in order (the rest of heldout_pass1's result is real)."""
    values: list[float] = []

    def fake(*args, **kwargs):
        result = real(*args, **kwargs)
        return {**result, "pass1": values.pop(0)}

    real = loop.heldout_pass1
    monkeypatch.setattr(loop, "heldout_pass1", fake)
    return values


@pytest.fixture
def restores(monkeypatch):
    """Each restore's weights right after it, and the best checkpoint it restored."""
    seen = []

    def spy(trainer, best, fresh_optimizer):
        real(trainer, best, fresh_optimizer)
        seen.append((best, {k: v.clone() for k, v in trainer.model.state_dict().items()}))

    real = guard.restore_weights
    monkeypatch.setattr(guard, "restore_weights", spy)
    return seen


def test_a_collapse_is_caught_and_the_best_checkpoint_restored(tmp_path, ckpt, scripted_evals, restores):  # noqa: F811
    from tidal.model import from_pretrained
    from tidal.trainer.schedule import lr_at

    scripted_evals += [0.1, 0.5, 0.25, 0.5, 0.5]  # before, steps 2, 4, 6, after
    cfg = cfg_with("--orchestrator.steps", "8", "--orchestrator.eval_every", "2", *SMALL)
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False, worker_cls=CollapsingWorker)
    (event,) = records(tmp_path, "guard")
    # 8 episodes a step: a pass rate of 0.5 falling to 0 is within its noise, 100% syntax errors not
    assert event["step"] == 5 and event["detector"] == "invalid_surge" and event["action"] == "restore"
    assert event["restored_step"] == 2 and event["lr_scale"] == 0.5
    assert event["evidence"]["share"] == [1.0, 1.0] and "also" not in event["evidence"]
    (best, weights), = restores
    assert best.step == 2 and best.path == str(tmp_path / "checkpoints" / "step_000002")
    saved = from_pretrained(best.path, dtype=torch.float32).state_dict()
    assert weights.keys() == saved.keys() and all(torch.equal(weights[k], saved[k]) for k in saved)
    steps = records(tmp_path, "step")
    versions = [s["version"] for s in steps]  # never back: a step that trained nothing keeps it
    assert versions == sorted(versions) and event["version"] == 6  # version 5, restored as 6
    assert all(s["version"] >= 6 for s in steps if s["step"] > 5)
    trained = [s["version"] for s in steps if "train/lr" in s]
    assert trained == sorted(set(trained))
    decay = planning.with_decay(cfg.trainer, 8)
    after = [s for s in steps if s["step"] > 5 and "train/lr" in s]
    assert after and all(s["train/lr"] == pytest.approx(0.5 * lr_at(decay, s["version"] - 1)) for s in after)
    assert summary.best_step == 2 and summary.heldout_pass1_best == 0.5  # the first of equal bests
    assert summary.guard["restores"] == 1 and summary.guard["stopped"] is None
    assert summary.guard["events"][0]["detector"] == "invalid_surge" and summary.steps == 8


def test_policy_stop_ends_rl_and_the_summary_names_the_best(tmp_path, ckpt, scripted_evals, capsys):  # noqa: F811
    from tidal.orchestrator.report import print_summary

    scripted_evals += [0.1, 0.5, 0.25, 0.2]  # before, steps 2, 4, after
    cfg = cfg_with("--orchestrator.steps", "20", "--orchestrator.eval_every", "2",
                   "--orchestrator.guard.policy", "stop", *SMALL)
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False, worker_cls=Forever)
    err = capsys.readouterr().err
    assert "guard: invalid_surge at step 5: invalid output (syntax_error, no_result) rose to 100% -> 100%" in err
    assert "stopping RL" in err
    assert summary.steps == 5 and summary.guard["stopped"].startswith("guard: invalid_surge at step 5")
    assert summary.best_step == 2 and summary.best_checkpoint == str(tmp_path / "checkpoints" / "step_000002")
    assert (tmp_path / "checkpoints" / "step_000002" / "COMPLETE").is_file()
    assert [e["label"] for e in records(tmp_path, "eval")][-1] == "after"
    print_summary(summary, tmp_path / "summary.json")
    out = capsys.readouterr().out
    assert "held-out pass@1, best checkpoint (step 2)" in out and "final checkpoint (step 5)" in out
    assert "stopped by the guard: guard: invalid_surge" in out


def test_after_max_restores_the_guard_stops(tmp_path, ckpt):  # noqa: F811
    cfg = cfg_with("--orchestrator.steps", "30", "--orchestrator.guard.max_restores", "1", *SMALL)
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False, worker_cls=Forever)
    actions = [e["action"] for e in records(tmp_path, "guard")]
    assert actions == ["restore", "stop"] and summary.steps < 30
    assert "max_restores reached" in summary.guard["stopped"]
    assert records(tmp_path, "guard")[0]["restored_step"] == 0  # no evaluation beat the start


def test_resume_keeps_the_best(tmp_path, ckpt, scripted_evals):  # noqa: F811
    scripted_evals += [0.1, 0.5, 0.25, 0.2]  # before, step 2, after (step 4); resumed: after
    first = cfg_with("--orchestrator.steps", "4", "--orchestrator.eval_every", "2")
    loop.run_rl(first, tmp_path, ckpt, progress=False)
    summary = loop.run_rl(cfg_with("--orchestrator.steps", "6", "--orchestrator.eval_every", "2"),
                          tmp_path, ckpt, progress=False, resume=True)
    assert scripted_evals == []
    assert summary.best_step == 2 and summary.heldout_pass1_best == 0.5
    assert summary.best_checkpoint == str(tmp_path / "checkpoints" / "step_000002")


class Healthy(CollapsingWorker):
    steps: ClassVar[set[int]] = set()


def test_a_heldout_drop_restores_at_its_evaluation(tmp_path, ckpt, scripted_evals, restores):  # noqa: F811
    scripted_evals += [0.1, 0.9, 0.0, 0.9]  # before, steps 2, 4, after (step 6)
    cfg = cfg_with("--orchestrator.steps", "6", "--orchestrator.eval_every", "2", *SMALL)
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False, worker_cls=Healthy)
    (event,) = records(tmp_path, "guard")
    assert (event["step"], event["detector"], event["restored_step"]) == (4, "heldout_drop", 2)
    assert event["evidence"]["best"] == 0.9 and event["evidence"]["threshold"] == pytest.approx(0.3)
    assert [best.step for best, _ in restores] == [2]
    assert summary.best_step == 2 and summary.guard["restores"] == 1
