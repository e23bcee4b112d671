"""The online store on SQLite (WAL, synchronous=FULL) and on a real PostgreSQL server: durable
writes, unknown / duplicate feedback stores nothing, the learner's reads, group commit, a kill -9
in the middle of a stream loses no acknowledged event, and the Alembic migrations."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pg_server import postgres_server  # noqa: F401  (session fixture)

from tidal.errors import UserError
from tidal.online.config import StoreConfig
from tidal.online.records import FeedbackEvent, ServedResponse
from tidal.online.store import GroupCommitter, OnlineStore
from tidal.online.store import codec, schema, writes
from tidal.online.store.migrate import alembic_config, head_revision
from tidal.online.store.schema import metadata

SRC = Path(__file__).resolve().parents[1] / "src"


def served(id: str, index: int = 0, version: int = 1, prompt=(1, 2, 3), behaviour="action", **kw) -> ServedResponse:
    base = dict(id=id, index=index, created=1000.0 + index, version=version, manifest_sha256="ab" * 32,
                endpoint="chat", prompt_ids=list(prompt), token_ids=[5, 6, 7], logprobs=[-0.125, -1e-300, -3.3],
                text="return 1", finish_reason="stop", temperature=0.7, latency_ms=12.5, behaviour=behaviour)
    return ServedResponse(**{**base, **kw})


@pytest.fixture(params=["sqlite", "postgresql"])
def url_and_dir(request, tmp_path):
    """("", run_dir) for SQLite; (a fresh database's URL, None) for PostgreSQL."""
    if request.param == "sqlite":
        return "", tmp_path
    return request.getfixturevalue("postgres_server").new_database(), None


@pytest.fixture
def store(url_and_dir):
    s = OnlineStore.open(*url_and_dir)
    yield s
    s.close()


# ---- durable writes and reads ----

def test_a_response_round_trips_exactly(store):
    r = served("cmpl-1", experts=[[[1, 2]], [[3, 0]], [[2, 2]]], prompt_experts=[[[0, 1]], [[1, 3]]],
               text="héllo\n", prompt=[0, 2 ** 31 - 1])
    store.write_responses([r, served("cmpl-1", index=1)])
    assert store.response("cmpl-1", 0) == r
    assert store.response("cmpl-1", 1).index == 1
    assert store.response("cmpl-1", 2) is None and store.response("nope") is None
    assert store.counts() == {"responses": 2, "feedback": 0, "versions": 0}


def test_feedback_outcomes_and_only_stored_ones_are_stored(store):
    store.write_responses([served("a"), served("a", index=1), served("b")])
    out = store.write_feedback([FeedbackEvent("a", "accepted"), FeedbackEvent("a", "rejected"),
                                FeedbackEvent("a", "scalar", index=1, value=-0.5), FeedbackEvent("zzz", "accepted"),
                                FeedbackEvent("b", "edited", index=3)])
    assert out == ["stored", "duplicate", "stored", "unknown_response", "unknown_response"]
    assert store.write_feedback([FeedbackEvent("a", "edited")]) == ["duplicate"]
    assert store.counts()["feedback"] == 2
    events = store.learn_events_after(0, 10)
    assert [(e.feedback.response_id, e.feedback.index, e.feedback.signal, e.feedback.value) for e in events] == \
        [("a", 0, "accepted", None), ("a", 1, "scalar", -0.5)]
    assert events[0].response == served("a") and events[0].seq < events[1].seq


def test_feedback_only_from_the_key_the_response_was_served_to(store):
    store.write_responses([served("k", key_id="aaaa"), served("k", index=1, key_id="aaaa"),
                           served("open")])  # "open": served without keys
    assert store.response("k").key_id == "aaaa" and store.response("open").key_id is None
    out = store.write_feedback([FeedbackEvent("k", "accepted", key_id="bbbb"),
                                FeedbackEvent("k", "accepted"),  # no key at all
                                FeedbackEvent("k", "rejected", index=1, key_id="aaaa"),
                                FeedbackEvent("open", "edited", key_id="bbbb")])
    assert out == ["not_owner", "not_owner", "stored", "stored"]
    # not_owner comes before duplicate: another key learns nothing of the feedback given
    assert store.write_feedback([FeedbackEvent("k", "accepted", index=1, key_id="bbbb")]) == ["not_owner"]
    assert store.write_feedback([FeedbackEvent("k", "accepted", key_id="aaaa")]) == ["stored"]
    assert store.counts()["feedback"] == 3


@pytest.mark.parametrize("bad", [FeedbackEvent("a", "loved"), FeedbackEvent("a", "scalar", value=1.5),
                                 FeedbackEvent("a", "scalar"), FeedbackEvent("a", "accepted", value=1.0),
                                 FeedbackEvent("a", "accepted", index=-1), FeedbackEvent("", "accepted"),
                                 FeedbackEvent("a", "scalar", value=float("nan"))])
def test_a_bad_event_is_a_clear_error_and_stores_nothing(store, bad):
    store.write_responses([served("a"), served("b")])
    with pytest.raises(UserError):
        store.write_feedback([FeedbackEvent("b", "accepted"), bad])
    assert store.counts()["feedback"] == 0


def test_a_response_id_stored_twice_stores_none_of_the_call(store):
    store.write_responses([served("a")])
    with pytest.raises(ValueError, match=r"a\[0\] is already stored"):
        store.write_responses([served("c"), served("a")])
    with pytest.raises(ValueError, match="already stored"):
        store.write_responses([served("d"), served("d")])
    with pytest.raises(ValueError, match="logprobs"):
        store.write_responses([served("e", logprobs=[-1.0])])
    assert store.counts()["responses"] == 1 and store.response("c") is None


def test_a_rejected_operation_does_not_stop_the_rest_of_its_batch(store):
    results = store.write_batch([("responses", [served("a")]), ("responses", [served("a")]),
                                 ("feedback", [FeedbackEvent("a", "bogus")]), ("feedback", [FeedbackEvent("a", "accepted")]),
                                 ("responses", [served("b")]), ("feedback", [FeedbackEvent("b", "rejected")])])
    assert results[0] is None and isinstance(results[1], ValueError) and isinstance(results[2], UserError)
    assert results[3:] == [["stored"], None, ["stored"]]
    assert store.counts() == {"responses": 2, "feedback": 2, "versions": 0}


def test_the_learner_cursor_and_backlog(store):
    store.write_responses([served(f"r{i}") for i in range(5)])
    store.write_feedback([FeedbackEvent(f"r{i}", "accepted") for i in range(5)])
    seqs = [e.seq for e in store.learn_events_after(0, 100)]
    assert seqs == sorted(seqs) and len(seqs) == 5 and store.backlog() == 5
    assert [e.seq for e in store.learn_events_after(seqs[1], 2)] == seqs[2:4]
    store.set_learned_through(seqs[2], learner_version=3)
    assert store.learned_through() == seqs[2] and store.learner_version() == 3 and store.backlog() == 2
    with pytest.raises(ValueError, match="forward"):
        store.set_learned_through(seqs[0], 4)
    with pytest.raises(ValueError, match="forward"):
        store.set_learned_through(seqs[-1] + 1, 4)
    assert store.learned_through() == seqs[2]


def test_outcomes_of_a_version(store):
    store.write_responses([served("a", version=1, behaviour="question"), served("b", version=2),
                           served("c", version=1, behaviour="empty")])
    store.write_feedback([FeedbackEvent("a", "rejected"), FeedbackEvent("b", "accepted"),
                          FeedbackEvent("c", "scalar", value=0.25)])
    assert store.outcomes(1) == [("rejected", None, "question"), ("scalar", 0.25, "empty")]
    assert store.outcomes(2) == [("accepted", None, "action")] and store.outcomes(7) == []
    first = store.learn_events_after(0, 1)[0].seq
    assert store.outcomes(1, since_seq=first) == [("scalar", 0.25, "empty")]


def test_recent_prompts_are_the_newest_distinct_ones(store):
    store.write_responses([served("a", prompt=[1]), served("a", index=1, prompt=[1]), served("b", prompt=[2]),
                           served("c", prompt=[1]), served("d", prompt=[3])])
    assert store.recent_prompts(2) == [[3], [1]]
    assert store.recent_prompts(10) == [[3], [1], [2]]


def test_many_recent_prompts_page_through(store, monkeypatch):
    from tidal.online.store import store as store_module

    monkeypatch.setattr(store_module, "PROMPT_PAGE", 3)
    store.write_responses([served(f"r{i}", prompt=[i % 4]) for i in range(11)])
    assert store.recent_prompts(4) == [[2], [1], [0], [3]]


def test_sqlite_runs_in_wal_mode_with_synchronous_full(tmp_path):
    s = OnlineStore.open("", tmp_path)
    assert s.url == f"sqlite:///{tmp_path.resolve() / 'online.db'}"
    with s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    s.close()


@pytest.mark.parametrize("url, run_dir, match", [("", None, "run directory"), ("sqlite://", None, "in-memory"),
                                                 ("mysql://x@y/z", None, "not supported"),
                                                 ("not a url", None, "not a database URL")])
def test_bad_store_urls_are_clear_errors(url, run_dir, match):
    with pytest.raises(UserError, match=match):
        OnlineStore.open(url, run_dir)


def test_an_unreachable_postgres_is_a_clear_error():
    with pytest.raises(UserError, match="cannot open the online store"):
        OnlineStore.open("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2", None)


def test_create_false_refuses_a_missing_store(tmp_path):
    with pytest.raises(UserError, match="no online store"):
        OnlineStore.open("", tmp_path, create=False)
    assert not (tmp_path / "online.db").exists()


# ---- group commit ----

def test_group_commit_batches_concurrent_callers_and_acks_after_commit(store):
    gc = GroupCommitter(store, StoreConfig(commit_window_ms=50), max_backlog=10_000)

    async def go():
        await gc.record([served(f"r{i}") for i in range(64)])
        return await asyncio.gather(*(gc.submit(FeedbackEvent(f"r{i % 70}", "accepted")) for i in range(80)))

    out = asyncio.run(go())
    assert out[:64] == ["stored"] * 64 and out[64:70] == ["unknown_response"] * 6
    assert out[70:] == ["duplicate"] * 10
    assert store.counts()["feedback"] == 64  # acknowledged = committed, before close
    assert gc.batches < 1 + 80  # callers shared transactions
    gc.close()


def test_a_failed_batch_acknowledges_nothing_and_the_writer_goes_on(store, monkeypatch):
    store.write_responses([served("a"), served("b")])
    real = writes.write_ops
    fail = {"once": True}

    def failing(conn, ops):
        results = real(conn, ops)  # the inserts ran inside the transaction ...
        if fail.pop("once", False):
            raise sa.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))  # ... then it fails
        return results

    monkeypatch.setattr("tidal.online.store.store.write_ops", failing)
    gc = GroupCommitter(store, StoreConfig(commit_window_ms=0), max_backlog=10)

    async def go():
        with pytest.raises(sa.exc.OperationalError, match="disk I/O"):
            await gc.submit(FeedbackEvent("a", "accepted"))
        assert store.counts()["feedback"] == 0
        return await gc.submit(FeedbackEvent("a", "accepted")), await gc.submit(FeedbackEvent("b", "accepted"))

    assert asyncio.run(go()) == ("stored", "stored")
    gc.close()


