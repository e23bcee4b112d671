"""The policy server and its versions: weights published and loaded back through weight sync
(bit-exact, digest checked), corrupt or misnamed versions refused while the old one serves,
canary routing, swaps between steps, and `tidal serve`."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tidal.engine.config import EngineConfig
from tidal.model.checkpoint import save_pretrained, to_hf_state_dict
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer
from tidal.online.records import VersionRecord
from tidal.online.serving import PolicyServer, Sampling
from tidal.online.version_sync import (VersionLoader, WeightsMismatch, publish_model, tensors_digest,
                                       weights_digest)
from tidal.sync.config import SyncConfig
from tidal.sync.origin import VersionStore
from tidal.sync.tensors import bits_of

TOK = ByteTokenizer()
ENGINE = EngineConfig(max_batch_size=4, max_seq_len=64, max_new_tokens=16, stop=[])


def model(seed: int):
    return build_model(preset("tiny").model_copy(update={"initializer_range": 0.1}), seed=seed).eval()


def bit_equal(a, b) -> bool:
    sa, sb = to_hf_state_dict(a), to_hf_state_dict(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].view(torch.int32), sb[k].view(torch.int32))
                                          for k in sa)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Versions 0, 1, 2 of three different models (2 has a delta and an anchor form)."""
    root = tmp_path_factory.mktemp("weights")
    models = [model(s) for s in range(3)]
    cfg = SyncConfig(anchor_every=2)
    shas = [publish_model(m, root, v, "float32", cfg) for v, m in enumerate(models)]
    loader = VersionLoader(root)
    yield root, models, shas, loader
    loader.close()


def record(version, sha, status="live", share=0.0):
    return VersionRecord(version, None, sha, status, 0.0, share=share)


# ---------------------------------------------------------------- weights


def test_digest_same_for_delta_and_anchor_and_bytes(store):
    root, models, shas, _ = store
    vs = VersionStore(root)
    assert vs.has(2, "delta") and vs.has(2, "anchor")
    assert weights_digest(vs.manifest(2, "delta")) == weights_digest(vs.manifest(2, "anchor")) == shas[2]
    assert tensors_digest([bits_of(k, v) for k, v in to_hf_state_dict(models[2]).items()]) == shas[2]
    assert len(set(shas)) == 3


def test_loading_back_is_bit_exact_including_rollback(store):
    _, models, shas, loader = store
    for v in (2, 0, 1, 0):  # forward, back to the first (a rollback), and again
        assert bit_equal(loader.load(v, shas[v], "float32"), models[v])


def test_wrong_digest_is_refused(store):
    _, _, shas, loader = store
    with pytest.raises(WeightsMismatch, match="registry records"):
        loader.load(1, shas[0], "float32")


# ---------------------------------------------------------------- serving


def serve(loader, *records) -> PolicyServer:
    policy = PolicyServer(ENGINE, TOK, loader, seed=0)
    policy.refresh(list(records))
    return policy


async def run_one(policy, prompt="def f(", n=1, **kw):
    gen = await policy.generate(TOK.encode(prompt), Sampling(max_tokens=8, temperature=0.0), n, **kw)
    return gen, await gen.results()


def test_corrupt_version_refused_old_keeps_serving(tmp_path):
    m0, m1 = model(0), model(1)
    sha0 = publish_model(m0, tmp_path, 0, "float32")
    sha1 = publish_model(m1, tmp_path, 1, "float32")
    data = VersionStore(tmp_path).data_path(1, "delta")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    loader = VersionLoader(tmp_path, SyncConfig(retries=0))
    try:
        policy = serve(loader, record(0, sha0))
        policy.refresh([record(1, sha1)])  # the corrupt one, now "live" in the registry
        assert policy.live == 0
        assert "refused version 1" in policy.errors[-1]["message"]
        status = policy.status()
        assert [v["version"] for v in status["versions"]] == [0] and status["errors"]

        async def main():
            policy.start()
            try:
                gen, results = await run_one(policy)
            finally:
                policy.stop()
            return gen, results

        gen, results = asyncio.run(main())
        assert gen.version == 0 and gen.manifest_sha256 == sha0 and set(results[0].versions) == {0}
    finally:
        loader.close()


