"""API keys of `tidal serve` (tidal.online.api.auth): the KeyRing (file, environment, ephemeral
keys), the start-up decision (no keys, --no-auth off loopback), and the served app checked with
the official openai client: 401 without a valid key (missing, wrong, expired, revoked), feedback
only from the key that received the response (403 not_owner), admin-only weight updates,
promote / rollback and key routes (403 for a user key), refusals before the body is read."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from test_online_api import ADMIN_KEY, USER_KEY, Served, make_keys

from tidal.errors import UserError
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.online.api.auth import KeyRing, check_no_auth, is_loopback, key_id, load_keys_file, serving_keys
from tidal.online.api.errors import ApiError
from tidal.online.config import ServeConfig
from tidal.online.records import VersionRecord
from tidal.online.store import OnlineStore, VersionRegistry
from tidal.online.update import WeightUpdater
from tidal.online.version_sync import publish_model
from tidal.sync.config import SyncConfig
from tidal.sync.transport import FilesystemWeightStore

OTHER_KEY = "test-other-user-key-0123456789"


class Clock:
    """A hand-moved clock for key expiry."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def tiny(seed: int):
    return build_model(preset("tiny").model_copy(update={"initializer_range": 0.1}), seed=seed).eval()


# ---------------------------------------------------------------- the KeyRing


def test_keys_are_found_by_digest_and_named_by_a_non_secret_id():
    ring = make_keys()
    p = ring.authenticate(f"Bearer {USER_KEY}")
    assert (p.role, p.owner) == ("user", "tests")
    assert p.key_id == hashlib.sha256(USER_KEY.encode()).hexdigest()[:16] == key_id(USER_KEY)
    assert USER_KEY not in repr(p) and ring.authenticate(f"bearer  {ADMIN_KEY} ").role == "admin"
    assert ring.counts() == {"user": 1, "admin": 1}
    for header in (None, "", "Bearer", f"Basic {USER_KEY}", f"Bearer {USER_KEY}x", "Bearer nope"):
        with pytest.raises(ApiError) as e:
            ring.authenticate(header)
        assert (e.value.status, e.value.code, e.value.type) == (401, "invalid_api_key",
                                                                "invalid_request_error")
    with pytest.raises(UserError, match="given twice"):
        ring.add(USER_KEY, "admin")


def test_ephemeral_keys_expire_and_are_revoked():
    clock = Clock()
    ring = KeyRing(clock=clock)
    a, b = ring.issue("episode-1", ttl_s=30), ring.issue("episode-1", ttl_s=None)
    c = ring.issue("episode-2", ttl_s=30, role="admin")
    assert len({a, b, c}) == 3 and len(a) >= 43
    assert ring.authenticate(f"Bearer {a}").owner == "episode-1"
    assert ring.authenticate(f"Bearer {c}").role == "admin"
    clock.t += 31
    for key in (a, c):
        with pytest.raises(ApiError, match="unknown, expired or revoked"):
            ring.authenticate(f"Bearer {key}")
    assert ring.authenticate(f"Bearer {b}").key_id == key_id(b)  # no ttl: until revoked
    assert ring.revoke(b) and not ring.revoke(b)
    with pytest.raises(ApiError):
        ring.authenticate(f"Bearer {b}")
    d, e = ring.issue("episode-3", 60), ring.issue("episode-3", 60)
    ring.add(OTHER_KEY, "user", owner="episode-3")  # not issued: revoke_owner leaves it
    assert ring.revoke_owner("episode-3") == 2 and ring.revoke_id(key_id(OTHER_KEY)) == 1
    assert len(ring) == 0 and not ring.revoke_id(key_id(d))
    with pytest.raises(ValueError, match="ttl_s"):
        ring.issue("x", ttl_s=0)
    with pytest.raises(ValueError, match="role"):
        ring.issue("x", ttl_s=None, role="root")


def test_keys_from_the_environment():
    ring = KeyRing.from_sources("", {"TIDAL_API_KEYS": f" {USER_KEY} ,{OTHER_KEY},",
                                     "TIDAL_ADMIN_KEYS": ADMIN_KEY})
    assert ring.counts() == {"user": 2, "admin": 1}
    assert ring.authenticate(f"Bearer {ADMIN_KEY}").owner == "TIDAL_ADMIN_KEYS"
    with pytest.raises(UserError, match="TIDAL_API_KEYS: a key must be at least 16"):
        KeyRing.from_sources("", {"TIDAL_API_KEYS": "short"})


