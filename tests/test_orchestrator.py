"""The asynchronous orchestrator: staleness bound, sync mode, worker failures, resume, Ray errors."""

import json

import pytest

from tidal.config import load_config
from tidal.env import from_config
from tidal.hardware import native_bf16
from tidal.model import build_model, save_pretrained
from tidal.orchestrator.loop import run_rl
from tidal.orchestrator.planning import plan_step, staleness_gate
from tidal.orchestrator.pool import OrchestratorError
from tidal.orchestrator.ray_pool import start_ray
from tidal.orchestrator.records import RunState
from tidal.orchestrator.worker import RolloutWorker
from tidal.trajectory import Segment, Trajectory

TINY = ["--model.hidden_size", "32", "--model.num_hidden_layers", "1", "--model.num_attention_heads", "2",
        "--model.num_key_value_heads", "1", "--model.head_dim", "16", "--model.intermediate_size", "64",
        "--orchestrator.tasks_per_step", "4", "--orchestrator.group_size", "2",
        "--orchestrator.heldout_tasks", "4", "--orchestrator.eval_every", "0",
        "--orchestrator.checkpoint_every", "0", "--orchestrator.backend", "local",
        "--engine.max_new_tokens", "12", "--env.sandbox.concurrency", "2"]


def cfg_with(*extra):
    return load_config(None, [*TINY, *extra])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("init") / "model"
    save_pretrained(build_model(cfg_with().model, seed=0), path)
    return path


def traj(group, versions):
    n = len(versions)
    seg = Segment([1, 2], list(range(n)), [-0.5] * n, list(versions), [1] * n)
    return Trajectory(task_id="t", group_id=group, segments=[seg])


def records(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_staleness_gate_drops_and_counts():
    state = RunState()
    kept, hist = staleness_gate([traj(0, [5, 5]), traj(0, [3, 5]), traj(1, [4])], trainer_version=5,
                                max_staleness=1, state=state)
    assert [t.min_version for t in kept] == [5, 4]
    assert state.dropped_stale == 1 and state.max_staleness_seen == 1
    assert hist == {0: 1, 1: 1}


def test_plan_step_splits_tasks_and_sets_min_version():
    cfg = cfg_with("--orchestrator.num_workers", "3", "--orchestrator.max_staleness", "2")
    parts = plan_step(cfg, from_config(cfg.env, sandbox=None), step=5, first_id=10)
    assert [a.assignment_id for a in parts] == [10, 11, 12]
    assert sorted(g for a in parts for g in a.group_ids) == [0, 1, 2, 3]
    assert all(a.min_version == 3 and a.step == 5 for a in parts)


@pytest.mark.parametrize("max_staleness", [0, 2])
def test_run_respects_staleness_bound(tmp_path, ckpt, max_staleness):
    cfg = cfg_with("--orchestrator.steps", "5", "--orchestrator.max_staleness", str(max_staleness))
    summary = run_rl(cfg, tmp_path, ckpt, progress=False)
    assert summary.steps == 5 and summary.trajectories == 5 * 4 * 2
    assert summary.max_staleness_seen <= max_staleness
    assert summary.dtypes["model.dtype"]["resolved"] == cfg.model.dtype  # and the machine behind it:
    assert summary.cpu["native_bf16"] == native_bf16()  # the machine, not what tests force "auto" to
    steps = records(tmp_path, "step")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    for s in steps:
        assert max(int(k) for k in s["staleness_hist"]) <= max_staleness
    spans = records(tmp_path, "worker")
    assert {s["state"] for s in spans} >= {"busy"}
    assert 0 < summary.worker_busy_fraction <= 1


class FlakyWorker(RolloutWorker):
    """Raises in the middle of its first episode (after generating, before grading)."""

    failures = 0

    def rollout(self, assignment):
        if FlakyWorker.failures == 0 and assignment.step == 1:
            FlakyWorker.failures += 1
            self.engine.generate([])
            raise RuntimeError("injected failure mid-episode")
        return super().rollout(assignment)


def test_failed_worker_is_replaced_and_its_tasks_rerun(tmp_path, ckpt):
    FlakyWorker.failures = 0
    cfg = cfg_with("--orchestrator.steps", "3")
    summary = run_rl(cfg, tmp_path, ckpt, progress=False, worker_cls=FlakyWorker)
    assert FlakyWorker.failures == 1 and summary.worker_failures == 1
    assert summary.steps == 3 and summary.trajectories == 3 * 4 * 2  # re-run, never double
    failure = records(tmp_path, "worker_failure")
    assert len(failure) == 1 and "injected failure" in failure[0]["error"]


def test_resume_continues_without_training_twice(tmp_path, ckpt):
    run_rl(cfg_with("--orchestrator.steps", "2"), tmp_path, ckpt, progress=False)
    summary = run_rl(cfg_with("--orchestrator.steps", "4"), tmp_path, ckpt, progress=False, resume=True)
    assert summary.steps == 4 and summary.trajectories == 4 * 4 * 2
    assert [s["step"] for s in records(tmp_path, "step")] == [1, 2, 3, 4]


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, ckpt):
    with pytest.raises(OrchestratorError, match="nothing to resume"):
        run_rl(cfg_with("--orchestrator.steps", "1"), tmp_path, ckpt, progress=False, resume=True)