def test_registry_digest_mismatch_refused(store):
    _, _, shas, loader = store
    policy = serve(loader, record(0, shas[0]))
    policy.refresh([record(1, shas[2])])
    assert policy.live == 0 and "registry records" in policy.errors[-1]["message"]
    policy.refresh([record(1, shas[2])])  # not retried every poll
    assert len(policy.errors) == 1


def test_canary_routing_and_versions(store):
    _, _, shas, loader = store
    policy = serve(loader, record(0, shas[0]), record(1, shas[1], "canary", share=0.3))
    assert (policy.live, policy.canary) == (0, 1)
    routes = [policy.route() for _ in range(2000)]
    assert 0.25 < routes.count(1) / len(routes) < 0.35

    async def main():
        policy.start()
        try:
            out = [await run_one(policy, version=v) for v in (0, 1)]
        finally:
            policy.stop()
        return out

    (g0, r0), (g1, r1) = asyncio.run(main())
    assert (g0.version, g0.manifest_sha256) == (0, shas[0]) and set(r0[0].versions) == {0}
    assert (g1.version, g1.manifest_sha256) == (1, shas[1]) and set(r1[0].versions) == {1}
    assert r0[0].token_ids != r1[0].token_ids  # different weights really serve
    policy.refresh([record(1, shas[1])])  # promoted: the canary becomes live, 0 is dropped
    assert (policy.live, policy.canary) == (1, None)


def test_swap_in_flight_finishes_on_its_version(store):
    _, _, shas, loader = store
    policy = serve(loader, record(0, shas[0]))

    async def main():
        policy.start()
        try:
            policy.pause()
            gen = await policy.generate(TOK.encode("abc"), Sampling(max_tokens=12), 2, stream=True)
            await asyncio.to_thread(policy.refresh, [record(2, shas[2])])
            policy.resume()
            events = [e async for e in gen.events()]
            old = await gen.results()
            _, new = await run_one(policy)
            while len(policy.status()["versions"]) > 1:  # version 0 is dropped once idle
                await asyncio.sleep(0.01)
        finally:
            policy.stop()
        return gen, events, old, new

    gen, events, old, new = asyncio.run(main())
    assert gen.version == 0 and all(set(r.versions) == {0} for r in old)
    for i, r in enumerate(old):  # the streamed deltas add up to each choice's tokens
        assert [t for e in events if e.index == i for t in e.token_ids] == r.token_ids
    assert set(new[0].versions) == {2}
    assert [v["version"] for v in policy.status()["versions"]] == [2]


def test_poll_follows_the_registry(store):
    _, _, shas, loader = store
    policy = serve(loader, record(0, shas[0]))
    registry = [record(0, shas[0])]

    async def main():
        task = asyncio.create_task(policy.poll(lambda: list(registry), 0.01))
        registry[:] = [record(1, shas[1])]
        while policy.live != 1:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    assert policy.sha_of(1) == shas[1]


def test_an_update_during_a_registry_read_is_not_switched_back(store):
    """A training run's weight update (online/update.py: under policy.refreshing it adds the
    version, writes the registry and routes to it) landing just after the poll read the
    registry: the poll must not then route back to what it read. (It did: the poll read outside
    the lock, and a run's server served the old version until the next poll.)"""
    _, _, shas, loader = store
    policy = serve(loader, record(0, shas[0]))
    registry = [record(0, shas[0])]
    updating = threading.Event()

    def update():  # WeightUpdater.update's order
        with policy.refreshing:
            updating.set()
            policy.add_version(1, shas[1], loader.load(1, shas[1], "float32"), "live")
            registry[:] = [record(1, shas[1])]
            policy.set_live(1)

    updater = threading.Thread(target=update)

    def read():
        snapshot = list(registry)
        if not updater.is_alive() and not updating.is_set():
            updater.start()
            updating.wait(timeout=1.0)  # the update takes the lock now, unless the poll holds it
        return snapshot

    refreshed = threading.Event()
    original = policy._refresh

    def tracked(records):
        original(records)
        refreshed.set()

    policy._refresh = tracked

    async def main():
        task = asyncio.create_task(policy.poll(read, 60.0))
        while not refreshed.is_set():
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    updater.join()
    assert policy.live == 1


