"""The names a run writes to metrics.jsonl and summary.json, pinned.

Readers of finished runs (the report, plots, TensorBoard, resume's trim_metrics, users' scripts)
find fields by name, so renaming one is a breaking change: these lists were taken from a run of
the code before the records were typed (string-keyed dicts), and a renamed, lost or new key
fails here until the list (and every reader) is changed on purpose.
"""

import functools
import json

import pytest
from test_orchestrator import TINY, ckpt  # noqa: F401  (the module-scoped checkpoint fixture)

from tidal.cli import main
from tidal.orchestrator import loop
from tidal.orchestrator.records import (
    BestCheckpoint,
    EpisodeMeans,
    EvalRecord,
    GuardEvent,
    RolloutMetrics,
    RunState,
    RunSummary,
    StepRecord,
    WorkerFailure,
    WorkerSpan,
)
from tidal.orchestrator.worker import RolloutWorker
from tidal.trainer.stats import MismatchStats, OffPolicyStats, RoutingStats, TrainStats

TRAIN_KEYS = {
    "adv_abs_mean", "adv_mean", "clip_frac", "entropy", "grad_norm", "kl", "loss", "lr",
    "mismatch_bitwise_equal_fraction", "mismatch_kl_k3", "mismatch_max_abs_logprob_diff",
    "mismatch_mean_abs_logprob_diff", "mismatch_tokens", "pg_loss", "ratio_max", "ratio_mean",
    "replay_filled_positions", "sequences", "staleness_max", "step_time_s", "tokens",
}
"""Trainer.step's statistics for a dense model without an off-policy correction."""
TRAIN_OFF_POLICY_KEYS = {"is_masked_tokens", "is_truncated_tokens", "is_weight_mean"}
TRAIN_MOE_KEYS = {"routing_flip_rate", "routing_tokens_with_flip_fraction", "routing_trained_flip_rate"}
"""Plus ``routing_flip_rate_layer<i>`` for each layer."""
EPISODE_KEYS = {"episode/effective_horizon", "episode/resets", "episode/summary_tokens_mean",
                "episode/tool_errors", "episode/turns"}
STEP_KEYS = {
    "dropped_stale", "gen_tokens_per_s", "generate_s", "grade_s", "kept_stale", "kind", "pass_rate",
    "publish_s", "reasons", "reward_mean", "reward_std", "staleness_hist", "staleness_max", "step",
    "step_time_s", "train_s", "train_tokens_per_s", "trajectories", "version", "wall_s",
    "worker_busy_fraction", "worker_failures",
}
"""A step record without its episode/ and train/ keys (a step that trained nothing has none)."""
EVAL_KEYS = {"heldout_pass1", "kind", "label", "pass1_by_level", "reasons", "step", "version", "wall_s"}
"""An eval record without its episode/ keys (as written before evaluations kept them)."""
EVAL_EPISODE_KEYS = EPISODE_KEYS | {"episode/effective_horizon_min"}
"""Added to every eval record since: the held-out episodes' harness statistics (as a step's),
and the shortest effective horizon."""
WORKER_KEYS = {"end_s", "kind", "start_s", "state", "worker"}
WORKER_FAILURE_KEYS = {"assignment", "error", "kind", "step", "wall_s", "worker"}
MEMBERSHIP_KEYS = {"event", "kind", "pool", "requeued", "wall_s", "worker"}
GUARD_KEYS = {"action", "detector", "evidence", "kind", "lr_scale", "message", "restored_step", "step",
              "version", "wall_s"}
"""A guard event (tidal.orchestrator.guard): written only when a detector fires."""
INTEGRITY_KEYS = {f"integrity/{k}" for k in (
    "episodes", "flagged", "screened", "penalised", "graded", "visible_passes", "hidden_passes",
    "cheats", "canary_episodes", "canary_passes", "by_type", "flag_rate", "cheat_rate",
    "hidden_pass_rate", "visible_pass_rate", "canary_cheat_rate")}
"""Added to step and eval records where the environment keeps evidence (tidal.integrity)."""
SUMMARY_KEYS = {
    "backend", "cpu", "dropped_stale", "dtypes", "final_checkpoint", "heldout_gain",
    "heldout_pass1_after", "heldout_pass1_before", "heldout_pass1_by_level_after", "integrity", "fleet",
    "heldout_pass1_by_level_before", "heldout_samples_per_task", "heldout_tasks", "init_checkpoint",
    "kept_stale", "max_staleness", "max_staleness_seen", "num_workers", "numerics", "plot",
    "pretrain_budget_bound", "pretrain_s", "report", "rl_wall_s", "steps", "trajectories", "wall_s", "worker_busy_fraction",
    "worker_failures", "heldout_pass1_best", "best_step", "best_checkpoint", "guard",
}


