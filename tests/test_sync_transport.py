"""Weight sync over loopback HTTP: bit-exact pulls, relays, and every fault the issue lists."""

from __future__ import annotations

import errno
import re
import time

import numpy as np
import pytest
import torch
from aiohttp import web

from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError
from tidal.sync.manifest import cheapest_path
from tidal.sync.origin import STATS, Publisher, ServerThread, VersionStore, make_app
from tidal.sync.pull import Puller, pull_to_folder, read_held
from tidal.sync.relay import Relay
from tidal.sync.tensors import bits_of

CFG = SyncConfig(chunk_elements=2048, anchor_every=3, request_bytes=8192, retries=2, timeout_s=5)
RANGES = CFG.model_copy(update={"inline_bytes": 0})
"""Every form's data by range requests (the /pull answer carries only the manifests)."""


def versions(count: int, seed: int = 0):
    """Serving snapshots (bf16 + an int tensor) of fp32 masters moved a little every version."""
    g = torch.Generator().manual_seed(seed)
    master = {"w": torch.randn(20_000, generator=g) * 0.02, "b": torch.randn(64, 33, generator=g)}
    out = []
    for _ in range(count):
        out.append([bits_of(k, v.to(torch.bfloat16)) for k, v in master.items()]
                   + [bits_of("step", torch.tensor([len(out)], dtype=torch.int64))])
        master["w"] += torch.randn(20_000, generator=g).sign() * 2e-6
        master["b"] += torch.randn(64, 33, generator=g) * 1e-4
    return out


def same(a, b) -> bool:
    return [t.name for t in a] == [t.name for t in b] and all(
        x.bits.tobytes() == y.bits.tobytes() for x, y in zip(a, b))


@pytest.fixture
def origin(tmp_path):
    """A root with versions 0..5 (anchors at 0 and 3 and 6 on demand) and its origin server."""
    snaps = versions(6)
    pub = Publisher(tmp_path / "origin", CFG)
    for s in snaps:
        pub.publish(s, {"config.json": b'{"model_type": "test"}'})
    servers = []

    def serve(app=None, port=0):
        server = ServerThread(app or make_app(pub.store), port=port)
        servers.append(server)
        return server

    yield pub, snaps, serve
    for s in servers:
        s.stop()


