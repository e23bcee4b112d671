"""`tidal serve` as a user runs it: a child process on a tiny checkpoint, the official openai
client, feedback over HTTP, a kill -9 in the middle of a feedback load, a restart, and the
acknowledged events counted in the store; and 429 + Retry-After once the learner is too far
behind."""

import asyncio
import json
import urllib.request

import openai
import pytest

from tidal.bench.online_ingest import kill_during_load, post_feedback, seed_responses, stored_feedback_ids
from tidal.bench.online_server import ServerProcess
from tidal.config import load_config
from tidal.model.checkpoint import save_pretrained
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer
from tidal.online.store import OnlineStore, VersionRegistry

pytestmark = pytest.mark.slow

SMALL = ["--engine.max_seq_len", "128", "--engine.max_new_tokens", "16",
         "--engine.max_batch_size", "8"]


@pytest.fixture
def checkpoint(tmp_path):
    save_pretrained(build_model(preset("tiny"), seed=0), tmp_path / "ck", ByteTokenizer())
    return tmp_path / "ck"


def test_no_acknowledged_feedback_is_lost_to_kill_9(tmp_path, checkpoint):
    cfg = load_config(None, SMALL)
    run = tmp_path / "run"
    server = ServerProcess(cfg, run, checkpoint, ["--online.learner.enabled", "false"])
    url = server.start()
    try:
        client = openai.OpenAI(api_key=server.user_key, base_url=f"{url}/v1", max_retries=0)
        done = client.completions.create(model="tidal", prompt="def f(x):", max_tokens=8)
        assert done.tidal_version == 0
        body = json.dumps({"response_id": done.id, "signal": "accepted"}).encode()
        request = urllib.request.Request(f"{url}/v1/feedback", body,
                                         {"Content-Type": "application/json", **server.headers()})
        with urllib.request.urlopen(request, timeout=30) as r:
            assert json.loads(r.read())["status"] == "stored"
        store = OnlineStore.open("", run)
        live = VersionRegistry(store).live()
        ids = seed_responses(store, live.version, live.manifest_sha256, 6000, "load")
        result = kill_during_load(server, url, ids, 32, kill_after_s=1.5)
        assert server.proc.returncode is not None and len(result["acked"]) > 0
        server.start()  # a restart on the same run: the store opens as it was left
        stored = stored_feedback_ids(OnlineStore.open("", run))
        assert set(result["acked"]) <= stored, sorted(set(result["acked"]) - stored)[:5]
        assert done.id in stored
    finally:
        server.stop()


def test_feedback_answers_429_with_retry_after_when_the_learner_is_behind(tmp_path, checkpoint):
    cfg = load_config(None, SMALL)
    run = tmp_path / "run"
    server = ServerProcess(cfg, run, checkpoint, ["--online.learner.enabled", "false",
                                                   "--online.learner.max_backlog", "20"])
    url = server.start()
    try:
        store = OnlineStore.open("", run)
        live = VersionRegistry(store).live()
        ids = seed_responses(store, live.version, live.manifest_sha256, 200, "bp")
        result = asyncio.run(post_feedback(url, ids, 4, headers=server.headers()))
        assert result["statuses"].get(429, 0) > 0 and result["statuses"].get(200, 0) >= 20
        assert all(r.isdigit() and int(r) >= 1 for r in result["retry_after"])
        stored = stored_feedback_ids(OnlineStore.open("", run))
        assert stored == set(result["acked"])  # a refused event stored nothing
    finally:
        server.stop()
