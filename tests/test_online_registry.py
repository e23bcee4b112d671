"""The version registry on SQLite and PostgreSQL: every legal transition, every illegal one a
UserError that changes nothing, and `tidal versions` listing / promoting / rolling back."""

from __future__ import annotations

import json

import pytest
from pg_server import postgres_server  # noqa: F401  (session fixture)

from tidal.cli import main
from tidal.errors import UserError
from tidal.online.records import VersionRecord
from tidal.online.store import OnlineStore, VersionRegistry


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = OnlineStore.open("", tmp_path)
    else:
        s = OnlineStore.open(request.getfixturevalue("postgres_server").new_database(), None)
    yield s
    s.close()


def rec(v, parent=None, status="candidate", verdict="passed", **kw) -> VersionRecord:
    return VersionRecord(version=v, parent=parent, manifest_sha256=f"{v:02d}" * 32, status=status,
                         created=1_700_000_000.0 + v, weights=f"/w/{v}", gate={"verdict": verdict} if verdict else {},
                         **kw)


def state(reg: VersionRegistry) -> list[tuple[int, str, float]]:
    return [(r.version, r.status, r.share) for r in reg.all()]


@pytest.fixture
def reg(store) -> VersionRegistry:
    r = store.registry
    r.register(rec(0, status="live", verdict=None, share=1.0))
    r.register(rec(1, parent=0))
    return r


def test_register_get_all_and_update(reg):
    assert reg.get(1) == rec(1, parent=0) and reg.get(9) is None
    assert [r.version for r in reg.all()] == [0, 1]
    out = reg.update(1, gate={"verdict": "passed", "p": 0.3}, note="ok")
    assert reg.get(1).gate == {"verdict": "passed", "p": 0.3} and reg.get(1).note == "ok" and out == reg.get(1)
    assert [r.version for r in reg.live_versions()] == [0]


def test_canary_then_promote(reg):
    reg.start_canary(1, 0.25)
    assert state(reg) == [(0, "live", 0.75), (1, "canary", 0.25)]
    assert [r.version for r in reg.live_versions()] == [0, 1]
    reg.promote(1)
    assert state(reg) == [(0, "retired", 0.0), (1, "live", 1.0)]
    assert reg.live().version == 1


def test_canary_rollback_gives_live_all_traffic_back(reg):
    reg.start_canary(1, 0.3)
    assert reg.rollback(1, note="worse accept rate") == 0
    assert state(reg) == [(0, "live", 1.0), (1, "rolled_back", 0.0)]
    assert reg.get(1).note == "worse accept rate"


def test_rolling_back_a_live_version_brings_its_parent_back(reg):
    reg.promote(1)
    reg.register(rec(2, parent=1))
    reg.promote(2)
    assert reg.rollback(2) == 1
    assert state(reg) == [(0, "retired", 0.0), (1, "live", 1.0), (2, "rolled_back", 0.0)]
    assert reg.rollback(1) == 0  # its parent again
    with pytest.raises(UserError, match="no retired version"):
        reg.rollback(0)


def test_a_live_version_whose_parent_is_not_retired_falls_back_to_the_newest_retired(reg):
    reg.register(rec(2, parent=0))
    reg.promote(1)
    reg.promote(2)  # 0 and 1 retired; 2's parent is 0
    reg.update(0, status="rolled_back")
    assert reg.rollback(2) == 1


def test_the_first_version_can_be_promoted_with_nothing_live(store):
    r = store.registry
    r.register(rec(0))
    r.promote(0)
    assert state(r) == [(0, "live", 1.0)]


ILLEGAL = [
    (lambda r: r.promote(7), "not registered"),
    (lambda r: r.rollback(7), "not registered"),
    (lambda r: r.promote(0), "already live"),
    (lambda r: r.rollback(1), "candidate: only a live or canary"),
    (lambda r: r.start_canary(1, 0.0), r"share must be in \(0, 1\)"),
    (lambda r: r.start_canary(1, 1.0), r"share must be in \(0, 1\)"),
    (lambda r: r.start_canary(0, 0.2), "live: only a candidate"),
    (lambda r: r.register(rec(1)), "already registered"),
    (lambda r: r.register(rec(5, status="live")), "already live"),
    (lambda r: r.register(rec(5, parent=4)), "parent 4 is not registered"),
    (lambda r: r.register(rec(5, status="shipping")), "not one of"),
    (lambda r: r.register(rec(-1)), ">= 0"),
    (lambda r: r.register(rec(5, share=1.5)), r"share must be in \[0, 1\]"),
    (lambda r: r.update(1, status="live"), "promote 1 instead"),
    (lambda r: r.update(1, parent=3), "cannot update parent"),
    (lambda r: r.update(1, status="bogus"), "not one of"),
    (lambda r: r.update(1, gate="passed"), "must be a dict"),
]