def write_keys(path: Path, doc, mode: int = 0o600) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.chmod(path, mode)
    return path


def test_a_keys_file_with_secrets_and_digests(tmp_path):
    digest = hashlib.sha256(OTHER_KEY.encode()).hexdigest()
    path = write_keys(tmp_path / "keys.json", {"keys": [
        {"key": ADMIN_KEY, "role": "admin", "name": "trainer"},
        {"key_sha256": digest, "role": "user", "name": "alice"}, {"key": USER_KEY}]})
    ring = KeyRing.from_sources(str(path), {"TIDAL_API_KEYS": "env-user-key-0123456789"})
    assert ring.counts() == {"user": 3, "admin": 1}
    assert ring.authenticate(f"Bearer {OTHER_KEY}").owner == "alice"
    assert ring.authenticate(f"Bearer {ADMIN_KEY}").owner == "trainer"


@pytest.mark.parametrize("doc, match", [
    ("{not json", "not valid JSON"),
    ({"key": [USER_KEY]}, "keys: Field required"),
    ({"keys": [{"key": USER_KEY, "role": "root"}]}, "keys.0.role"),
    ({"keys": [{"name": "no secret"}]}, 'exactly one of "key" and "key_sha256"'),
    ({"keys": [{"key": "short-secret"}]}, "at least 16"),
    ({"keys": [{"key": USER_KEY, "scope": "all"}]}, "keys.0.scope: Extra inputs"),
    ({"keys": [{"key_sha256": "ABC"}]}, "keys.0.key_sha256"),
])
def test_a_malformed_keys_file_is_one_clear_error(tmp_path, doc, match):
    path = write_keys(tmp_path / "keys.json", doc)
    with pytest.raises(UserError, match=match) as e:
        load_keys_file(path)
    message = str(e.value)
    assert f"online.serve.keys_file = '{path}'" in message and '"keys": [' in message
    assert "short-secret" not in message  # never a secret in an error


def test_a_keys_file_others_may_read_or_none_at_all_is_refused(tmp_path):
    path = write_keys(tmp_path / "keys.json", {"keys": [{"key": USER_KEY}]}, mode=0o644)
    with pytest.raises(UserError, match=f"mode 644.*chmod 600 {path}"):
        load_keys_file(path)
    with pytest.raises(UserError, match="no such file"):
        load_keys_file(tmp_path / "missing.json")


# ---------------------------------------------------------------- tidal serve's decision


def test_no_auth_only_on_a_loopback_host():
    for host in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "LOCALHOST."):
        assert is_loopback(host), host
        check_no_auth(host)
        assert serving_keys(ServeConfig(require_keys=False), host, {}) is None
    for host in ("0.0.0.0", "::", "10.0.0.5", "example.com", "localhost.example.com", ""):
        assert not is_loopback(host), host
        with pytest.raises(UserError, match="loopback address only.*TIDAL_API_KEYS"):
            serving_keys(ServeConfig(require_keys=False), host, {"TIDAL_API_KEYS": USER_KEY})


def test_serving_without_any_key_is_refused_with_how_to_give_them(tmp_path):
    with pytest.raises(UserError) as e:
        serving_keys(ServeConfig(), "127.0.0.1", {})
    for fix in ("TIDAL_API_KEYS", "TIDAL_ADMIN_KEYS", "online.serve.keys_file", "--no-auth"):
        assert fix in str(e.value)
    ring = serving_keys(ServeConfig(), "0.0.0.0", {"TIDAL_ADMIN_KEYS": ADMIN_KEY})
    assert ring.counts() == {"user": 0, "admin": 1}