def test_a_rejected_write_fails_only_its_caller(store):
    gc = GroupCommitter(store, StoreConfig(commit_window_ms=20), max_backlog=10)

    async def go():
        await gc.record([served("a")])
        return await asyncio.gather(gc.record([served("a")]), gc.submit(FeedbackEvent("a", "nonsense")),
                                    gc.submit(FeedbackEvent("a", "accepted")), return_exceptions=True)

    dup, bad, ok = asyncio.run(go())
    assert isinstance(dup, ValueError) and isinstance(bad, UserError) and ok == "stored"
    gc.close()


def test_retry_after_when_the_learner_is_behind(store):
    store.write_responses([served(f"r{i}") for i in range(4)])
    gc = GroupCommitter(store, StoreConfig(), max_backlog=2)

    async def go():
        assert gc.retry_after() is None
        for i in range(3):
            await gc.submit(FeedbackEvent(f"r{i}", "accepted"))

    asyncio.run(go())
    assert 1.0 <= gc.retry_after() <= 5.0
    store.set_learned_through(store.learn_events_after(0, 10)[-1].seq, 1)
    _wait_for(lambda: gc.retry_after() is None)  # the thread re-counts every BACKLOG_REFRESH_S
    gc.close()


def test_close_drains_what_is_queued_and_refuses_more(store):
    store.write_responses([served(f"r{i}") for i in range(20)])
    gc = GroupCommitter(store, StoreConfig(commit_window_ms=100), max_backlog=100)
    futures = [gc.enqueue("feedback", [FeedbackEvent(f"r{i}", "rejected")]) for i in range(20)]
    gc.close()
    assert [f.result(timeout=0) for f in futures] == [["stored"]] * 20
    with pytest.raises(RuntimeError, match="closed"):
        gc.enqueue("feedback", [FeedbackEvent("r0", "rejected")])


