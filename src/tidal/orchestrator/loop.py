"""The RL run (`tidal train`): rollout workers run ahead of the trainer, within bounded staleness.

Dataflow:

    training step s ──split──> Assignments (tasks, group ids, min_version = s − max_staleness)
         ──> idle RolloutWorker (thread or Ray actor): load newest weights ≥ min_version,
             run G episodes per task in the harness (tidal.harness: the engine generates each
             turn; in-flight updates: newer weights load between decode steps; every token
             records its version), the environment (env.name) answers and rewards them
         ──> RolloutResult back to the driver ──> step s complete when all its assignments are
         ──> staleness gate (trainer version − oldest token version ≤ max_staleness; older
             trajectories are dropped and counted) ──> Trainer.step(Batch) ──> version s+1
         ──> WeightPublisher.publish(s+1) (default: delta over loopback HTTP, tidal.sync) ──> workers pull it

Back-pressure rules:
- Step s is planned (its assignments queued) only once the trainer has reached version
  s − max_staleness, so nothing a worker generates can be older than the bound allows, and at
  most max_staleness + 1 steps of trajectories wait in the buffer. When no step may be planned,
  idle workers wait (logged as ``wait_backpressure`` in the worker timeline).
- max_staleness = 0 is the synchronous mode on this same path: step s is planned only after
  step s − 1 has been trained and published, so generation and training alternate.
- A worker that fails (raises, or its actor dies) is replaced by a fresh one and its assignment
  is re-run (at most MAX_ATTEMPTS times); its partial output is discarded, so no task is lost or
  counted twice.

These rules are the state of ``scheduler.Scheduler`` (tested without workers); ``Run._drive``
only moves assignments between it and the pool. What the run writes (metrics.jsonl records,
summary.json, the checkpointed RunState) is typed in ``records.py``.

Held-out pass@1 is measured by the driver's own engine (loaded with the trainer's weights) before
RL, every ``eval_every`` steps and after RL, on the same tasks with the same sampler settings.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tidal.orchestrator.topology import placement_of
from tidal.evidence.policy import apply_policy
from tidal.orchestrator import guard, numerics_watch
from tidal.orchestrator.evaluate import canary_metrics, eval_canaries, eval_engine_config, heldout_pass1
from tidal.orchestrator.planning import complete_groups, plan_step, staleness_gate, with_decay
from tidal.orchestrator.pool import (ElasticPool, FleetPool, LocalPool, OrchestratorError,
                                     RemotePools, RemotePoolsFactory, worker_ids)
from tidal.orchestrator.ray_pool import RayPool
from tidal.orchestrator.records import (BestCheckpoint, EpisodeMeans, EvalRecord, GuardEvent, Membership,
                                        RunState, RunSummary, StepRecord, WorkerFailure, WorkerSpan)
from tidal.orchestrator.run_output import fleet_summary, guard_summary, run_summary, step_record, trim_metrics
from tidal.orchestrator.scheduler import Scheduler
from tidal.orchestrator.worker import RolloutResult, RolloutWorker, Span
from tidal.sync.transport import WeightPublisher, open_weight_publisher
from tidal.telemetry.metrics import MetricsLog
from tidal.trajectory import Batch

if TYPE_CHECKING:  # the run config assembles this package's sections: a type, not an import
    from tidal.config import TidalConfig
    from tidal.env import EnvironmentSpec


class Run:
    """One RL run: the trainer and eval engine in this process, rollout workers in a pool."""

    def __init__(self, cfg: TidalConfig, run_dir: Path, init_checkpoint: str | Path, progress: bool,
                 worker_cls=RolloutWorker, remote_pools: RemotePoolsFactory | None = None,
                 env: EnvironmentSpec | None = None):
        """remote_pools: how pools placed "remote" are made (pool.RemotePools; `tidal train`
        passes tidal.fleet's); None = a recipe with a remote pool is refused. env: the run's
        environment where the caller built it (`tidal train` does, once, on the run's sandbox);
        None = built here."""
        from tidal.engine.engine import Engine
        from tidal.env import from_config
        from tidal.model import from_pretrained, load_tokenizer
        from tidal.sandbox import Sandbox
        from tidal.trainer.sharded.launch import make_trainer

        guard.check_supported(cfg)  # before anything starts
        self.cfg, self.run_dir, self.progress = cfg, run_dir, progress
        self.init_checkpoint = str(init_checkpoint)
        oc = cfg.orchestrator
        torch.manual_seed(cfg.run.seed)
        if cfg.run.trainer_cpus:
            from tidal.hardware import pin_process

            pin_process(cfg.run.trainer_cpus)
        if cfg.run.trainer_threads:
            torch.set_num_threads(cfg.run.trainer_threads)
        policy = from_pretrained(init_checkpoint, dtype=torch.float32)
        self.trainer = make_trainer(policy, with_decay(cfg.trainer, oc.steps), cfg.sharding, temperature=cfg.engine.temperature,
                                    numerics=cfg.engine.numerics)  # processes > 1: FSDP2 handle
        self.fresh_optimizer = (copy.deepcopy(self.trainer.optimizer.state_dict())
                                if hasattr(self.trainer, "optimizer") else None)
        """The optimizer as built: what a restore of the model RL began from starts with."""
        serving = copy.deepcopy(policy).to(getattr(torch, cfg.model.dtype))
        self.eval_engine = Engine(serving, load_tokenizer(init_checkpoint), eval_engine_config(cfg),
                                  version=0)
        self.env = env or from_config(cfg.env, Sandbox(cfg.env.sandbox))
        self.heldout = self.env.sample_tasks(oc.heldout_tasks, oc.heldout_seed, True)
        self.canaries = eval_canaries(self.env, self.heldout, cfg.env.integrity.eval_canaries,
                                      oc.heldout_seed)
        self.guard = guard.Guard(oc.guard, len(self.heldout))
        self.stopped: GuardEvent | None = None
        """The guard event that ended RL (policy stop), if one did."""
        self._saved_step: int | None = None
        self.store: WeightPublisher = open_weight_publisher(
            cfg.sync, run_dir / "weights", cfg.model.dtype, listen=cfg.fleet.listen)
        self.state = RunState()
        self.before: EvalRecord | None = None
        """The evaluation before RL (this run's, or the resumed run's first)."""
        self.rl_start = time.time()
        """time.time() at which the RL phase began, moved back by a resumed run's RL wall time."""
        self._last_step_wall = 0.0
        self.worker_cls, self.remote_pools = worker_cls, remote_pools
        self.fleet_extra: dict = {}
        """What remote pools' coordinator adds to summary.json's ``fleet`` (refused uploads...)."""
        self._write_lock = threading.Lock()
        self.pool: FleetPool | None = None
        """The run's workers, while it drives them."""
        self.coordinator: RemotePools | None = None
        """The endpoint remote pools join, made by remote_pool from ``remote_pools``."""
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.tb = _tensorboard(run_dir)

    # ------------------------------------------------------------------ checkpoints

    def save(self, final: bool = False):
        from tidal.trainer.checkpoint import (
            capture_rng_state,
            checkpoint_path,
            save_checkpoint,
        )

        extra = {"state": self.state.to_checkpoint(), "rng": capture_rng_state(), "final": final}
        path = checkpoint_path(self.run_dir, self.state.step)
        self._saved_step = self.state.step
        if hasattr(self.trainer, "save"):  # the sharded trainer: DCP shards + HF folder
            return self.trainer.save(path, extra)
        return save_checkpoint(self.trainer, path, extra, self._checkpoint_tokenizer())

    def _checkpoint_tokenizer(self):
        """The tokenizer a checkpoint carries: a pretrained model's (its files and chat template),
        none for the byte tokenizer, which needs no file."""
        from tidal.model.tokenizer import ByteTokenizer

        tokenizer = self.eval_engine.tokenizer
        return None if isinstance(tokenizer, ByteTokenizer) else tokenizer

    def restore(self) -> bool:
        """Continue from the run dir's latest complete checkpoint; False if there is none."""
        from tidal.trainer.checkpoint import (
            latest_checkpoint,
            load_checkpoint,
            restore_rng_state,
        )

        path = latest_checkpoint(self.run_dir)
        if path is None:
            return False
        extra = self.trainer.load(path) if hasattr(self.trainer, "load") else load_checkpoint(path, self.trainer)
        self.state = RunState.from_checkpoint(extra["state"])
        restore_rng_state(extra["rng"])
        self._last_step_wall = self.state.rl_wall_s
        self.log.close()
        trim_metrics(self.run_dir / "metrics.jsonl", self.state)
        self.log = MetricsLog(self.run_dir / "metrics.jsonl")
        return True

    # ------------------------------------------------------------------ the loop

    def evaluate(self, label: str) -> EvalRecord:
        self.eval_engine.load_weights(self.trainer.model, self.trainer.version)
        result = heldout_pass1(self.eval_engine, self.env, self.heldout, self.cfg.harness,
                               self.cfg.orchestrator.eval_samples_per_task, self.cfg.run.seed,
                               min_confidence=self.cfg.env.integrity.min_confidence)
        integrity = result["integrity"].add(canary_metrics(
            self.eval_engine, self.env, self.canaries, self.cfg.harness, self.cfg.run.seed,
            self.cfg.env.integrity.min_confidence))
        record = EvalRecord(label=label, step=self.state.step, version=self.trainer.version,
                            wall_s=self.state.rl_wall_s, heldout_pass1=result["pass1"],
                            pass1_by_level=result["pass1_by_level"], reasons=result["reasons"],
                            episode=EpisodeMeans(**result["episode"]),
                            effective_horizon_min=result["effective_horizon_min"],
                            integrity=integrity if integrity.episodes else None)
        self._write(record)
        self.state.evals.append(record)
        self._note_best(record)
        return record

    def _note_best(self, record: EvalRecord) -> None:
        """A new best held-out pass@1: remember it and, mid-run, save its checkpoint now (the
        final save writes the "after" one; "before" is the model RL began from)."""
        from tidal.trainer.checkpoint import checkpoint_path

        best = self.state.best
        if best is not None and record.heldout_pass1 <= best.heldout_pass1:
            return
        path = self.init_checkpoint if record.step == 0 else str(checkpoint_path(self.run_dir, record.step))
        self.state.best = BestCheckpoint(record.step, record.heldout_pass1, path, record.version)
        if record.step and record.label != "after":
            self.save()

    def _act_on(self, findings: list[guard.Finding]) -> None:
        """A collapse the guard saw: restore the best checkpoint (publishing it as the next
        version), stop RL, or only record it, as orchestrator.guard.policy says."""
        if not findings:
            return
        s, gc = self.state, self.cfg.orchestrator.guard
        action = self.guard.decide(s.restores)
        if action == "restore":
            s.restored_version = guard.restore(self.trainer, s.best, self.fresh_optimizer, gc.lr_factor)
            s.restores += 1
            self.store.publish(self.trainer.model, self.trainer.version)
        lr_scale = getattr(self.trainer, "lr_scale", 1.0)
        exhausted = gc.policy == "restore" and action == "stop"
        message = guard.event_message(s.step, findings, action, s.best, lr_scale, exhausted)
        event = GuardEvent(s.step, findings[0].detector, guard.evidence_of(findings), action, lr_scale,
                           s.best.step if action == "restore" else None, self.trainer.version,
                           time.time() - self.rl_start, message)
        self._record_event(event)
        self.guard.reset()

    def _record_event(self, event: GuardEvent) -> None:
        """A guard event into the run's state, metrics.jsonl and stderr; "stop" ends RL."""
        self.state.guard_events.append(event)
        self._write(event)
        print(event.message, file=sys.stderr, flush=True)
        if event.action == "stop":
            self.stopped = event

    def make_pool(self) -> FleetPool:
        """One pool per fleet.pools entry (the default: one local pool of num_workers), each
        placed as its config says (tidal.orchestrator.topology.placement_of)."""
        oc, ids, t0 = self.cfg.orchestrator, worker_ids(), time.time()
        root = self.store.address
        pools = []
        for pool_cfg in self.cfg.fleet.pools_or_default(oc.num_workers):
            where = placement_of(pool_cfg, oc.backend)
            if where == "ray":
                if self.worker_cls is not RolloutWorker:
                    raise OrchestratorError("a custom worker class needs orchestrator.backend = 'local'")
                pools.append(RayPool((self.cfg, self.init_checkpoint, root), pool_cfg, ids,
                                     oc.ray_num_cpus, oc.cpus_per_worker, t0))
            elif where == "local":
                pools.append(LocalPool(lambda i: self.worker_cls(self.cfg, self.init_checkpoint, root, i),
                                       pool_cfg, ids, t0))
            else:
                pools.append(self.remote_pool(pool_cfg, ids, t0))
        return FleetPool(pools)

    def remote_pool(self, pool_cfg, ids, t0):
        """A pool whose workers join over the network (one coordinator for all of them)."""
        if self.remote_pools is None:
            raise OrchestratorError(f"fleet pool {pool_cfg.name!r} is remote, which needs the fleet "
                                    "extension: run it with `tidal train` (or pass run_rl "
                                    "remote_pools=tidal.fleet.pools.RemoteFleet)")
        if self.cfg.sync.transport != "http":
            raise OrchestratorError(f"fleet pool {pool_cfg.name!r} is remote: its workers get weights "
                                    "over HTTP, so sync.transport must be 'http'")
        if self.coordinator is None:
            self.coordinator = self.remote_pools(self.cfg, self.run_dir, self.store.address,
                                                 self.init_checkpoint, self.store.latest_version)
        return self.coordinator.pool(pool_cfg, ids, t0)

    def run(self) -> RunSummary:
        # The pools first: Ray workers start loading at once (a process, imports, the model, the
        # numerics probe, warm sandboxes) while the driver evaluates before RL, so their start-up
        # does not count against the RL budget (docs/training.md).
        pool = self.make_pool()
        try:
            resumed = self.state.step > 0
            self.before = self.state.evals[0] if resumed else self.evaluate("before")
            if self.state.best is None:  # resumed from a checkpoint written before the guard
                self.state.best = BestCheckpoint(0, self.before.heldout_pass1, self.init_checkpoint, 0)
            numerics_watch.resumed(self.state, self.cfg.orchestrator.guard, self.trainer)
            self.store.publish(self.trainer.model, self.trainer.version)
            if self.coordinator is not None:
                self.coordinator.start()
            self._drive(pool)
            ray_pools = {p.name: p.report() for p in pool.pools if isinstance(p, RayPool)}
            if ray_pools:  # each Ray worker's node and the pools' lost/back events
                self.fleet_extra["ray"] = ray_pools
        finally:
            pool.close()
            if self.coordinator is not None:
                self.coordinator.stop()
                self.fleet_extra.update(self.coordinator.summary())
            self.store.close()
        after = self.evaluate("after")
        final = self.save(final=True)
        if hasattr(self.trainer, "close"):  # the sharded trainer's followers stop
            self.trainer.close()
        self.log.close()
        if self.tb:
            self.tb.close()
        return self.summary(after, final)

    def _drive(self, pool: FleetPool) -> None:
        """Plan steps within the staleness bound, follow the fleet's membership, keep every live
        worker busy, train complete steps in order. A step trains (and publishes) on a thread of
        its own, so workers that finish meanwhile get their next assignment at once instead of
        waiting for the trainer; the next step starts training only after the last one's
        evaluation and checkpoint."""
        from tidal.telemetry.progress import progress_bar

        oc = self.cfg.orchestrator
        self.rl_start = time.time() - self.state.rl_wall_s
        self.pool = pool
        sched = Scheduler(lambda step, first_id: plan_step(self.cfg, self.env, step, first_id,
                                                           max(1, sched.num_workers)),
                          [], oc.steps, oc.max_staleness, self.state.step, time.time())
        handles: dict = {}  # future -> worker
        bar = progress_bar(oc.steps, "RL", self.progress)
        bar.update(self.state.step)
        self._await_pools(pool, sched)
        last = time.time()
        trainer = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")
        training: cf.Future | None = None
        try:
            while self._more_steps() and time.time() - self.rl_start < oc.time_budget_s:
                now = time.time()
                self.state.member_s += sched.num_workers * (now - last)
                last = now
                self._follow_membership(pool, sched, now)
                sched.plan(self.trainer.version)
                for d in sched.dispatch(time.time()):
                    self._worker_span(d.waited)
                    handles[pool.submit(d.worker, d.assignment)] = d.worker
                waiting = list(handles) + ([training] if training else [])
                for handle in pool.wait(waiting, timeout=0.2 if waiting else 0.05):
                    if handle is not training:
                        self._collect(pool, sched, handles.pop(handle), handle)
                for res in pool.late_results():
                    self._accept(sched, res)
                if training is not None and training.done():
                    record, training = training.result(), None
                    self._step_done(record, bar)
                if training is None and sched.ready(self.state.step) and self._more_steps():
                    training = trainer.submit(self._train_step, sched.take(self.state.step))
            if training is not None:  # the budget ran out while a step trained: finish it
                self._step_done(training.result(), bar)
        finally:
            trainer.shutdown(wait=True)
        self.state.member_s += sched.num_workers * (time.time() - last)
        self.state.duplicates += sched.duplicates
        bar.close()
        self.state.rl_wall_s = time.time() - self.rl_start

    def _await_pools(self, pool: FleetPool, sched: Scheduler) -> None:
        """Until every pool tidal starts itself has a member, or fleet.start_wait_s has passed
        (the wait counts as RL time, as any start-up does): the first steps are planned over the
        members there are then."""
        deadline = time.time() + self.cfg.fleet.start_wait_s
        own = [p for p in pool.pools if isinstance(p, ElasticPool)]
        while time.time() < deadline:
            self._follow_membership(pool, sched, time.time())
            if all(p.workers or not p.capacity(time.time()) for p in own):
                return
            time.sleep(0.05)

    def _more_steps(self) -> bool:
        """Steps left to train, and the guard has not stopped the run."""
        return self.state.step < self.cfg.orchestrator.steps and self.stopped is None

    def _follow_membership(self, pool: FleetPool, sched: Scheduler, now: float) -> None:
        """Workers that joined become schedulable; what a leaver held is queued again."""
        joined, left = pool.members(now)
        for w in joined:
            sched.add_worker(w, now)
            self.state.joined += 1
            self._write(Membership(w, pool.pool_of[w], "joined", None, now - self.rl_start))
        for w in left:
            a = sched.remove_worker(w, now)
            requeued = a.assignment_id if a is not None and a.assignment_id in {q.assignment_id for q in sched.queue} else None
            self.state.left += 1
            self.state.requeued += requeued is not None
            self._write(Membership(w, pool.pool_of[w], "left", requeued, now - self.rl_start))

    def _accept(self, sched: Scheduler, res: RolloutResult) -> None:
        """A result that came back outside a dispatch (a remote worker that had left delivered)."""
        if sched.accept(res):
            for span in res.spans:
                self._worker_span(span)

    def _collect(self, pool, sched: Scheduler, worker: int, handle) -> None:
        """A finished handle: its result to the scheduler, or, if the worker failed (raised, or its
        actor died), a fresh worker and its assignment back in the queue. A worker that had
        already left: its failure changes nothing (what it held was queued again when it left),
        its result counts if it is the first back for that assignment."""
        member = worker in sched.running
        try:
            res = pool.result(handle)
        except Exception as e:  # a worker's failure of any kind: replace it, re-run its work
            if not member:
                sched.orphans.pop(worker, None)
                return
            a = sched.running[worker]
            self.state.worker_failures += 1
            self._write(WorkerFailure(worker, a.step, a.assignment_id, f"{type(e).__name__}: {e}"[:500],
                                      time.time() - self.rl_start))
            sched.fail(worker, e, time.time())
            pool.replace(worker)
            return
        if sched.complete(worker, res, time.time()):
            for span in res.spans:
                self._worker_span(span)

    def _step_done(self, record: StepRecord, bar) -> None:
        """Progress, the guard, then the evaluation (and the guard on it) and checkpoint the
        config asks for after this step (unless a new best just saved this step)."""
        oc = self.cfg.orchestrator
        bar.update(1)
        bar.set_postfix(reward=f"{record.rollout.reward_mean:.2f}", stale=self.state.max_staleness_seen,
                        heldout=f"{self.state.evals[-1].heldout_pass1:.2f}", refresh=False)
        self._act_on(self.guard.after_step(record))
        if (event := numerics_watch.act_on(record, self.cfg.engine, self.cfg.model, self.cfg.orchestrator.guard,
                                           self.state, self.trainer, time.time() - self.rl_start)):
            self._record_event(event)
        if oc.eval_every and self.state.step % oc.eval_every == 0 and self.state.step < oc.steps:
            evaluated = self.evaluate(f"step {self.state.step}")
            self._act_on(self.guard.after_eval(evaluated, self.state.best))
        if oc.checkpoint_every and self.state.step % oc.checkpoint_every == 0 and self._saved_step != self.state.step:
            self.save()

    def _train_step(self, step_results: list[RolloutResult]) -> StepRecord:
        """Gate, train and publish one step; log its record. Its trajectories are ordered by group
        (task index in the step), then sample, so the batch does not depend on which workers ran
        them."""
        oc = self.cfg.orchestrator
        t0 = time.perf_counter()
        trajs = sorted((t for r in step_results for t in r.trajectories), key=lambda t: t.group_id)
        trajs, hist = staleness_gate(trajs, self.trainer.version, oc.max_staleness, self.state, oc.keep_stale,
                                     self.state.restored_version)
        trajs = complete_groups(trajs, oc.group_size)
        # skipped episodes: counted, never trained; flagged ones as env.integrity.policy says
        trained, integrity = apply_policy([t for t in trajs if t.segments], self.cfg.env.integrity)
        stats = self.trainer.step(Batch(trained, self.trainer.version)) if trained else None
        t1 = time.perf_counter()
        if self.store.latest_version() != self.trainer.version:  # a step that trained nothing: no new version
            self.store.publish(self.trainer.model, self.trainer.version)
        t2 = time.perf_counter()
        self.state.step += 1
        self.state.trajectories += len(trajs)
        self.state.rl_wall_s = time.time() - self.rl_start
        self.state.busy_s += sum(r.generate_s + r.grade_s for r in step_results)
        self.state.integrity = self.state.integrity.add(integrity)
        record = step_record(self.state, self.trainer.version, step_results, trajs, hist, stats,
                             t1 - t0, t2 - t1, oc.num_workers, self._last_step_wall)
        record.integrity = integrity if integrity.episodes else None
        self._last_step_wall = record.wall_s
        self._write(record)
        return record

    def _worker_span(self, span: Span) -> None:
        if span.end - span.start > 1e-3:
            self._write(WorkerSpan(span.worker, span.state, span.start - self.rl_start,
                                   span.end - self.rl_start))

    def _write(self, record: StepRecord | EvalRecord | WorkerSpan | WorkerFailure | GuardEvent) -> None:
        """One metrics.jsonl line, mirrored to TensorBoard (which reads the same JSON form)."""
        line = record.to_json()
        with self._write_lock:  # the trainer's thread and the driver's both write
            self.log.write(line)
            if self.tb:
                self.tb.write(line)

    def summary(self, after: EvalRecord, final_checkpoint) -> RunSummary:
        return run_summary(self.cfg, self.state, self.before, after, final_checkpoint, self.init_checkpoint,
                           len(self.heldout), guard_summary(self.guard, self.state, self.stopped),
                           fleet_summary(self.cfg, self.state, self.fleet_extra))


def _tensorboard(run_dir: Path):
    from tidal.telemetry.tensorboard import TensorBoardLog

    return TensorBoardLog(run_dir)


def run_rl(cfg: TidalConfig, run_dir: str | Path, init_checkpoint: str | Path, progress: bool = True,
           resume: bool = False, worker_cls=RolloutWorker,
           remote_pools: RemotePoolsFactory | None = None,
           env: EnvironmentSpec | None = None) -> RunSummary:
    """GRPO from ``init_checkpoint`` (or the run dir's last checkpoint when ``resume``); see Run
    for ``remote_pools`` and ``env``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run = Run(cfg, run_dir, init_checkpoint, progress, worker_cls, remote_pools, env)
    if resume and not run.restore():
        raise OrchestratorError(f"nothing to resume in {run_dir}: it has no complete checkpoint yet; "
                                "start a new run instead")
    return run.run()