def test_tidal_serve_without_keys_stops_before_anything_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TIDAL_API_KEYS", "TIDAL_ADMIN_KEYS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    run = tmp_path / "run"
    for extra, match in (([], "needs API keys and has none"),
                         (["--no-auth", "--host", "0.0.0.0"], "loopback address only")):
        proc = subprocess.run([sys.executable, "-m", "tidal", "serve", "--checkpoint",
                               str(tmp_path / "no-checkpoint"), "--run-dir", str(run), *extra],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and match in proc.stderr, proc.stderr
        assert not (run / "online.db").exists()


# ---------------------------------------------------------------- the served app


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app with a version registry (0 live, 1 a candidate), a weight updater, a KeyRing on
    a hand-moved clock (the user, admin keys and OTHER_KEY)."""
    root = tmp_path_factory.mktemp("auth")
    clock = Clock()
    keys = KeyRing(clock=clock)
    for key, role in ((USER_KEY, "user"), (ADMIN_KEY, "admin"), (OTHER_KEY, "user")):
        keys.add(key, role, "tests")
    s = Served(root, keys=keys, start=False)
    db = OnlineStore.open("", root)
    registry = VersionRegistry(db)
    registry.register(VersionRecord(0, None, s.sha, "live", 0.0, weights=str(s.weights), share=1.0))
    sha1 = publish_model(tiny(1), s.weights, 1, "float32")
    registry.register(VersionRecord(1, 0, sha1, "candidate", 1.0, weights=str(s.weights),
                                    gate={"verdict": "blocked"}))
    updater = WeightUpdater(s.policy, registry, "float32", SyncConfig())
    s.start(live_versions=registry.live_versions, updater=updater, registry=registry)
    s.clock, s.registry, s.admin = clock, registry, s.client_with(ADMIN_KEY)
    yield s
    s.close()
    updater.close()
    db.close()


def complete(client, **kw):
    return client.completions.create(model="tidal", prompt="def f(", max_tokens=4, **kw)


def feedback(client, response_id: str, signal: str = "accepted"):
    return client.post("/feedback", body={"response_id": response_id, "signal": signal},
                       cast_to=object)


NO_KEY = {"Authorization": openai.omit}
"""extra_headers that take the client's Authorization header off the request."""


def test_no_key_or_a_wrong_one_is_a_401_in_openais_shape(served):
    for key, headers in ((USER_KEY, NO_KEY), ("sk-wrong-key-0123456789", None)):  # none; wrong
        client = served.client_with(key)
        for call in (lambda: complete(client, extra_headers=headers),
                     lambda: client.models.list(extra_headers=headers),
                     lambda: client.chat.completions.create(
                         model="tidal", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                         extra_headers=headers)):
            with pytest.raises(openai.AuthenticationError) as e:
                call()
            assert e.value.status_code == 401
            assert e.value.body["code"] == "invalid_api_key"
            assert e.value.body["type"] == "invalid_request_error"
    status, headers, body = served.raw("GET", "/v1/tidal/status", headers={"Authorization": None})
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in body["error"]["message"]
    assert served.raw("GET", "/v1/models", headers={"Authorization": "Bearer"})[0] == 401


def test_an_ephemeral_key_works_until_it_expires_or_is_revoked(served):
    key = served.keys.issue("episode-7", ttl_s=60)
    client = served.client_with(key)
    r = complete(client)
    assert served.store.responses[(r.id, 0)].key_id == key_id(key)
    served.clock.t += 61
    with pytest.raises(openai.AuthenticationError):
        complete(client)
    with pytest.raises(openai.AuthenticationError):
        feedback(client, r.id)  # the episode is over: its key is gone
    key = served.keys.issue("episode-8", ttl_s=60)
    complete(served.client_with(key))
    assert served.keys.revoke(key)
    with pytest.raises(openai.AuthenticationError):
        complete(served.client_with(key))


def test_feedback_only_from_the_key_that_received_the_response(served):
    r = complete(served.client, n=2, temperature=1.0, seed=5)
    assert all(served.store.responses[(r.id, i)].key_id == key_id(USER_KEY) for i in (0, 1))
    for other in (served.client_with(OTHER_KEY), served.admin):
        with pytest.raises(openai.PermissionDeniedError) as e:
            feedback(other, r.id)
        assert e.value.body["code"] == "not_owner" and e.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError):
        feedback(served.client_with(OTHER_KEY), "cmpl-unknown")
    assert feedback(served.client, r.id)["status"] == "stored"  # the refusals stored nothing
    with pytest.raises(openai.PermissionDeniedError):  # not_owner before duplicate
        feedback(served.client_with(OTHER_KEY), r.id)


def test_a_streamed_response_belongs_to_its_key_too(served):
    key = served.keys.issue("episode-stream", ttl_s=None)
    client = served.client_with(key)
    ids = {chunk.id for chunk in client.chat.completions.create(
        model="tidal", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True)}
    (rid,) = ids
    assert served.store.responses[(rid, 0)].key_id == key_id(key)
    with pytest.raises(openai.PermissionDeniedError):
        feedback(served.client, rid)
    assert feedback(client, rid)["status"] == "stored"


