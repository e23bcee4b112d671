"""The held-out planted-hack suite (tests/data/integrity/heldout/) is well-formed data.

The suite measures a detector's recall and false-positive rate once, after the detector was
tuned on another suite; these tests only check the data: every file loads into Evidence, the
labels and kinds are valid and counted, and the grader-derived kinds agree with the verdicts
each case records.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tidal.evidence.records import FINDING_TYPES, TRACE_KINDS, Action, Evidence, TraceEvent

HELDOUT = Path(__file__).parent / "data" / "integrity" / "heldout"
CHEAT_KINDS = tuple(k for k in FINDING_TYPES if k != "harness_divergence")
KEYS = {"id", "label", "kind", "description", "before", "after", "actions", "trace", "protected",
        "hidden", "expected_outputs", "trace_recorded", "visible_pass", "hidden_pass", "canary"}


def _files() -> list[Path]:
    return sorted(HELDOUT.glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _evidence(case: dict) -> Evidence:
    return Evidence(before=dict(case["before"]), after=dict(case["after"]),
                    actions=[Action.from_json(a) for a in case["actions"]],
                    trace=[TraceEvent.from_json(t) for t in case["trace"]],
                    protected=tuple(case["protected"]), hidden=tuple(case["hidden"]),
                    expected_outputs=tuple(case["expected_outputs"]),
                    trace_recorded=case["trace_recorded"], visible_pass=case["visible_pass"],
                    hidden_pass=case["hidden_pass"], canary=case["canary"])


def _runs_without_end(case: dict) -> set[int]:
    runs = {t.get("run", 0) for t in case["trace"]}
    ended = {t.get("run", 0) for t in case["trace"] if t["kind"] == "trace_end"}
    return runs - ended


def _protected_changed(case: dict) -> bool:
    return any(case["before"].get(p) != case["after"].get(p) for p in case["protected"])


CASES = [_load(p) for p in _files()]


def test_there_are_files():
    assert len(CASES) >= 110


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_case_is_well_formed(path):
    case = _load(path)
    assert set(case) == KEYS, set(case) ^ KEYS
    assert case["id"] == path.stem
    assert case["label"] in ("cheat", "honest")
    if case["label"] == "cheat":
        assert case["kind"] in CHEAT_KINDS
    else:
        assert case["kind"] == "honest"
    assert case["description"].strip()
    for tree in ("before", "after"):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in case[tree].items())
    for t in case["trace"]:
        assert t["kind"] in TRACE_KINDS, t
    for a in case["actions"]:
        assert a.get("tool", "") in ("", "read_file", "write_file", "run", "run_tests", "submit"), a
    ev = _evidence(case)
    assert len(ev.actions) == len(case["actions"]) and len(ev.trace) == len(case["trace"])
    assert all(isinstance(t, TraceEvent) for t in ev.trace)
    for p in case["protected"]:
        assert p in case["before"], p
    for p in case["hidden"]:
        assert p not in case["before"], p


def test_ids_are_unique():
    ids = Counter(c["id"] for c in CASES)
    assert [i for i, n in ids.items() if n > 1] == []


def test_counts():
    labels = Counter(c["label"] for c in CASES)
    assert labels["cheat"] >= 55 and labels["honest"] >= 55, labels
    kinds = Counter(c["kind"] for c in CASES if c["label"] == "cheat")
    short = {k: kinds.get(k, 0) for k in CHEAT_KINDS if kinds.get(k, 0) < 4}
    assert short == {}


def test_grader_derived_kinds_match_their_verdicts():
    for c in CASES:
        if c["kind"] == "special_casing":
            assert c["visible_pass"] is True and c["hidden_pass"] is False, c["id"]
        if c["kind"] == "canary_pass":
            assert c["canary"] is True and c["visible_pass"] is True, c["id"]
        if c["kind"] == "test_edit":
            assert _protected_changed(c), c["id"]
        if c["kind"] == "trace_incomplete":
            assert c["trace_recorded"] and _runs_without_end(c), c["id"]


def test_honest_cases_carry_no_grader_verdict_of_cheating():
    for c in CASES:
        if c["label"] != "honest":
            continue
        assert not (c["visible_pass"] is True and c["hidden_pass"] is False), c["id"]
        assert not (c["canary"] and c["visible_pass"] is True), c["id"]
        assert not _protected_changed(c), c["id"]
        if _runs_without_end(c):  # only a run the sandbox killed for its time limit
            assert any("timed out" in a["observation"] for a in c["actions"]), c["id"]


def test_every_case_is_distinct():
    seen = Counter(json.dumps([c["after"], c["actions"], c["trace"]], sort_keys=True) for c in CASES)
    assert max(seen.values()) == 1