def test_ray_failing_to_start_says_why(monkeypatch):
    import ray

    def broken_init(*args, **kwargs):
        raise ConnectionError("could not reach the GCS")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", broken_init)
    with pytest.raises(OrchestratorError, match="Ray failed to start.*could not reach the GCS.*backend local"):
        start_ray(1)


@pytest.mark.slow
def test_ray_backend_runs_actors(tmp_path, ckpt):
    import ray

    cfg = cfg_with("--orchestrator.steps", "2", "--orchestrator.backend", "ray")
    try:
        summary = run_rl(cfg, tmp_path, ckpt, progress=False)
    finally:
        ray.shutdown()
    assert summary.backend == "ray" and summary.steps == 2
    assert {s["worker"] for s in records(tmp_path, "worker") if s["state"] == "busy"} == {0, 1}


def test_keep_stale_trains_old_trajectories_and_counts_them():
    state = RunState()
    kept, hist = staleness_gate([traj(0, [1, 5]), traj(0, [5])], trainer_version=5, max_staleness=1,
                                state=state, keep_stale=True)
    assert len(kept) == 2 and state.kept_stale == 1 and state.dropped_stale == 0
    assert state.max_staleness_seen == 4 and hist == {4: 1, 0: 1}


@pytest.mark.slow
def test_run_killed_mid_flight_resumes_from_last_checkpoint(tmp_path, ckpt):
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "tidal", "train", "--run-dir", str(run), "--model.init_from", str(ckpt),
           *TINY, "--orchestrator.steps", "8", "--orchestrator.checkpoint_every", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline:
        if (run / "metrics.jsonl").is_file() and any(r["step"] >= 3 for r in records(run, "step")):
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists()
    resumed = subprocess.run([sys.executable, "-m", "tidal", "train", "--resume", str(run)],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["trajectories"] == 8 * 4 * 2
    assert [s["step"] for s in records(run, "step")] == list(range(1, 9))


def test_tasks_whose_prompt_does_not_fit_are_skipped_counted_and_never_trained(tmp_path, ckpt):
    # 12 tokens of turn + prompts of 65..132 tokens: some of each step's tasks do not fit
    cfg = cfg_with("--orchestrator.steps", "2", "--harness.context_window", "112")
    summary = run_rl(cfg, tmp_path, ckpt, progress=False)
    assert summary.steps == 2 and summary.trajectories == 2 * 4 * 2
    steps = records(tmp_path, "step")
    assert [s["reasons"].get("prompt_too_long") for s in steps] == [2, 4]  # G = 2 samples a task
    assert all("train/loss" in s for s in steps)  # the rest trained as usual