def _wait_for(cond, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


# ---- kill -9 ----

CHILD = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from tidal.online.config import StoreConfig
    from tidal.online.records import FeedbackEvent, ServedResponse
    from tidal.online.store import GroupCommitter, OnlineStore

    url, run_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = OnlineStore.open(url, Path(run_dir) if run_dir else None)
    gc = GroupCommitter(store, StoreConfig(), max_backlog=10 ** 9)

    def served(i):
        return ServedResponse(id=f"r{i}", index=0, created=0.0, version=1, manifest_sha256="0" * 64,
                              endpoint="completions", prompt_ids=[1, 2], token_ids=[3], logprobs=[-0.5],
                              text="x", finish_reason="stop", temperature=1.0, latency_ms=1.0, behaviour="other")

    async def main():
        await gc.record([served(i) for i in range(n)])
        print("ready", flush=True)
        todo = iter(range(n))

        async def worker():
            for i in todo:
                if await gc.submit(FeedbackEvent(f"r{i}", "accepted")) == "stored":
                    sys.stdout.write(f"r{i}\\n")
                    sys.stdout.flush()

        await asyncio.gather(*(worker() for _ in range(32)))
        print("done", flush=True)

    asyncio.run(main())
""")


def kill_mid_stream(url: str, run_dir: Path | None, tmp_path: Path, after: int = 400, n: int = 20_000) -> set[str]:
    """Run CHILD, SIGKILL it after ``after`` acknowledged events; the ids it acknowledged."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, str(script), url, str(run_dir or ""), str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        acked = []
        while len(acked) < after:
            line = proc.stdout.readline()
            assert line and line != "done\n", f"the child stopped early: {proc.stderr.read()}"
            acked.append(line)
        os.kill(proc.pid, signal.SIGKILL)
        acked += proc.stdout.readlines()  # everything it printed before it died
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert "done\n" not in acked  # killed mid-stream
    return {line.strip() for line in acked if line.endswith("\n")}


def test_kill_9_loses_no_acknowledged_event(url_and_dir, tmp_path):
    url, run_dir = url_and_dir
    acked = kill_mid_stream(url, run_dir, tmp_path)
    store = OnlineStore.open(url, run_dir)
    stored = {e.feedback.response_id for e in store.learn_events_after(0, 10 ** 6)}
    assert len(acked) >= 400 and acked - stored == set()  # zero acknowledged events lost
    store.close()


# ---- migrations ----

def test_the_migrations_make_exactly_the_schema(store):
    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []


def test_a_database_at_revision_0001_opens_and_keeps_its_rows(url_and_dir):
    url, run_dir = url_and_dir
    s = OnlineStore.open(url, run_dir)
    engine = s.engine
    with engine.begin() as conn:  # back to a bare 0001 database, as an older tidal made it
        command.downgrade(alembic_config(conn), "base")
        command.upgrade(alembic_config(conn), "0001")
        row = codec.response_row(served("old"))
        del row["key_id"]  # 0002 added it
        conn.execute(schema.responses.insert(), row)
    s.close()
    s = OnlineStore.open(url, run_dir)
    assert s.response("old") == served("old")  # key_id None: served before keys
    assert s.write_feedback([FeedbackEvent("old", "accepted", key_id="any")]) == ["stored"]
    with s.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
    s.close()


def test_a_database_newer_than_the_code_is_refused_untouched(url_and_dir):
    url, run_dir = url_and_dir
    s = OnlineStore.open(url, run_dir)
    s.write_responses([served("kept")])
    with s.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0099_from_the_future'")
    s.close()
    with pytest.raises(UserError, match="'0099_from_the_future', newer than this tidal knows.*upgrade tidal"):
        OnlineStore.open(url, run_dir)
    engine = sa.create_engine(s.url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == "0099_from_the_future"
        assert conn.exec_driver_sql("SELECT count(*) FROM responses").scalar() == 1
    engine.dispose()
