"""Who may join the fleet: the run token (no token, a wrong one), signed batches (a bad
signature, a batch changed after signing), replayed batches, and keys kept out of messages
and logs."""

import logging
import os
import threading

import pytest

from tidal.errors import UserError
from tidal.fleet.auth import (
    REASONS,
    AuthError,
    RedactFilter,
    ReplayGuard,
    bearer,
    bearer_token,
    check_token,
    fleet_token,
    new_lease_secret,
    open_batch,
    redact,
    sign,
    verify_signature,
)
from tidal.fleet.wire import WireError, encode_results
from tidal.orchestrator.worker import RolloutResult
from tidal.trajectory import Segment, Trajectory

TOKEN = "s3cret-token-for-tests-0123456789"


# ------------------------------------------------------------------ the run token


def test_the_token_comes_from_the_environment_first(tmp_path):
    assert fleet_token({"TIDAL_FLEET_TOKEN": f" {TOKEN}\n"}, tmp_path) == TOKEN
    assert not (tmp_path / "fleet_token").exists()


@pytest.mark.parametrize("bad", ["", "short", "has a space in the middle!!", "é" * 20])
def test_a_bad_token_in_the_environment_is_a_user_error_without_the_token(bad):
    with pytest.raises(UserError, match="TIDAL_FLEET_TOKEN: the fleet token must be") as e:
        fleet_token({"TIDAL_FLEET_TOKEN": bad})
    assert not isinstance(e.value, AuthError)
    if bad:
        assert bad not in str(e.value)


def test_a_generated_token_is_kept_private_and_survives_a_restart(tmp_path):
    run_dir = tmp_path / "run"
    first = fleet_token({}, run_dir)
    path = run_dir / "fleet_token"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert len(first) >= 40 and fleet_token({}, run_dir) == first  # the restarted orchestrator
    assert fleet_token({}, tmp_path / "other") != first
    assert [p.name for p in run_dir.iterdir()] == ["fleet_token"]  # no temp file left


def test_a_token_file_others_can_read_is_refused(tmp_path):
    fleet_token({}, tmp_path)
    os.chmod(tmp_path / "fleet_token", 0o644)
    with pytest.raises(UserError, match="chmod 600"):
        fleet_token({}, tmp_path)


def test_without_a_run_dir_each_process_makes_its_own():
    assert fleet_token({}) != fleet_token({})


def test_no_token_is_refused():
    for presented in (None, ""):
        with pytest.raises(AuthError) as e:
            check_token(presented, TOKEN)
        assert e.value.reason == "missing token"


@pytest.mark.parametrize("presented", [TOKEN[:-1], TOKEN + "x", "Bearer " + TOKEN, "ü" * 33,
                                       "\udcff" * 4])
def test_a_wrong_token_is_refused_and_never_shown(presented):
    with pytest.raises(AuthError) as e:
        check_token(presented, TOKEN)
    assert e.value.reason == "wrong token"
    for text in (str(e.value), repr(e.value), repr(e.value.args)):
        assert TOKEN not in text and presented not in text


def test_the_right_token_passes():
    check_token(TOKEN, TOKEN)
    check_token(bearer_token(bearer(TOKEN)), TOKEN)


@pytest.mark.parametrize("header, token", [(None, None), ("", None), ("Bearer", None),
                                           ("Basic abc", None), ("bearer  abc ", "abc"),
                                           ("Bearer abc", "abc")])
def test_bearer_token_reads_the_authorization_header(header, token):
    assert bearer_token(header) == token


# ------------------------------------------------------------------ signatures


def test_a_signed_body_verifies_and_any_change_does_not():
    secret, body = new_lease_secret(), b'{"batch_id":"b","results":[]}'
    signature = sign(secret, body)
    assert len(signature) == 64 and int(signature, 16) >= 0
    verify_signature(secret, body, signature)
    verify_signature(secret, body, signature.upper().lower())
    tampered = [(secret, body.replace(b"b", b"c", 1), signature),       # a byte changed
                (new_lease_secret(), body, signature),                   # another lease's key
                (secret, body, signature[:-1] + "0" if signature[-1] != "0" else "1"),
                (secret, body, None), (secret, body, ""), (secret, body, "ü" * 64)]
    for key, data, sig in tampered:
        with pytest.raises(AuthError) as e:
            verify_signature(key, data, sig)
        assert e.value.reason == "bad signature" and secret not in str(e.value)


def test_lease_secrets_are_fresh():
    assert len({new_lease_secret() for _ in range(100)}) == 100


# ------------------------------------------------------------------ replay


def test_a_replayed_batch_is_refused():
    guard = ReplayGuard()
    guard.check("lease-1", "batch-1")
    with pytest.raises(AuthError) as e:
        guard.check("lease-1", "batch-1")
    assert e.value.reason == "replayed batch"
    guard.check("lease-2", "batch-1")  # ids are per lease
    guard.check("lease-1", "batch-2")
    assert guard.seen("lease-1", "batch-1") and not guard.seen("lease-1", "batch-3")