def test_prompt_checks():
    from tidal.online.serving import PromptError

    policy = PolicyServer(ENGINE, TOK)
    with pytest.raises(PromptError, match="at most 63"):
        policy.check_prompt([1] * 64)
    with pytest.raises(PromptError, match=r"\[0, 260\)"):
        policy.check_prompt([300])


# ---------------------------------------------------------------- tidal serve


KEY = "serving-test-user-key-0123456789"


def test_build_server_from_checkpoint_then_run_dir(tmp_path, monkeypatch):
    from tidal.cli.serve import build_server
    from tidal.config import load_config

    monkeypatch.setenv("TIDAL_API_KEYS", KEY)
    save_pretrained(model(0), tmp_path / "ck", TOK)
    cfg = load_config(None, ["--engine.max_seq_len", "64", "--engine.max_new_tokens", "16"])
    parts = build_server(cfg, tmp_path / "run", tmp_path / "ck", port=0)
    try:
        assert parts.version == 0 and parts.policy.live == 0
        assert parts.keys.counts() == {"user": 1, "admin": 0}
        assert parts.manifest_sha256 == weights_digest(VersionStore(tmp_path / "run" / "weights").manifest(0, "anchor"))
    finally:
        for close in parts.closers:
            close()
    from tidal.errors import UserError

    with pytest.raises(UserError, match="already holds a serving run"):
        build_server(cfg, tmp_path / "run", tmp_path / "ck")
    again = build_server(cfg, tmp_path / "run")
    try:
        assert again.manifest_sha256 == parts.manifest_sha256
    finally:
        for close in again.closers:
            close()


def test_tidal_serve_command_listens_and_stops_on_sigterm(tmp_path):
    save_pretrained(model(0), tmp_path / "ck", TOK)
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "TIDAL_API_KEYS": KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidal", "serve", "--checkpoint", str(tmp_path / "ck"), "--run-dir",
         str(tmp_path / "run"), "--port", "0", "--engine.max_seq_len", "64",
         "--engine.max_new_tokens", "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("tidal serve: listening on http://127.0.0.1:"), proc.stderr.read()
        url = line.split()[4]
        import openai

        client = openai.OpenAI(api_key=KEY, base_url=f"{url}/v1", max_retries=0)
        r = client.completions.create(model="tidal", prompt="hi", max_tokens=4)
        assert r.tidal_version == 0 and r.tidal_manifest_sha256 in line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_dir_of_a_training_run_serves_its_newest_checkpoint(tmp_path):
    """`tidal serve --run-dir TRAIN_RUN`: the newest complete checkpoint becomes version 0 of a
    serving run in TRAIN_RUN/serve; the second time, that serving run is served from its
    registry. An incomplete (newer) checkpoint is never picked."""
    from tidal.cli.serve import build_server, serving_run
    from tidal.config import load_config

    train = tmp_path / "train"
    for step, seed in ((2, 0), (4, 1)):
        folder = train / "checkpoints" / f"step_{step:06d}"
        save_pretrained(model(seed), folder, TOK)
        (folder / "COMPLETE").write_text("")
    save_pretrained(model(2), train / "checkpoints" / "step_000006", TOK)  # no COMPLETE
    cfg = load_config(None, ["--engine.max_seq_len", "64", "--engine.max_new_tokens", "16",
                             "--online.serve.require_keys", "false"])  # on 127.0.0.1
    run_dir, checkpoint = serving_run(cfg, train, None)
    assert run_dir == train / "serve" and checkpoint == train / "checkpoints" / "step_000004"
    parts = build_server(cfg, run_dir, checkpoint, port=0)
    try:
        served = parts.policy._held[0].engine.model.state_dict()
        for name, tensor in model(1).state_dict().items():
            assert torch.equal(served[name], tensor), name
    finally:
        for close in parts.closers:
            close()
    assert serving_run(cfg, train, None) == (train / "serve", None)
