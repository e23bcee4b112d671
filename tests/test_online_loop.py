"""The learner process's loop (tidal.online.service.OnlineLoop) on a real store, registry and
weight store: feedback -> a learner step -> a candidate -> the gate -> a canary -> promoted; a
worse candidate rolled back from its canary, bit-exact to the incumbent as the server then
serves it; a candidate whose weights do not match its manifest hash blocked. A tiny model on the
byte tokenizer, the funcs environment's tasks."""

import time

import pytest
import torch

from tidal.config import load_config
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationRequest
from tidal.env.registry import from_config
from tidal.model.checkpoint import save_pretrained
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer
from tidal.online.candidates import worse_candidate
from tidal.online.records import FeedbackEvent, ServedResponse, VersionRecord
from tidal.online.service import OnlineLoop
from tidal.online.serving import PolicyServer
from tidal.online.store import OnlineStore, VersionRegistry
from tidal.online.version_sync import VersionLoader, publish_checkpoint, publish_model

TOK = ByteTokenizer()
OVERRIDES = [
    "--engine.max_seq_len", "256", "--engine.max_new_tokens", "24", "--engine.max_batch_size", "16",
    "--online.learner.events_per_step", "8", "--online.learner.steps_per_candidate", "1",
    # A learning rate this small leaves the greedy outputs as they were, so the gate passes
    # the learner's candidate whatever this random model does.
    "--online.learner.lr", "1e-12",
    "--online.gate.heldout_tasks", "8", "--online.gate.guard_prompts", "8",
    "--online.canary.min_events", "8", "--online.canary.min_test_events", "4",
    "--online.canary.max_events", "32", "--orchestrator.heldout_tasks", "8",
]


class Run:
    def __init__(self, tmp_path, extra: list[str] = ()):
        self.dir = tmp_path / "run"
        self.cfg = load_config(None, OVERRIDES + list(extra))
        self.model = build_model(preset("tiny"), seed=0).eval()
        save_pretrained(self.model, tmp_path / "ck", TOK)
        self.store = OnlineStore.open("", self.dir)
        self.registry = VersionRegistry(self.store)
        sha = publish_checkpoint(tmp_path / "ck", self.dir / "weights", 0, "float32")
        self.registry.register(VersionRecord(0, None, sha, "live", time.time(), share=1.0,
                                             gate={"verdict": "skipped"}))
        self.loop = OnlineLoop(self.cfg, self.dir, self.store, self.registry)
        env = from_config(self.cfg.env)
        self.prompts = [t.prompt for t in env.sample_tasks(16, 5, False)]
        self.n = 0

    def serve(self, version: int, signals: list[str]) -> None:
        """Responses sampled from ``version``'s weights, stored with their feedback."""
        record = self.registry.get(version)
        model = self.loop.loader.load(version, record.manifest_sha256, "float32")
        engine = Engine(model, TOK, self.cfg.engine, version=version)
        prompts = [TOK.encode(self.prompts[i % len(self.prompts)], add_bos=True)
                   for i in range(len(signals))]
        results = engine.generate([GenerationRequest(p, seed=self.n + i) for i, p in enumerate(prompts)])
        responses = []
        for r in results:
            self.n += 1
            responses.append(ServedResponse(
                id=f"cmpl-{self.n}", index=0, created=time.time(), version=version,
                manifest_sha256=record.manifest_sha256, endpoint="completions",
                prompt_ids=r.prompt_ids, token_ids=r.token_ids, logprobs=r.logprobs,
                text=r.text, finish_reason=r.finish_reason, temperature=1.0, latency_ms=1.0,
                behaviour="action"))
        self.store.write_responses(responses)
        outcomes = self.store.write_feedback([FeedbackEvent(r.id, s) for r, s in zip(responses, signals)])
        assert outcomes == ["stored"] * len(signals)

    def status(self, version: int) -> str:
        return self.registry.get(version).status


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path)
    yield r
    r.loop.loader.close()
    r.store.close()


