"""engine.backend = "remote": generation through `tidal serve` as a child process, on a tiny MoE
model built here. The remote backend's tokens, logprobs and experts equal the built-in engine's
on the same weights; a weight update through POST /v1/tidal/update_weights changes the version
and the outputs; replies of the wrong weights or too old a version are refused; a dead or
silent server is an error within the configured timeouts, never a hang; router replay
"required" on a server that reports no experts is a config error at start."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request

import pytest
import torch
from aiohttp import web

from tidal.bench.online_server import ServerProcess, free_port
from tidal.config import ConfigError, load_config
from tidal.engine import Engine, EngineConfig, GenerationRequest
from tidal.engine.remote import RemoteEngine, RemoteEngineError, StaleReply
from tidal.engine.remote.kinds import Reply
from tidal.errors import UserError
from tidal.model.checkpoint import save_pretrained
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer
from tidal.online.version_sync import weights_digest
from tidal.sync.config import SyncConfig
from tidal.sync.transport import HttpWeightPublisher

ENGINE = ["--engine.max_seq_len", "128", "--engine.max_new_tokens", "16",
          "--engine.max_batch_size", "8"]
SERVE = [*ENGINE, "--online.learner.enabled", "false", "--online.serve.max_tokens", "16",
         "--model.dtype", "float32", "--trainer.dtype", "float32"]
PROMPTS = [[1, 100, 101, 102], [1, 40, 41], [1, 7, 8, 9, 10, 11, 12], [1, 200]]


def remote_cfg(url: str, **remote) -> EngineConfig:
    cfg = load_config(None, ENGINE).engine
    return cfg.model_copy(update={"backend": "remote", "remote": cfg.remote.model_copy(
        update={"url": url, "request_timeout_s": 60.0, "retry_backoff_s": 0.05, **remote})})


def requests(temperature: float) -> list[GenerationRequest]:
    return [GenerationRequest(p, temperature=temperature, seed=1000 + i, stop=[])
            for i, p in enumerate(PROMPTS)]


def builtin(model) -> Engine:
    return Engine(model, ByteTokenizer(), load_config(None, ENGINE).engine)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, its url, the model it serves as version 0, the publisher of the run's weights).
    The server's admin key is in TIDAL_API_KEY meanwhile, where a worker's engine reads it."""
    root = tmp_path_factory.mktemp("remote")
    model = build_model(preset("tiny-moe"), seed=0)
    save_pretrained(model, root / "ck", ByteTokenizer())
    server = ServerProcess(load_config(None, SERVE), root / "serve", root / "ck", SERVE)
    url = server.start()
    publisher = HttpWeightPublisher(root / "weights", SyncConfig(), "float32")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TIDAL_API_KEY", server.admin_key)
        try:
            yield server, url, model, publisher
        finally:
            publisher.close()
            server.stop()


def engine_for(url: str, model, publisher=None, **kw) -> RemoteEngine:
    return RemoteEngine(remote_cfg(url), ByteTokenizer(), model.config,
                        weights=publisher.address if publisher else "", **kw)


def assert_same(local, remote):
    for a, b in zip(local, remote, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-6)
        assert a.experts == b.experts and a.prompt_experts == b.prompt_experts


@pytest.mark.slow  # a tidal serve child process
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_remote_equals_builtin_on_the_same_weights(served, temperature):
    _, url, model, _ = served
    local = builtin(model).generate(requests(temperature))
    remote = engine_for(url, model)
    try:
        got = remote.generate(requests(temperature))
    finally:
        remote.close()
    assert_same(local, got)
    assert [r.logprobs for r in local] == [r.logprobs for r in got]  # bit for bit, as measured
    assert all(v == 0 for r in got for v in r.versions)
    assert got[0].experts is not None and len(got[0].experts[0]) == model.config.num_hidden_layers