def train_stats(**over) -> TrainStats:
    fields = dict(loss=0.5, pg_loss=0.4, kl=0.01, clip_frac=0.1, ratio_mean=1.0, ratio_max=1.2,
                  entropy=2.0, tokens=100.0, replay_filled_positions=0.0,
                  mismatch=MismatchStats(100.0, 1.0, 0.0, 0.0, 0.0), grad_norm=1.5, lr=1e-5,
                  sequences=8.0, adv_mean=0.0, adv_abs_mean=0.7, step_time_s=0.3, staleness_max=1.0)
    return TrainStats(**{**fields, **over})


def step_record(train: TrainStats | None, episode: EpisodeMeans | None) -> StepRecord:
    return StepRecord(
        step=3, version=3, wall_s=12.0,
        rollout=RolloutMetrics(0.5, 0.4, 0.5, {"pass": 4, "wrong_answer": 4}, episode),
        trajectories=8, dropped_stale=1, kept_stale=0, staleness_hist={1: 3, 0: 5}, staleness_max=1,
        gen_tokens_per_s=900.0, train_tokens_per_s=2000.0, generate_s=2.0, grade_s=0.5, train_s=0.3,
        publish_s=0.1, worker_busy_fraction=0.8, worker_failures=0, step_time_s=4.0, train=train)


def test_step_record_keys():
    record = step_record(train_stats(), episode_means()).to_json()
    assert set(record) == STEP_KEYS | EPISODE_KEYS | {f"train/{k}" for k in TRAIN_KEYS}
    assert record["kind"] == "step" and record["episode/turns"] == 2.0
    assert record["staleness_hist"] == {"0": 5, "1": 3}  # str keys, in staleness order
    assert list(record["staleness_hist"]) == ["0", "1"]
    assert set(step_record(None, None).to_json()) == STEP_KEYS  # nothing trained


def test_integrity_keys_of_steps_and_evals_and_their_round_trip():
    from tidal.evidence.policy import IntegrityMetrics

    m = IntegrityMetrics(episodes=8, flagged=2, screened=2, graded=8, visible_passes=5,
                         hidden_passes=3, cheats=2, canary_episodes=4, canary_passes=1,
                         by_type={"hardcoded_output": 2})
    record = step_record(train_stats(), episode_means())
    record.integrity = m
    out = record.to_json()
    assert set(out) == STEP_KEYS | EPISODE_KEYS | {f"train/{k}" for k in TRAIN_KEYS} | INTEGRITY_KEYS
    assert out["integrity/cheat_rate"] == 0.25 and out["integrity/canary_cheat_rate"] == 0.25
    ev = EvalRecord("step 2", 2, 2, 5.0, 0.5, {1: 0.75}, {"pass": 2}, episode_means(), 0.7, m)
    assert set(ev.to_json()) == EVAL_KEYS | EVAL_EPISODE_KEYS | INTEGRITY_KEYS
    assert EvalRecord.from_json(json.loads(json.dumps(ev.to_json()))) == ev
    state = RunState(step=2, evals=[ev], integrity=m)
    assert RunState.from_checkpoint(state.to_checkpoint()) == state


def test_train_stats_keys_with_an_off_policy_correction_and_moe_routing():
    stats = train_stats(off_policy=OffPolicyStats(2.0, 1.0, 0.9),
                        routing=RoutingStats(0.1, 0.2, [0.05, 0.15, 0.1], 0.0))
    keys = set(stats.to_json())
    layers = {f"routing_flip_rate_layer{i}" for i in range(3)}
    assert keys == TRAIN_KEYS | TRAIN_OFF_POLICY_KEYS | TRAIN_MOE_KEYS | layers
    assert stats.to_json()["routing_flip_rate_layer1"] == 0.15
    assert set(train_stats().to_json()) == TRAIN_KEYS


def episode_means() -> EpisodeMeans:
    return EpisodeMeans(turns=2.0, resets=0.5, effective_horizon=0.9, summary_tokens_mean=10.0,
                        tool_errors=0.25)


