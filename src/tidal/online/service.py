"""The learner process of ``tidal serve``: feedback -> training -> candidate -> gate -> canary ->
promoted, or rolled back bit-exact to the incumbent.

    loop (one process, beside the HTTP server; they share only the store and the weight store):
      learn:    store.learn_events_after(cursor) ──> OnlineLearner.step() every events_per_step
                ──> after steps_per_candidate steps: publish the weights (tidal.sync) and register
                    a "candidate" (parent = the live version)
      gate:     the oldest "candidate" in the registry (the learner's, or one registered by hand)
                ──> measure it and the incumbent on the same held-out tasks and guard prompts
                ──> "blocked", or a canary at online.canary.share of traffic
      canary:   its feedback against the incumbent's since it started (canary_decision, an
                always-valid sequential test) ──> promote, or roll back

The registry is the only channel to the server: it polls ``live_versions()`` and serves what is
listed, loading each version through the weight sync, verified against its manifest hash. After a
rollback (or a blocked candidate of its own) the learner starts again from the live version's
weights, loaded from the weight store, so it never trains on from a rejected branch.

Version numbers: a candidate is numbered by the learner's trainer version (optimizer steps taken
on its lineage); after a reset the trainer continues above the highest version in the registry,
so a number is never given to two different sets of weights.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tidal.online.records import VersionRecord
from tidal.telemetry.metrics import MetricsLog, finite_json


class OnlineLoop:
    """One learner process's state: the store, the weight store, the learner and the controller.

    cfg: the run's TidalConfig; run_dir: the serving run's folder (``weights/`` is its sync store,
    ``online_metrics.jsonl`` what the loop did)."""

    def __init__(self, cfg, run_dir: Path, store, registry):
        from tidal.env.registry import from_config
        from tidal.model import load_tokenizer
        from tidal.online.reward import RewardFunction
        from tidal.online.version_sync import VersionLoader
        from tidal.sandbox import Sandbox

        self.cfg = cfg
        self.oc = cfg.online
        self.run_dir = Path(run_dir)
        self.store = store
        self.registry = registry
        self.weights_root = self.run_dir / "weights"
        self.loader = VersionLoader(self.weights_root)
        self.tokenizer = load_tokenizer(self.run_dir / "tokenizer") if (self.run_dir / "tokenizer").is_dir() else load_tokenizer(None)
        self.env = from_config(cfg.env, Sandbox(cfg.env.sandbox))
        self.heldout = self.env.sample_tasks(self.oc.gate.heldout_tasks, cfg.orchestrator.heldout_seed, True)
        self.guard_prompts = [t.prompt for t in self.heldout[: self.oc.gate.guard_prompts]]
        """Text prompts (the held-out tasks'), encoded with BOS as the harness and server do."""
        self.reward = RewardFunction(self.oc.reward)
        self.cursor = store.learned_through()
        self.metrics = MetricsLog(self.run_dir / "online_metrics.jsonl")
        self._measured: dict[int, Any] = {}
        """GateMeasurement per version (the incumbent's is measured once)."""
        self._own_candidate: int | None = None
        self._steps_since_candidate = 0
        self._last_candidate = time.time()
        self._skipped_waiting = 0
        """Events read while waiting for a verdict and dropped for newer ones (logged once)."""
        self.base: VersionRecord | None = None
        self.learner = None
        self._reset_to_live()

    # ---------------------------------------------------------------- the learner's weights

    def _live(self, records: list[VersionRecord] | None = None) -> VersionRecord:
        """The live version, of ``records`` (the registry's, read now when None)."""
        records = self.registry.live_versions() if records is None else records
        live = [r for r in records if r.status == "live"]
        if not live:
            raise RuntimeError("the version registry has no live version; tidal serve registers "
                               "the first one when it starts")
        return live[0]

    def _load(self, record: VersionRecord, dtype: str = "float32"):
        """A version's weights through the weight sync, verified against its manifest hash."""
        return self.loader.load(record.version, record.manifest_sha256, dtype)

    def _reset_to_live(self) -> None:
        """A fresh learner on the live version's weights (verified against its manifest)."""
        from tidal.online.learner import OnlineLearner
        from tidal.trainer.trainer import Trainer

        live = self._live()
        model = self._load(live)
        lc = self.oc.learner
        trainer_cfg = self.cfg.trainer.model_copy(update={"lr": lc.lr})
        trainer = Trainer(model, trainer_cfg, temperature=self.cfg.engine.temperature,
                          pad_id=self.tokenizer.pad_id, numerics=self.cfg.engine.numerics)
        trainer.version = max([r.version for r in self.registry.all()] + [live.version])
        self.base = live
        self.learner = OnlineLearner(trainer, self.reward, lc)
        self._steps_since_candidate = 0
        self._own_candidate = None
        self._log({"kind": "learner_reset", "base_version": live.version,
                   "trainer_version": trainer.version, "lr": lc.lr, "lr_from": "online.learner.lr"})

    # ---------------------------------------------------------------- one tick

    def tick(self) -> bool:
        """Learn from new feedback, then move the registry's candidates and canary along.
        Returns whether anything happened (the caller sleeps otherwise)."""
        did = self._learn() if self.oc.learner.enabled else False
        for stage in (self._maybe_make_candidate, self._advance_canary, self._gate_next_candidate):
            did |= stage(self.registry.all())  # read once per stage: each may change it
        return did

    def _learn(self) -> bool:
        """Train on new feedback until this lineage has its ``steps_per_candidate`` steps; then
        wait until its candidate is decided, so a candidate is always a few steps from what
        users are served, instead of training ever further off-policy.

        Reading: while training, events are read only as fast as they are trained on, so a
        learner slower than the traffic leaves them in the store, where the server sees the
        backlog and answers 429. While waiting, it keeps reading (the canary's decision needs
        feedback to flow) and keeps only the newest ``4 * events_per_step`` for after, the least
        stale; the older ones are counted as ``skipped_waiting``."""
        lc = self.oc.learner
        waiting = self._own_candidate is not None or self._candidate_due()
        keep = 4 * lc.events_per_step
        limit = keep if waiting else keep - self.learner.backlog
        events = self.store.learn_events_after(self.cursor, limit) if limit > 0 else []
        if events:
            self.learner.add(events)
            self.cursor = events[-1].seq
        while waiting and self.learner.backlog > keep:
            self.learner.buffer.popleft()
            self._skipped_waiting += 1
        if not waiting and self._skipped_waiting:
            self._log({"kind": "skipped_waiting", "events": self._skipped_waiting})
            self._skipped_waiting = 0
        stepped = False
        while not waiting and self.learner.ready() and self._steps_since_candidate < lc.steps_per_candidate:
            stats = self.learner.step()
            if stats.train is not None:
                self._steps_since_candidate += 1
            if stats.events or stats.dropped_stale:
                stepped = True
                self._log({"kind": "learn_step", "trainer_version": self.learner.trainer.version,
                           **stats.to_json()})
        if events or stepped:
            self.store.set_learned_through(self.cursor, self.learner.trainer.version)
        return bool(events) or stepped

    def _candidate_due(self) -> bool:
        """After steps_per_candidate steps, or (candidate_every_s > 0) once that long has passed
        since the last candidate and at least one step was taken."""
        lc = self.oc.learner
        if self._steps_since_candidate >= lc.steps_per_candidate:
            return True
        return (lc.candidate_every_s > 0 and self._steps_since_candidate > 0
                and time.time() - self._last_candidate >= lc.candidate_every_s)

    def _maybe_make_candidate(self, records: list[VersionRecord]) -> bool:
        """Publish and register the learner's weights as a candidate once one is due and no
        other candidate or canary is in flight."""
        lc = self.oc.learner
        in_flight = any(r.status in ("candidate", "canary") for r in records)
        if not lc.enabled or not self._candidate_due() or in_flight:
            return False
        self._last_candidate = time.time()
        from tidal.online.version_sync import publish_model

        trainer = self.learner.trainer
        # Never a number already given to other weights (a reset continues above the registry).
        version = max(trainer.version, max(r.version for r in records) + 1)
        trainer.version = version
        digest = publish_model(trainer.model, self.weights_root, version, self.cfg.model.dtype)
        self.registry.register(VersionRecord(
            version=version, parent=self.base.version, manifest_sha256=digest, status="candidate",
            created=time.time(), weights=str(self.weights_root),
            note=f"online learner: {self._steps_since_candidate} steps on {self.base.version}"))
        self._own_candidate = version
        self._steps_since_candidate = 0
        self._log({"kind": "candidate", "version": version, "parent": self.base.version,
                   "manifest_sha256": digest})
        return True

    # ---------------------------------------------------------------- the gate

    def _gate_next_candidate(self, records: list[VersionRecord]) -> bool:
        """Gate the oldest candidate (one at a time, and not while a canary runs)."""
        if any(r.status == "canary" for r in records):
            return False
        candidates = sorted((r for r in records if r.status == "candidate"),
                            key=lambda r: r.created)
        if not candidates:
            return False
        record = candidates[0]
        if not self.oc.gate.enabled:
            self._start_canary(record, {"verdict": "skipped", "reason": "online.gate.enabled = false"})
            return True
        from tidal.online.gate import gate_verdict

        live = self._live(records)
        try:
            cand = self._measure(record)
        except Exception as err:  # a candidate whose weights fail verification never serves
            self.registry.update(record.version, status="blocked",
                                 gate={"verdict": "blocked", "passed": False, "error": str(err)})
            self._log({"kind": "gate", "version": record.version, "passed": False, "error": str(err)})
            self._after_rejection(record)
            return True
        inc = self._measure(live)
        result = gate_verdict(cand, inc, self.oc.gate)
        gate = {"verdict": "passed" if result.passed else "blocked", "passed": result.passed,
                "incumbent": live.version, "tests": finite_json(result.tests)}
        self._log({"kind": "gate", "version": record.version, **gate})
        if result.passed:
            self._start_canary(record, gate)
        else:
            self.registry.update(record.version, status="blocked", gate=gate)
            self._after_rejection(record)
        return True

    def _measure(self, record: VersionRecord):
        """The gate's measurement of one version (cached: the same seeds give the same result)."""
        if record.version in self._measured:
            return self._measured[record.version]
        from tidal.engine.engine import Engine
        from tidal.online.gate import measure

        model = self._load(record, self.cfg.model.dtype)
        engine = Engine(model, self.tokenizer, self.cfg.engine, version=record.version)
        result = measure(engine, self.env, self.heldout, self.guard_prompts, self.cfg.harness,
                         seed=self.cfg.run.seed,
                         min_confidence=self.cfg.env.integrity.min_confidence)
        self._measured[record.version] = result
        return result

    def _start_canary(self, record: VersionRecord, gate: dict) -> None:
        self.registry.update(record.version, gate=gate)
        self.registry.start_canary(record.version, self.oc.canary.share)
        started = self.store.max_feedback_seq()
        self.registry.update(record.version, canary={"started_seq": started,
                                                     "started": time.time()})
        self._log({"kind": "canary_start", "version": record.version,
                   "share": self.oc.canary.share, "started_seq": started})

    # ---------------------------------------------------------------- the canary

    def _advance_canary(self, records: list[VersionRecord]) -> bool:
        """Take the canary's decision on its feedback so far; act on promote / rollback."""
        from tidal.online.canary import canary_decision

        canaries = [r for r in records if r.status == "canary"]
        if not canaries:
            return False
        record = canaries[0]
        live = self._live(records)
        since = int(record.canary.get("started_seq", 0))
        cand = self.store.outcomes(record.version, since)
        inc = self.store.outcomes(live.version, since)
        decision = canary_decision(cand, inc, self.oc.canary, self.reward)
        if decision.action == "continue":
            return False
        canary = {**record.canary, "decision": decision.action, "reason": decision.reason,
                  "stats": finite_json(decision.stats), "incumbent": live.version,
                  "decided": time.time()}
        self.registry.update(record.version, canary=canary)
        self._log({"kind": "canary_decision", "version": record.version, **canary})
        if decision.action == "promote":
            self.registry.promote(record.version)
            self._measured.pop(live.version, None)
            if record.version != self._own_candidate:
                self._reset_to_live()  # someone else's version is live now: learn on from it
            else:
                self.base = self._live()
                self._own_candidate = None
        else:
            self.registry.rollback(record.version)
            self._after_rejection(record)
        return True

    def _after_rejection(self, record: VersionRecord) -> None:
        """The learner's own candidate failed: start again from the live version's weights."""
        if record.version == self._own_candidate:
            self._reset_to_live()

    # ---------------------------------------------------------------- records

    def _log(self, record: dict) -> None:
        self.metrics.write({"time": time.time(), **record})

    def run(self, stop) -> None:
        """Tick until ``stop`` (an Event) is set."""
        while not stop.is_set():
            if not self.tick():
                stop.wait(0.2)


def _exit_with_parent() -> None:
    """A learner whose server died (kill -9 leaves no time to stop it) exits too."""
    import os
    import threading

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def learner_main(cfg_json: str, run_dir: str, database_url: str, stop=None) -> None:
    """Entry point of the learner child process (spawned by ``tidal serve``)."""
    import faulthandler
    import os
    import signal
    import threading
    import traceback

    from tidal.config import TidalConfig
    from tidal.online.store import OnlineStore, VersionRegistry

    cfg = TidalConfig.model_validate_json(cfg_json)
    torch.set_num_threads(cfg.online.learner.threads)
    if cfg.online.learner.nice:
        os.nice(cfg.online.learner.nice)
    _exit_with_parent()
    log = open(Path(run_dir) / "learner.log", "a", buffering=1)
    faulthandler.enable(log)
    faulthandler.register(signal.SIGUSR1, log, all_threads=True)  # `kill -USR1 PID`: where is it?
    store = OnlineStore.open(database_url, Path(run_dir))
    try:
        loop = OnlineLoop(cfg, Path(run_dir), store, VersionRegistry(store))
        loop.run(stop or threading.Event())
    except BaseException:
        log.write(traceback.format_exc())
        raise
    finally:
        log.write(f"learner exits at {time.time():.3f}\n")