@pytest.mark.slow  # a tidal serve child process
def test_weight_update_changes_version_and_outputs_and_old_versions_are_refused(served):
    _, url, model, publisher = served
    newer = build_model(preset("tiny-moe"), seed=1)
    publisher.publish(newer, 1)
    remote = engine_for(url, model, publisher, max_lag=0)
    try:
        before = remote.generate(requests(0.0))
        remote.load_weights(None, 1)
        assert remote.version == 1
        after = remote.generate(requests(0.0))
        assert all(v == 1 for r in after for v in r.versions)
        assert [r.token_ids for r in after] != [r.token_ids for r in before]
        assert_same(builtin(newer).generate(requests(0.0)), after)
        assert remote._digests[1] == weights_digest(publisher.publisher.store.manifest(1, "anchor"))
        # a reply of an older version than the bound allows is refused, not used
        remote._version = 3
        with pytest.raises(StaleReply, match="staleness bound"):
            remote._checked(Reply([1], [0.0], "eos", 1, remote._digests[1]), 3)
        remote._version = 1
        # a reply naming a version this worker loaded, with other weights, is refused
        remote._digests[1] = "0" * 64
        with pytest.raises(RemoteEngineError, match="other weights under that number"):
            remote.generate(requests(0.0)[:1])
    finally:
        remote.close()


@pytest.mark.slow  # a tidal serve child process
def test_a_version_number_never_names_two_sets_of_weights(served, tmp_path):
    _, url, model, publisher = served
    if publisher.latest_version() != 1:
        publisher.publish(build_model(preset("tiny-moe"), seed=1), 1)
    first = engine_for(url, model, publisher)
    first.load_weights(None, 1)
    first.close()
    other = HttpWeightPublisher(tmp_path / "other", SyncConfig(), "float32")
    try:
        other.publish(build_model(preset("tiny-moe"), seed=2), 1)
        remote = engine_for(url, model, other)
        try:
            with pytest.raises(RemoteEngineError, match="already registered"):
                remote.load_weights(None, 1)
        finally:
            remote.close()
    finally:
        other.close()


@pytest.mark.slow  # a tidal serve child process
def test_a_worker_without_the_right_key_is_told_which_to_give(served):
    server, url, model, publisher = served
    with pytest.raises(RemoteEngineError, match="HTTP 401 .*sent none: set the environment "
                                                "variable TIDAL_API_KEY"):
        RemoteEngine(remote_cfg(url), ByteTokenizer(), model.config, api_key="")
    remote = RemoteEngine(remote_cfg(url), ByteTokenizer(), model.config,
                          weights=publisher.address, api_key=server.user_key)
    try:
        assert remote.generate(requests(0.0)[:1])[0].token_ids  # a user key may generate
        with pytest.raises(RemoteEngineError, match="HTTP 403 .*needs an admin key"):
            remote.load_weights(None, 0)
    finally:
        remote.close()


def test_a_server_that_is_down_is_a_clear_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RemoteEngineError, match=f"cannot reach the inference server at {url}"):
        RemoteEngine(remote_cfg(url), ByteTokenizer(), preset("tiny").model_copy())


class Silent:
    """An HTTP server that answers the probe and never answers a generation."""

    def __init__(self):
        async def models(_):
            return web.json_response({"data": []})

        async def hang(_):
            await asyncio.sleep(3600)

        async def update(request):
            body = await request.json()
            return web.json_response({"version": body["version"], "manifest_sha256": "0" * 64})

        app = web.Application()
        app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", hang),
                        web.post("/v1/tidal/update_weights", update)])
        self.port = _serve(app)


def test_a_silent_server_fails_the_request_after_the_timeout_and_retries():
    silent = Silent()
    cfg = remote_cfg(f"http://127.0.0.1:{silent.port}", request_timeout_s=0.3, retries=1)
    remote = RemoteEngine(cfg, ByteTokenizer(), preset("tiny").model_copy())
    try:
        remote.submit(requests(0.0)[0])
        with pytest.raises(RemoteEngineError, match=r"failed 2 times .*no answer within 0.3 s"):
            for _ in range(10_000):  # each step waits at most poll_s; the request ends the loop
                remote.step()
    finally:
        remote.close()