def test_eval_worker_and_failure_keys():
    ev = EvalRecord("before", 0, 0, 0.0, 0.25, {1: 0.5, 2: 0.0}, {"pass": 1}, episode_means(), 0.7)
    assert set(ev.to_json()) == EVAL_KEYS | EVAL_EPISODE_KEYS and ev.to_json()["kind"] == "eval"
    assert ev.to_json()["episode/effective_horizon_min"] == 0.7
    assert set(EvalRecord("before", 0, 0, 0.0, 0.25, {}, {}).to_json()) == EVAL_KEYS
    assert set(WorkerSpan(0, "busy", 0.0, 1.0).to_json()) == WORKER_KEYS
    failure = WorkerFailure(1, 2, 7, "RuntimeError: boom", 3.0).to_json()
    assert set(failure) == WORKER_FAILURE_KEYS and failure["kind"] == "worker_failure"


def test_eval_records_survive_a_checkpoint_and_the_json_form():
    ev = EvalRecord("step 2", 2, 2, 5.0, 0.5, {1: 0.75}, {"pass": 2}, episode_means(), 0.7)
    state = RunState(step=2, trajectories=16, evals=[ev])
    assert RunState.from_checkpoint(state.to_checkpoint()) == state
    assert EvalRecord.from_json(json.loads(json.dumps(ev.to_json()))) == ev  # "1" -> 1
    old = {k: v for k, v in ev.to_json().items() if not k.startswith("episode/")}  # an older record
    assert EvalRecord.from_json(old) == EvalRecord("step 2", 2, 2, 5.0, 0.5, {1: 0.75}, {"pass": 2})


class FailsOnce(RolloutWorker):
    failed = False

    def rollout(self, assignment):
        if not FailsOnce.failed:
            FailsOnce.failed = True
            raise RuntimeError("injected")
        return super().rollout(assignment)


def test_a_run_writes_exactly_the_pinned_keys(tmp_path, ckpt, monkeypatch):  # noqa: F811
    """One `tidal train` (with a worker failure): every record kind and summary.json."""
    FailsOnce.failed = False
    monkeypatch.setattr(loop, "run_rl", functools.partial(loop.run_rl, worker_cls=FailsOnce))
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "--model.init_from", str(ckpt), *TINY,
                 "--orchestrator.steps", "2", "--orchestrator.eval_every", "1"]) == 0
    keys: dict[str, set] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        keys.setdefault(r["kind"], set()).update(r)
    assert keys == {"step": STEP_KEYS | EPISODE_KEYS | {f"train/{k}" for k in TRAIN_KEYS},
                    "eval": EVAL_KEYS | EVAL_EPISODE_KEYS, "worker": WORKER_KEYS,
                    "worker_failure": WORKER_FAILURE_KEYS, "membership": MEMBERSHIP_KEYS}
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert set(RunSummary.__dataclass_fields__) == SUMMARY_KEYS


def test_guard_event_keys_and_round_trip():
    event = GuardEvent(5, "pass_crash", {"pass_rate": [0.1, 0.0]}, "restore", 0.5, 2, 6, 12.5, "guard: ...")
    record = event.to_json()
    assert set(record) == GUARD_KEYS and record["kind"] == "guard"
    assert GuardEvent.from_json(json.loads(json.dumps(record))) == event
    state = RunState(step=5, best=BestCheckpoint(2, 0.5, "/run/checkpoints/step_000002", 2),
                     restores=1, restored_version=6, guard_events=[event])
    assert RunState.from_checkpoint(state.to_checkpoint()) == state


def test_membership_record_keys():
    from tidal.orchestrator.records import Membership

    record = Membership(3, "borrowed", "left", 17, 12.5).to_json()
    assert set(record) == MEMBERSHIP_KEYS and record["kind"] == "membership"


@pytest.mark.parametrize("cls", [StepRecord, EvalRecord, WorkerSpan, WorkerFailure, RunSummary,
                                 TrainStats, EpisodeMeans, RolloutMetrics, RunState, GuardEvent,
                                 BestCheckpoint])
def test_every_field_is_documented(cls):
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    documented = {prev.target.id for prev, doc in zip(node.body, node.body[1:])
                  if isinstance(prev, ast.AnnAssign) and isinstance(doc, ast.Expr)
                  and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)}
    own = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    assert own and own == documented, f"{cls.__name__}: undocumented {sorted(own - documented)}"