def test_feedback_to_a_promoted_version(run):
    run.serve(0, ["accepted", "rejected"] * 4)
    assert run.loop.tick()  # one learner step, a candidate, its gate, its canary
    [candidate] = [r for r in run.registry.all() if r.version != 0]
    assert candidate.parent == 0 and candidate.status == "canary", candidate.gate
    assert candidate.gate["verdict"] == "passed" and "heldout_pass1" in candidate.gate["tests"]
    assert run.store.learned_through() == 8
    live = run.registry.get(0)
    assert live.share == pytest.approx(1 - run.cfg.online.canary.share)
    # The canary's users accept everything, the incumbent's half: promoted at min_events.
    run.serve(candidate.version, ["accepted"] * 8)
    run.serve(0, ["accepted", "rejected"] * 4)
    assert run.loop.tick()
    assert run.status(candidate.version) == "live" and run.status(0) == "retired"
    assert run.registry.get(candidate.version).canary["decision"] == "promote"
    assert run.loop.base.version == candidate.version
    # What is live is exactly what the learner published (its digest, verified on load).
    loaded = run.loop.loader.load(candidate.version, candidate.manifest_sha256, "float32")
    for a, b in zip(loaded.state_dict().values(), run.loop.learner.trainer.model.state_dict().values()):
        assert torch.equal(a, b)


def test_worse_canary_rolls_back_bit_exact_to_the_incumbent(run):
    worse = worse_candidate(run.model, seed=1, scale=0.5)
    digest = publish_model(worse, run.dir / "weights", 50, "float32")
    run.registry.register(VersionRecord(50, 0, digest, "candidate", time.time(),
                                        gate={"verdict": "skipped", "reason": "by hand"}))
    run.registry.start_canary(50, 0.25)
    run.registry.update(50, canary={"started_seq": run.store.max_feedback_seq()})
    run.serve(50, ["rejected"] * 12)
    run.serve(0, ["accepted"] * 12)
    run.loop.tick()
    assert run.status(50) == "rolled_back" and run.status(0) == "live"
    assert run.registry.get(0).share == 1.0
    assert "accept_rate" in run.registry.get(50).canary["reason"]
    # The server, refreshed from the registry, serves the incumbent's exact weights again.
    policy = PolicyServer(run.cfg.engine, TOK, VersionLoader(run.dir / "weights"))
    try:
        policy.refresh(run.registry.live_versions())
        assert policy.live == 0 and policy.canary is None
        served = policy._held[0].engine.model.state_dict()
        for name, tensor in run.model.state_dict().items():
            assert torch.equal(served[name], tensor), name
    finally:
        policy.loader.close()


def test_a_candidate_whose_weights_do_not_match_its_hash_is_blocked(run):
    worse = worse_candidate(run.model, seed=2, scale=0.1)
    publish_model(worse, run.dir / "weights", 60, "float32")
    run.registry.register(VersionRecord(60, 0, "0" * 64, "candidate", time.time()))
    assert run.loop.tick()
    record = run.registry.get(60)
    assert record.status == "blocked" and "digest" in record.gate["error"]
    assert run.status(0) == "live"


def test_a_candidate_on_a_schedule(tmp_path):
    """online.learner.candidate_every_s: a candidate once that long passed and a step was taken,
    before steps_per_candidate."""
    r = Run(tmp_path, ["--online.learner.steps_per_candidate", "100",
                       "--online.learner.candidate_every_s", "0.01", "--online.gate.enabled", "false"])
    try:
        r.serve(0, ["accepted", "rejected"] * 4)
        time.sleep(0.02)
        assert r.loop.tick()
        [candidate] = [v for v in r.registry.all() if v.version != 0]
        assert candidate.status == "canary" and candidate.gate["verdict"] == "skipped"
    finally:
        r.loop.loader.close()
        r.store.close()