def test_a_worker_whose_server_stops_answering_raises_from_its_rollout(tmp_path):
    """What the orchestrator sees as a dead worker (scheduler.fail: replaced, assignment re-run)."""
    from tidal.orchestrator.worker import Assignment, RolloutWorker
    from tidal.sync.transport import FilesystemWeightStore

    silent = Silent()
    cfg = load_config(None, [
        "--model.hidden_size", "32", "--model.num_hidden_layers", "1",
        "--model.num_attention_heads", "2", "--model.num_key_value_heads", "1",
        "--model.head_dim", "16", "--model.intermediate_size", "64", "--sync.transport",
        "filesystem", "--engine.backend", "remote", "--engine.remote.url",
        f"http://127.0.0.1:{silent.port}", "--engine.remote.request_timeout_s", "0.3",
        "--engine.remote.retries", "1", "--engine.remote.retry_backoff_s", "0.05"])
    model = build_model(cfg.model, seed=0)
    save_pretrained(model, tmp_path / "ck")
    store = FilesystemWeightStore(tmp_path / "weights")
    store.publish(model, 0)
    worker = RolloutWorker(cfg, str(tmp_path / "ck"), store.address, 0)
    assert worker.engine.needs_local_weights is False
    tasks = worker.env.sample_tasks(1, 0, False)
    with pytest.raises(RemoteEngineError, match="no answer within 0.3 s"):
        worker.rollout(Assignment(0, 0, tasks, [0], min_version=0))
    assert worker.engine.version == 0  # the reload reached the server before generation


def test_an_sglang_server_reloads_from_the_folder_and_its_replies_are_read(tmp_path):
    calls = []

    async def info(_):
        return web.json_response({"model_path": "x", "weight_version": "0"})

    async def generate(request):
        body = await request.json()
        calls.append(("generate", body))
        n = body["sampling_params"]["max_new_tokens"]
        rows = [[-0.5, 10 + i, None] for i in range(n)]
        return web.json_response({"text": "", "meta_info": {
            "output_token_logprobs": rows, "finish_reason": {"type": "length", "length": n},
            "weight_version": calls[-2][1]["weight_version"] if len(calls) > 1 else "0"}})

    async def update(request):
        calls.append(("update", await request.json()))
        return web.json_response({"success": True, "message": "ok"})

    app = web.Application()
    app.add_routes([web.get("/get_model_info", info), web.post("/generate", generate),
                    web.post("/update_weights_from_disk", update)])
    server = _serve(app)
    written = []
    cfg = remote_cfg(f"http://127.0.0.1:{server}", kind="sglang", weights_dir=str(tmp_path / "w"))
    remote = RemoteEngine(cfg, ByteTokenizer(), preset("tiny"),
                          write_folder=lambda m, v: written.append(v))
    try:
        remote.load_weights(object(), 3)
        got = remote.generate([GenerationRequest([1, 2], max_new_tokens=4, temperature=0.0)])[0]
    finally:
        remote.close()
    assert written == [3] and calls[0] == ("update", {"model_path": str(tmp_path / "w"),
                                                      "weight_version": "3"})
    params = calls[1][1]["sampling_params"]
    assert calls[1][1]["input_ids"] == [1, 2] and params["max_new_tokens"] == 4
    assert params["no_stop_trim"] is True and params["stop"] == ["\n\n"]  # the engine default
    assert got.token_ids == [10, 11, 12, 13] and got.logprobs == [-0.5] * 4
    assert got.versions == [3] * 4 and got.finish_reason == "length"


def _serve(app) -> int:
    """Serve an aiohttp app from a thread; returns its port."""
    loop = asyncio.new_event_loop()
    port = free_port()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return port


def test_router_replay_required_without_expert_ids_is_a_config_error_at_start():
    cfg = remote_cfg("http://127.0.0.1:9", kind="vllm", weights_dir="/tmp/x")
    with pytest.raises(UserError, match="router_replay = 'if_available'"):
        RemoteEngine(cfg, ByteTokenizer(), preset("tiny-moe"), router_replay="required")
    with pytest.raises(ConfigError, match="router_replay = 'if_available'"):  # the recipe itself
        load_config(None, ["--model.num_experts", "8", "--engine.backend", "remote",
                           "--engine.remote.url", "http://127.0.0.1:9", "--engine.remote.kind",
                           "sglang", "--engine.remote.weights_dir", "/tmp/x"])