@pytest.mark.parametrize("act, match", ILLEGAL)
def test_an_illegal_transition_is_a_user_error_and_changes_nothing(reg, act, match):
    before = reg.all()
    with pytest.raises(UserError, match=match):
        act(reg)
    assert reg.all() == before


@pytest.mark.parametrize("status, verdict, match", [
    ("rolled_back", "passed", "rolled_back: promoting it needs --force"),
    ("blocked", "failed", "blocked: promoting it needs --force"),
    ("candidate", "failed", "gate verdict 'failed': promoting it needs --force"),
])
def test_promoting_a_failed_version_needs_force(reg, status, verdict, match):
    reg.register(rec(2, parent=0, status=status, verdict=verdict))
    before = reg.all()
    with pytest.raises(UserError, match=match):
        reg.promote(2)
    assert reg.all() == before
    reg.promote(2, force=True, note="by hand")
    assert reg.live().version == 2 and reg.get(2).note == "by hand"


def test_canary_needs_a_passed_or_skipped_gate_an_incumbent_and_no_other_canary(reg):
    reg.register(rec(2, parent=0, verdict="failed"))
    reg.register(rec(3, parent=0, verdict=None))
    reg.register(rec(4, parent=0, verdict="skipped"))
    for v in (2, 3):
        with pytest.raises(UserError, match="gate verdict"):
            reg.start_canary(v, 0.2)
    reg.start_canary(4, 0.2)
    before = reg.all()
    with pytest.raises(UserError, match="4 is already in canary"):
        reg.start_canary(1, 0.2)
    with pytest.raises(UserError, match="4 is in canary"):
        reg.promote(1)
    with pytest.raises(UserError, match="4 is in canary: roll it back first"):
        reg.rollback(0)
    assert reg.all() == before


def test_a_canary_needs_a_live_version(store):
    r = store.registry
    r.register(rec(0))
    with pytest.raises(UserError, match="no version is live"):
        r.start_canary(0, 0.5)


def test_a_retired_version_can_be_promoted_back_by_hand(reg):
    reg.promote(1)
    reg.promote(0)
    assert state(reg) == [(0, "live", 1.0), (1, "retired", 0.0)]


# ---- tidal versions ----

def cli(*argv) -> int:
    return main(["versions", *argv])


def test_tidal_versions_lists_promotes_and_rolls_back(tmp_path, capsys):
    s = OnlineStore.open("", tmp_path)
    s.registry.register(rec(0, status="live", verdict=None, share=1.0))
    s.registry.register(rec(1, parent=0, canary={"verdict": "promote"}))
    s.close()
    assert cli("--run-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["version", "parent", "status", "share", "created", "sha256", "gate", "canary"]
    assert out[1].split() == ["0", "-", "live", "1.00", "2023-11-14", "22:13:20", "000000000000", "-", "-"]
    assert out[2].split()[:4] == ["1", "0", "candidate", "0.00"] and out[2].split()[-2:] == ["passed", "promote"]
    assert cli("promote", "1", "--run-dir", str(tmp_path)) == 0
    assert "version 1 is live" in capsys.readouterr().out
    assert cli("--run-dir", str(tmp_path), "rollback", "1", "--json") == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["status"], r["share"]) for r in records] == [(0, "live", 1.0), (1, "rolled_back", 0.0)]
    assert cli("promote", "1", "--run-dir", str(tmp_path)) == 2
    assert "needs --force" in capsys.readouterr().err
    assert cli("promote", "1", "--force", "--run-dir", str(tmp_path), "--json") == 0
    assert json.loads(capsys.readouterr().out)[1]["status"] == "live"


def test_tidal_versions_on_postgres(postgres_server, capsys):
    url = postgres_server.new_database()
    s = OnlineStore.open(url, None)
    s.registry.register(rec(3, status="live", verdict=None, share=1.0))
    s.close()
    assert cli("--database-url", url, "--json") == 0
    assert [r["version"] for r in json.loads(capsys.readouterr().out)] == [3]


@pytest.mark.parametrize("argv, match", [
    ((), "exactly one of --run-dir"),
    (("--run-dir", "X", "--database-url", "sqlite:///y"), "exactly one of"),
    (("--run-dir", "/nonexistent/run"), "not a directory"),
    (("--run-dir", "EMPTY"), "no online store"),
    (("--run-dir", "EMPTY", "--online.store.max_batch", "3"), "no config overrides"),
    (("rollback", "3", "--database-url", "mysql://a@b/c"), "not supported"),
])
def test_tidal_versions_bad_input_is_one_clear_line(tmp_path, capsys, argv, match):
    argv = [str(tmp_path) if a == "EMPTY" else a for a in argv]
    assert cli(*argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidal versions: error:") and len(err.strip().splitlines()) == 1
    assert __import__("re").search(match, err)
    assert not (tmp_path / "online.db").exists()