def data_faults(store: VersionStore, plan: dict):
    """Middleware that answers the first ``plan['left']`` data range requests badly:
    ``corrupt`` flips a byte, ``truncate`` sends half then drops the connection."""

    @web.middleware
    async def middleware(request, handler):
        m = re.fullmatch(r"/v/(\d+)/(\w+)/data", request.path)
        if m is None or plan["left"] <= 0:
            return await handler(request)
        plan["left"] -= 1
        first, last = map(int, request.headers["Range"].removeprefix("bytes=").split("-"))
        data = bytearray(store.read_range(int(m[1]), m[2], first, last - first + 1))
        resp = web.StreamResponse(status=206, headers={"Content-Range": f"bytes {first}-{last}/*"})
        resp.content_length = len(data)
        await resp.prepare(request)
        if plan["mode"] == "corrupt":
            data[len(data) // 2] ^= 0xFF
            await resp.write(bytes(data))
        else:
            await resp.write(bytes(data[: len(data) // 2]))
            request.transport.close()
        return resp

    return middleware


def faulty_app(store, plan):
    app = make_app(store)
    app.middlewares.append(data_faults(store, plan))
    return app


def test_pull_is_bit_exact_and_follows_deltas(origin):
    pub, snaps, serve = origin
    server = serve()
    puller = Puller([server.url], CFG)
    assert puller.latest() == 5
    assert puller.pull(1) == 1 and same(puller.tensors, snaps[1])
    before = puller.bytes_fetched
    assert puller.pull() == 5 and same(puller.tensors, snaps[5])
    deltas = sum(pub.store.manifest(v, "delta").data_bytes for v in (2, 3, 4, 5))
    assert puller.bytes_fetched - before == deltas
    assert puller.files == {"config.json": b'{"model_type": "test"}'}


def test_far_behind_puller_takes_the_anchor_when_cheaper(origin):
    pub, snaps, serve = origin
    server = serve()
    puller = Puller([server.url], CFG)
    puller.pull(0)
    before = puller.bytes_fetched
    puller.pull(4)
    chain = sum(pub.store.manifest(v, "delta").data_bytes for v in range(1, 5))
    anchor_route = pub.store.manifest(3, "anchor").data_bytes + pub.store.manifest(4, "delta").data_bytes
    assert puller.bytes_fetched - before == min(chain, anchor_route)
    assert same(puller.tensors, snaps[4])


@pytest.mark.parametrize("mode", ["corrupt", "truncate"])
def test_bad_responses_are_refetched_without_refetching_verified_chunks(origin, mode):
    pub, snaps, serve = origin
    plan = {"left": 2, "mode": mode}
    server = serve(faulty_app(pub.store, plan))
    puller = Puller([server.url], RANGES)
    puller.pull(3)
    assert plan["left"] == 0 and same(puller.tensors, snaps[3])
    _, cost = cheapest_path(pub.store.forms(), 3, None)
    assert cost <= puller.bytes_fetched < cost + 2 * CFG.request_bytes


def test_unrecoverable_corruption_fails_clearly_and_keeps_the_last_good_version(origin):
    pub, snaps, serve = origin
    plan = {"left": 0, "mode": "corrupt"}
    server = serve(faulty_app(pub.store, plan))
    puller = Puller([server.url], RANGES)
    puller.pull(2)
    plan["left"] = 10_000
    with pytest.raises(SyncError, match="checksum"):
        puller.pull(5)
    assert puller.version == 2 and same(puller.tensors, snaps[2])


def test_lying_manifest_is_never_applied_and_an_anchor_is_used_instead(origin, tmp_path):
    pub, snaps, serve = origin
    m = pub.store.manifest(5, "delta")
    lie = m.model_copy(update={"tensors": [m.tensors[0].model_copy(update={"digest": "0" * 64})] + m.tensors[1:]})
    pub.store.manifest_path(5, "delta").write_bytes(lie.to_json())
    server = serve()
    puller = Puller([server.url], CFG)
    puller.pull(4)
    with pytest.raises(SyncError, match="hashes to"):  # no anchor of 5 to fall back to
        puller.pull(5)
    assert puller.version == 4 and same(puller.tensors, snaps[4])
    pub.publish(versions(7)[6], anchor=False)  # 6 is an anchor (anchor_every=3) and a delta on 5
    assert puller.pull(6) == 6 and same(puller.tensors, versions(7)[6])


def test_delta_whose_base_the_puller_lacks_falls_back_to_an_anchor(origin):
    pub, snaps, serve = origin
    server = serve()
    puller = Puller([server.url], CFG)
    puller.pull(1)
    import shutil
    shutil.rmtree(pub.store.root / "v00000002")  # the chain from 1 is broken
    assert puller.pull(5) == 5 and same(puller.tensors, snaps[5])
    stranger = Puller([server.url], CFG)
    stranger.hold(pub.store.manifest(1, "delta"), snaps[0], {})  # claims 1, holds 0's bits
    assert stranger.pull(5) == 5 and same(stranger.tensors, snaps[5])


def test_relay_killed_mid_transfer_puller_resumes_from_the_next_upstream(origin, tmp_path):
    pub, snaps, serve = origin
    origin_server = serve()
    relay = Relay([origin_server.url], tmp_path / "relay", CFG)
    relay_app = make_app(relay.store, relay)
    relay_app.middlewares.append(data_faults(relay.store, {"left": 10_000, "mode": "truncate"}))
    relay_server = serve(relay_app)
    puller = Puller([relay_server.url, origin_server.url], RANGES)
    puller.pull(3)
    assert same(puller.tensors, snaps[3])
    relay_server.stop()  # the relay is gone for good now
    assert puller.pull(5) == 5 and same(puller.tensors, snaps[5])


def test_relay_restart_serves_from_its_cache_and_origin_restart_is_survived(origin, tmp_path):
    pub, snaps, serve = origin
    origin_server = serve()
    first = Relay([origin_server.url], tmp_path / "relay", CFG)
    relay_server = serve(make_app(first.store, first))
    Puller([relay_server.url], CFG).pull(5)
    sent = origin_server.app[STATS]["bytes_sent"]
    port = relay_server.port
    relay_server.stop()
    relay = Relay([origin_server.url], tmp_path / "relay", CFG)
    restarted = serve(make_app(relay.store, relay), port=port)
    fresh = Puller([restarted.url], CFG)
    assert fresh.pull(5) == 5 and same(fresh.tensors, snaps[5])
    forms_sent = origin_server.app[STATS]["bytes_sent"] - sent
    assert forms_sent < 10_000  # only the index travelled again, no version data
    origin_port = origin_server.port
    origin_server.stop()
    pub.publish(versions(7)[6])
    serve(port=origin_port)
    time.sleep(CFG.poll_interval_s)  # the relay reuses its upstream's index for this long
    assert fresh.pull() == 6 and same(fresh.tensors, versions(7)[6])


def test_fan_out_origin_sends_each_update_byte_at_most_twice(origin, tmp_path):
    pub, snaps, serve = origin
    origin_server = serve()
    relays = []
    for r in range(2):
        relay = Relay([origin_server.url], tmp_path / f"relay{r}", CFG)
        relays.append(serve(make_app(relay.store, relay)))
    pullers = [Puller([relays[i % 2].url], CFG) for i in range(4)]
    for p in pullers:
        p.pull(4)
    sent = origin_server.app[STATS]["version_bytes_sent"]
    for p in pullers:
        p.pull(5)
    update = pub.store.manifest(5, "delta")
    update_bytes = update.data_bytes + len(update.to_json())
    per_update_byte = (origin_server.app[STATS]["version_bytes_sent"] - sent) / update_bytes
    assert all(same(p.tensors, snaps[5]) for p in pullers)
    assert per_update_byte == 2.0  # one copy per relay, none per puller


def test_pull_to_folder_writes_safetensors_and_a_full_disk_leaves_nothing_half_written(origin, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    pub, snaps, serve = origin
    server = serve()
    out = tmp_path / "out"
    pull_to_folder(Puller([server.url], CFG), out, 2)
    loaded = load_file(str(out / "v00000002" / "model.safetensors"))
    assert loaded["w"].view(torch.int16).numpy().view(np.uint16).tobytes() == snaps[2][1].bits.tobytes() \
        or loaded["w"].view(torch.int16).numpy().view(np.uint16).tobytes() == snaps[2][0].bits.tobytes()
    assert read_held(out)[0].version == 2

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("tidal.sync.pull.write_safetensors_files", full)
    puller = Puller([server.url], CFG)
    with pytest.raises(SyncError, match="no space left"):
        pull_to_folder(puller, out, 5)
    assert sorted(p.name for p in out.iterdir()) == ["LATEST", "v00000002"]
    assert read_held(out)[0].version == 2
    monkeypatch.undo()
    before = puller.bytes_fetched
    pull_to_folder(puller, out, 5)  # resumes from the folder's version 2 by deltas
    assert same(read_held(out)[1], snaps[5])
    assert puller.bytes_fetched - before <= sum(pub.store.manifest(v, "delta").data_bytes for v in (3, 4, 5))


def test_bad_upstream_and_missing_version_are_clear_errors(origin):
    pub, snaps, serve = origin
    with pytest.raises(SyncError, match="check the --upstream"):
        Puller(["http://127.0.0.1:1"], CFG).pull()
    server = serve()
    with pytest.raises(SyncError, match="version 42 cannot be built"):
        Puller([server.url], CFG).pull(42)


def test_one_request_carries_a_small_update(origin):
    pub, snaps, serve = origin
    server = serve()
    puller = Puller([server.url], CFG)
    puller.pull(4)
    requests = server.app[STATS]["requests"]
    assert puller.pull(5) == 5 and same(puller.tensors, snaps[5])
    assert server.app[STATS]["requests"] - requests == 1  # GET /pull: manifest and data inline
    t = puller.timeline
    assert t["request_sent"] <= t["first_byte"] <= t["last_byte"] <= t["decode_done"] <= t["hash_done"] <= t["applied"]


def test_subscriber_gets_a_version_published_while_it_waits(origin):
    import threading

    pub, snaps, serve = origin
    server = serve()
    puller = Puller([server.url], CFG)
    puller.pull(5)
    assert puller.pull_next(wait_s=0.2) is None  # nothing newer: the wait ends empty
    new = versions(7)[6]
    threading.Timer(0.3, lambda: pub.publish(new)).start()
    requests = server.app[STATS]["requests"]
    assert puller.pull_next(wait_s=5) == 6 and same(puller.tensors, new)
    assert server.app[STATS]["requests"] - requests == 1


def test_a_corrupt_pull_answer_is_repaired_by_ranges(origin):
    pub, snaps, serve = origin

    @web.middleware
    async def corrupt_bundle(request, handler):
        if request.path != "/pull":
            return await handler(request)
        from tidal.sync.origin import bundle_parts
        path, _ = cheapest_path(pub.store.forms(), int(request.query["version"]), int(request.query["held"]))
        body = bytearray(b"".join(bundle_parts(pub.store, int(request.query["version"]), path, 1 << 30)))
        body[-5] ^= 0xFF  # inside the last chunk's payload
        return web.Response(body=bytes(body))

    app = make_app(pub.store)
    app.middlewares.append(corrupt_bundle)
    server = serve(app)
    puller = Puller([server.url], CFG)
    puller.pull(3)
    assert puller.pull(5) == 5 and same(puller.tensors, snaps[5])


def test_in_place_apply_is_bit_exact_and_a_failure_restores_the_base():
    from tidal.sync.client import apply_form
    from tidal.sync.errors import VerificationError
    from tidal.sync.origin import encode_form

    snaps = versions(3, seed=7)
    base = [type(t)(t.name, t.dtype, t.shape, t.bits.copy(), t.file) for t in snaps[0]]
    arrays = [t.bits for t in base]
    manifest, payloads = encode_form(snaps[1], snaps[0], CFG, 1, 0, [])
    out = apply_form(manifest, payloads.__getitem__, base, threads=2)
    assert all(a is t.bits for a, t in zip(arrays, out))  # changed in place, no copy
    assert same(out, snaps[1])
    manifest2, payloads2 = encode_form(snaps[2], snaps[1], CFG, 2, 1, [])
    bad = list(payloads2)
    lie = manifest2.model_copy(update={"tensors": [manifest2.tensors[0].model_copy(update={"digest": "0" * 64})]
                                       + manifest2.tensors[1:]})
    with pytest.raises(VerificationError):
        apply_form(lie, bad.__getitem__, out, threads=2)
    assert same(out, snaps[1])  # every chunk undone
    bad[-1] = bytes([bad[-1][0] ^ 0x7F]) + bad[-1][1:]  # an unknown chunk kind: fails mid-decode
    with pytest.raises(ValueError):
        apply_form(manifest2, bad.__getitem__, out, threads=2)
    assert same(out, snaps[1])


def test_skipped_rehash_still_catches_bytes_the_manifest_does_not_admit():
    """A tensor no chunk touched keeps its verified digest; a tensor whose bytes did change is
    re-hashed, so a manifest that claims it unchanged (old sha256) is caught."""
    from tidal.sync.client import apply_form
    from tidal.sync.errors import VerificationError
    from tidal.sync.origin import encode_form

    snaps = versions(2, seed=3)
    frozen = [snaps[1][0], snaps[0][1], snaps[1][2]]  # tensor 1 ("b") does not change
    manifest, payloads = encode_form(frozen, snaps[0], CFG, 1, 0, [])
    held_digests = [t.digest(manifest.hash) for t in snaps[0]]
    calls = []

    def work():
        return [type(t)(t.name, t.dtype, t.shape, t.bits.copy(), t.file) for t in snaps[0]]

    from tidal.sync.client import StreamingDigests
    original = StreamingDigests._advance

    def spy(self, t):  # records each tensor whose bytes went into a sha256
        before = self.cursor[t]
        original(self, t)
        if self.cursor[t] > before:
            calls.append(self.tensors[t].name)

    StreamingDigests._advance = spy
    try:
        assert same(apply_form(manifest, payloads.__getitem__, work(), 1, held_digests), frozen)
        assert sorted(set(calls)) == sorted([snaps[0][0].name, snaps[0][2].name])  # "b" not re-hashed
        claims_unchanged = manifest.model_copy(update={"tensors": [
            manifest.tensors[0].model_copy(update={"digest": held_digests[0]}), *manifest.tensors[1:]]})
        with pytest.raises(VerificationError, match=snaps[0][0].name):
            apply_form(claims_unchanged, payloads.__getitem__, work(), 1, held_digests)
        says_changed = manifest.model_copy(update={"tensors": [
            manifest.tensors[0], manifest.tensors[1].model_copy(update={"digest": "1" * 64}), manifest.tensors[2]]})
        with pytest.raises(VerificationError, match=snaps[0][1].name):
            apply_form(says_changed, payloads.__getitem__, work(), 1, held_digests)
    finally:
        StreamingDigests._advance = original


def test_streaming_digests_match_whole_tensor_hashes_whatever_order_chunks_finish():
    """Chunks applied out of order, from several threads, tensors with one or many chunks or
    none: each digest is the hash (the manifest's) of the tensor's whole bytes."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from tidal.sync.client import StreamingDigests
    from tidal.sync.origin import encode_form
    from tidal.sync.tensors import TensorBits

    snaps = versions(1, seed=11)
    tensors = [*snaps[0], TensorBits("empty", "bfloat16", (0,), np.zeros(0, np.uint16))]
    manifest, _ = encode_form(tensors, None, CFG.model_copy(update={"chunk_elements": 1024}), 0, None, [])
    assert max(sum(c.tensor == t for c in manifest.chunks) for t in range(len(tensors))) > 2
    order = list(range(len(manifest.chunks)))
    random.Random(0).shuffle(order)
    with ThreadPoolExecutor(3) as pool:
        hashes = StreamingDigests(manifest, tensors, None, pool)
        list(pool.map(lambda i: hashes.chunk_done(i, True), order))
        got = hashes.digests()
    assert got == [t.digest(manifest.hash) for t in tensors]


def test_a_form_applied_while_it_arrives_is_undone_when_the_version_cannot_complete(tmp_path):
    """The delta in the /pull answer is applied chunk by chunk as it streams in; when the version
    then fails (its new side file is on no upstream), the held arrays are the old version again,
    bit for bit, and the held version does not move; once the file is back the pull succeeds."""
    import hashlib

    snaps = versions(2, seed=5)
    pub = Publisher(tmp_path / "origin", CFG)
    pub.publish(snaps[0], {"config.json": b"old"})
    (manifest,) = pub.publish(snaps[1], {"config.json": b"new"})
    assert manifest.kind == "delta" and manifest.data_bytes <= CFG.inline_bytes
    server = ServerThread(make_app(pub.store))
    try:
        puller = Puller([server.url], CFG)
        puller.pull(0)
        arrays = [t.bits for t in puller.tensors]
        blob = pub.store.blob_path(hashlib.sha256(b"new").hexdigest())
        kept = blob.read_bytes()
        blob.unlink()
        with pytest.raises(SyncError, match="config.json"):
            puller.pull(1)
        assert puller.version == 0 and same(puller.tensors, snaps[0])
        assert all(a is t.bits for a, t in zip(arrays, puller.tensors))
        blob.write_bytes(kept)
        assert puller.pull(1) == 1 and same(puller.tensors, snaps[1])
        puller.close()
    finally:
        server.stop()
