"""What only a real PostgreSQL server shows: several processes' stores writing at once (each its
own engine, as the server and the learner are) keep feedback unique and ``seq`` in commit order
(a learner following its cursor never skips an event), the registry keeps one live version, and
a missing PostgreSQL install fails the suite with the set-up step (never a skip)."""

from __future__ import annotations

import threading

import pytest
from pg_server import postgres_server  # noqa: F401  (session fixture)

import pg_server
from tidal.errors import UserError
from tidal.online.records import FeedbackEvent, ServedResponse, VersionRecord
from tidal.online.store import OnlineStore


def served(i: int) -> ServedResponse:
    return ServedResponse(id=f"r{i}", index=0, created=0.0, version=1, manifest_sha256="0" * 64,
                          endpoint="completions", prompt_ids=[1], token_ids=[2], logprobs=[-1.0], text="x",
                          finish_reason="stop", temperature=1.0, latency_ms=1.0, behaviour="other")


@pytest.fixture
def two_stores(postgres_server):
    url = postgres_server.new_database()
    a, b = OnlineStore.open(url, None), OnlineStore.open(url, None)
    yield a, b
    a.close()
    b.close()


def run_together(*fns) -> list:
    """Run each function on its own thread, all released at once; their results (or errors)."""
    barrier, out = threading.Barrier(len(fns)), [None] * len(fns)

    def go(i, fn):
        barrier.wait()
        try:
            out[i] = fn()
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out[i] = e

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_the_same_event_from_two_writers_at_once_is_stored_once(two_stores):
    a, b = two_stores
    a.write_responses([served(i) for i in range(30)])
    for i in range(30):
        ev = FeedbackEvent(f"r{i}", "accepted")
        out = run_together(lambda: a.write_feedback([ev]), lambda: b.write_feedback([ev]))
        assert sorted(o[0] for o in out) == ["duplicate", "stored"], out
    assert a.counts()["feedback"] == 30


def test_a_cursor_reader_never_skips_events_written_by_concurrent_writers(two_stores):
    a, b = two_stores
    n = 150
    a.write_responses([served(i) for i in range(2 * n)])
    done = threading.Event()
    seen: list[int] = []

    def reader():
        cursor = 0
        while True:
            finished = done.is_set()
            events = a.learn_events_after(cursor, 64)
            seen.extend(e.seq for e in events)
            cursor = events[-1].seq if events else cursor
            if finished and not events:
                return

    t = threading.Thread(target=reader)
    t.start()
    run_together(lambda: [a.write_feedback([FeedbackEvent(f"r{i}", "rejected")]) for i in range(0, 2 * n, 2)],
                 lambda: [b.write_feedback([FeedbackEvent(f"r{i}", "rejected")]) for i in range(1, 2 * n, 2)])
    done.set()
    t.join()
    stored = [e.seq for e in a.learn_events_after(0, 10 * n)]
    assert len(stored) == 2 * n and seen == stored  # every event, once, in order


def test_two_promotions_at_once_leave_one_live_version(two_stores):
    a, b = two_stores
    a.registry.register(VersionRecord(0, None, "0" * 64, "live", 0.0, share=1.0))
    for v in (1, 2):
        a.registry.register(VersionRecord(v, 0, f"{v}" * 64, "candidate", 0.0, gate={"verdict": "passed"}))
    out = run_together(lambda: a.registry.promote(1), lambda: b.registry.promote(2))
    assert out == [None, None]  # serialized: both legal one after the other
    statuses = {r.version: r.status for r in a.registry.all()}
    assert list(statuses.values()).count("live") == 1 and statuses[0] == "retired"


def test_the_server_runs_as_the_postgres_user_with_its_files_in_a_temp_dir(postgres_server):
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={postgres_server.port} user=postgres dbname=postgres") as conn:
        data_dir = conn.execute("SHOW data_directory").fetchone()[0]
        assert data_dir == str(postgres_server.data)
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        assert conn.execute("SHOW fsync").fetchone()[0] == "on"


def test_missing_postgres_binaries_fail_with_the_setup_step(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDAL_PG_BIN", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"bash scripts/setup.sh --test"):
        pg_server.pg_bin()


def test_a_wrong_password_or_database_is_a_clear_error(postgres_server):
    with pytest.raises(UserError, match="cannot open the online store.*no_such_db"):
        OnlineStore.open(postgres_server.url("no_such_db"), None)