def test_a_discarded_batch_may_be_retried_and_a_forgotten_lease_starts_over():
    guard = ReplayGuard()
    guard.check("l", "b")
    guard.discard("l", "b")
    guard.check("l", "b")
    guard.forget("l")
    assert not guard.seen("l", "b")


def test_the_guard_is_bounded_per_lease_and_in_leases():
    guard = ReplayGuard(per_lease=3, max_leases=2)
    for b in range(5):
        guard.check("a", str(b))
    assert [guard.seen("a", str(b)) for b in range(5)] == [False, False, True, True, True]
    guard.check("b", "0")
    guard.check("a", "5")  # a is the most recently active lease now
    guard.check("c", "0")  # so b is the one dropped
    assert guard.seen("a", "5") and guard.seen("c", "0") and not guard.seen("b", "0")
    assert sum(len(ids) for ids in guard._leases.values()) <= 3 * 2
    with pytest.raises(ValueError):
        ReplayGuard(per_lease=0)


def test_copies_of_one_batch_arriving_at_once_are_accepted_once():
    guard, accepted, start = ReplayGuard(), [], threading.Barrier(8)

    def upload():
        start.wait()
        try:
            guard.check("lease", "batch")
            accepted.append(1)
        except AuthError:
            pass

    threads = [threading.Thread(target=upload) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert accepted == [1]


# ------------------------------------------------------------------ an upload end to end


def result() -> RolloutResult:
    seg = Segment([1, 2], [3, 4], [-0.5, -0.25], [0, 0], [1, 1])
    return RolloutResult(0, 0, 0, [Trajectory("t", 0, [seg], reward=1.0)], 2, 0.1, 0.1)


def test_open_batch_accepts_an_honest_upload_once():
    secret, guard = new_lease_secret(), ReplayGuard()
    body = encode_results([result()], lease_id="lease-1", batch_id="b-1")
    batch = open_batch(body, sign(secret, body), "lease-1", secret, guard)
    assert batch.results == [result()] and batch.batch_id == "b-1"
    with pytest.raises(AuthError, match="^replayed batch"):
        open_batch(body, sign(secret, body), "lease-1", secret, guard)


def test_a_tampered_upload_is_refused_before_it_is_read_or_remembered():
    secret, guard = new_lease_secret(), ReplayGuard()
    body = encode_results([result()], lease_id="lease-1", batch_id="b-1")
    signature = sign(secret, body)
    tampered = body.replace(b'"reward":1.0', b'"reward":9.0')
    assert tampered != body
    for data, sig in [(tampered, signature), (b"not json", sign("other", b"not json")),
                      (body, None)]:
        with pytest.raises(AuthError, match="^bad signature"):
            open_batch(data, sig, "lease-1", secret, guard)
    assert not guard.seen("lease-1", "b-1")
    open_batch(body, signature, "lease-1", secret, guard)  # the genuine one still gets in


def test_a_batch_naming_another_lease_is_refused():
    secret, guard = new_lease_secret(), ReplayGuard()
    body = encode_results([result()], lease_id="lease-2", batch_id="b-1")
    with pytest.raises(AuthError) as e:
        open_batch(body, sign(secret, body), "lease-1", secret, guard)
    assert e.value.reason == "wrong lease" and e.value.reason in REASONS
    assert not guard.seen("lease-1", "b-1") and not guard.seen("lease-2", "b-1")


def test_a_signed_but_malformed_batch_is_a_wire_error():
    secret = new_lease_secret()
    body = b'{"format":1}'
    with pytest.raises(WireError, match="^batch_id: missing"):
        open_batch(body, sign(secret, body), "l", secret, ReplayGuard())


# ------------------------------------------------------------------ logs


def test_redact_removes_every_key():
    secret = new_lease_secret()
    line = f"GET /join?token={TOKEN} Authorization: Bearer {TOKEN} lease secret {secret}"
    clean = redact(line, TOKEN, secret, "")
    assert TOKEN not in clean and secret not in clean and clean.count("[redacted]") == 3
    assert redact("nothing here", TOKEN) == "nothing here" and redact("x", "") == "x"


def test_the_log_filter_keeps_the_token_out_of_log_records(caplog):
    log = logging.getLogger("tidal.test.fleet")
    f = RedactFilter(TOKEN)
    log.addFilter(f)
    try:
        with caplog.at_level(logging.INFO, logger="tidal.test.fleet"):
            log.info("worker joined with %s from %s", bearer(TOKEN), "10.0.0.2")
            log.info("plain line")
    finally:
        log.removeFilter(f)
    assert [r.getMessage() for r in caplog.records] == [
        "worker joined with Bearer [redacted] from 10.0.0.2", "plain line"]
    assert TOKEN not in caplog.text and TOKEN not in repr(f)