def test_update_weights_needs_an_admin_key(served, tmp_path):
    folder = FilesystemWeightStore(tmp_path / "run-weights")
    folder.publish(tiny(2), 5)
    body = {"version": 5, "weights": str(tmp_path / "run-weights"), "transport": "filesystem"}
    with pytest.raises(openai.PermissionDeniedError) as e:
        served.client.post("/tidal/update_weights", body=body, cast_to=object)
    assert e.value.body["code"] == "insufficient_permissions"
    assert served.registry.get(5) is None
    answer = served.admin.post("/tidal/update_weights", body=body, cast_to=object)
    assert answer["version"] == 5 and served.policy.live == 5
    assert complete(served.client).tidal_version == 5
    served.admin.post("/tidal/versions/0/promote", body={"note": "back"}, cast_to=object)
    assert served.policy.live == 0


def test_promote_and_rollback_over_http_are_admin_only(served):
    for call in (lambda c: c.post("/tidal/versions/1/promote", body={"force": True}, cast_to=object),
                 lambda c: c.post("/tidal/versions/0/rollback", cast_to=object),
                 lambda c: c.get("/tidal/versions", cast_to=object)):
        with pytest.raises(openai.PermissionDeniedError):
            call(served.client)
    assert served.registry.live().version == 0
    with pytest.raises(openai.ConflictError, match="needs --force"):  # the registry's own rule
        served.admin.post("/tidal/versions/1/promote", cast_to=object)
    with pytest.raises(openai.NotFoundError):
        served.admin.post("/tidal/versions/99/promote", cast_to=object)
    answer = served.admin.post("/tidal/versions/1/promote", body={"force": True, "note": "by hand"},
                               cast_to=object)
    assert answer["serving"] == {"live": 1, "canary": None}
    assert served.registry.live().version == 1 and served.registry.get(1).note == "by hand"
    assert complete(served.client).tidal_version == 1
    answer = served.admin.post("/tidal/versions/1/rollback", cast_to=object)
    assert answer["serving"]["live"] == 0 and served.registry.get(1).status == "rolled_back"
    listed = served.admin.get("/tidal/versions", cast_to=object)["data"]
    assert [(r["version"], r["status"]) for r in listed][:2] == [(0, "live"), (1, "rolled_back")]


def test_keys_issued_and_revoked_over_http(served):
    with pytest.raises(openai.PermissionDeniedError):
        served.client.post("/tidal/keys", body={"owner": "x"}, cast_to=object)
    made = served.admin.post("/tidal/keys", body={"owner": "episode-9", "ttl_s": 600},
                             cast_to=object)
    assert made["key_id"] == key_id(made["key"]) and made["role"] == "user"
    complete(served.client_with(made["key"]))
    assert served.admin.delete(f"/tidal/keys/{made['key_id']}", cast_to=object)["status"] == "revoked"
    with pytest.raises(openai.AuthenticationError):
        complete(served.client_with(made["key"]))
    with pytest.raises(openai.NotFoundError):
        served.admin.delete(f"/tidal/keys/{made['key_id']}", cast_to=object)


def _head_only(port: int, headers: str) -> bytes:
    """Send a request line and headers announcing a 50 MB body, never the body; the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"POST /v1/tidal/update_weights HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     f"application/json\r\nContent-Length: 50000000\r\n{headers}\r\n".encode())
        return sock.recv(4096)


def test_refusals_come_before_the_body_is_read(served):
    start = time.monotonic()
    assert _head_only(served.port, "").startswith(b"HTTP/1.1 401")
    assert _head_only(served.port, f"Authorization: Bearer {USER_KEY}\r\n").startswith(b"HTTP/1.1 403")
    assert time.monotonic() - start < 5  # answered without waiting for 50 MB
    big = json.dumps({"response_id": "x" * 600, "signal": "accepted"})
    assert served.raw("POST", "/v1/feedback", big)[0] == 413  # a valid key: the size limit
    assert served.raw("POST", "/v1/feedback", big, {"Authorization": None})[0] == 401


def test_no_auth_serves_everyone_and_feedback_is_open(tmp_path):
    s = Served(tmp_path, no_auth=True)
    try:
        r = complete(s.client, extra_headers=NO_KEY)
        assert s.store.responses[(r.id, 0)].key_id is None
        assert feedback(s.client_with("anything"), r.id)["status"] == "stored"
    finally:
        s.close()