@pytest.mark.slow  # a tidal serve child process
def test_a_version_from_a_weights_folder_is_served_with_its_tensors_digest(served, tmp_path):
    from tidal.model.checkpoint import to_hf_state_dict
    from tidal.online.version_sync import tensors_digest
    from tidal.sync.tensors import bits_of
    from tidal.sync.transport import FilesystemWeightStore

    _, url, model, _ = served
    store = FilesystemWeightStore(tmp_path / "weights")
    newer = build_model(preset("tiny-moe"), seed=5)
    store.publish(newer, 7)
    remote = RemoteEngine(remote_cfg(url), ByteTokenizer(), model.config, weights=store.address,
                          transport="filesystem", max_lag=0)
    try:
        remote.load_weights(None, 7)
        got = remote.generate(requests(0.0))
    finally:
        remote.close()
    assert all(v == 7 for r in got for v in r.versions)
    assert_same(builtin(newer).generate(requests(0.0)), got)
    want = tensors_digest([bits_of(k, v) for k, v in to_hf_state_dict(newer).items()])
    assert remote._digests[7] == want


@pytest.mark.slow  # a tidal serve child process
def test_a_server_killed_mid_run_fails_the_worker_quickly(served):
    """Last in this file: it kills the module's server."""
    server, url, model, _ = served
    cfg = remote_cfg(url, request_timeout_s=5.0, retries=1, connect_timeout_s=1.0)
    remote = RemoteEngine(cfg, ByteTokenizer(), model.config)
    try:
        remote.generate(requests(0.0)[:1])
        server.kill9()
        remote.submit(requests(0.0)[0])
        with pytest.raises(RemoteEngineError, match="failed 2 times"):
            for _ in range(100_000):
                remote.step()
    finally:
        remote.close()


@pytest.mark.slow
def test_a_few_rl_steps_generate_through_tidal_serve(tmp_path, monkeypatch):
    """`tidal train`'s loop with engine.backend = "remote": every rollout token comes from the
    server, each step's weights reach it through /v1/tidal/update_weights."""
    from tidal.orchestrator.loop import run_rl

    tiny = ["--model.hidden_size", "32", "--model.num_hidden_layers", "1",
            "--model.num_attention_heads", "2", "--model.num_key_value_heads", "1",
            "--model.head_dim", "16", "--model.intermediate_size", "64",
            "--engine.max_new_tokens", "12", "--online.serve.max_tokens", "12"]
    cfg = load_config(None, tiny)
    save_pretrained(build_model(cfg.model, seed=0), tmp_path / "ck")
    server = ServerProcess(cfg, tmp_path / "serve", tmp_path / "ck",
                           ["--online.learner.enabled", "false"])
    url = server.start()
    monkeypatch.setenv("TIDAL_API_KEY", server.admin_key)  # the rollout workers' key
    try:
        train = load_config(None, [
            *tiny, "--orchestrator.tasks_per_step", "4", "--orchestrator.group_size", "2",
            "--orchestrator.heldout_tasks", "4", "--orchestrator.eval_every", "0",
            "--orchestrator.checkpoint_every", "0", "--orchestrator.backend", "local",
            "--orchestrator.steps", "3", "--orchestrator.max_staleness", "1",
            "--env.sandbox.concurrency", "2", "--engine.backend", "remote",
            "--engine.remote.url", url])
        summary = run_rl(train, tmp_path / "run", tmp_path / "ck", progress=False)
        assert summary.steps == 3 and summary.trajectories == 3 * 4 * 2
        ask = urllib.request.Request(f"{url}/v1/tidal/status", headers=server.headers())
        status = json.loads(urllib.request.urlopen(ask, timeout=30).read())
        assert status["live"] >= 1  # the server serves what the run published
    finally:
        server.stop()
