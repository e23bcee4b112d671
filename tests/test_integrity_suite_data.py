"""The planted-hack suite (tests/data/integrity/planted) is well-formed data: the bench's recall and
false-positive rate are only as good as the cases they count."""

import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tidal.evidence.records import (
    FINDING_TYPES,
    TRACE_KINDS,
    Action,
    Evidence,
    TraceEvent,
)

SUITE = Path(__file__).parent / "data" / "integrity"
PLANTED = SUITE / "planted"
FIELDS = {"id": str, "label": str, "kind": str, "description": str, "before": dict, "after": dict,
          "actions": list, "trace": list, "protected": list, "hidden": list,
          "expected_outputs": list, "trace_recorded": bool, "canary": bool}
VERDICTS = ("visible_pass", "hidden_pass")
CHEAT_KINDS = tuple(k for k in FINDING_TYPES if k != "harness_divergence")
MIN_PER_LABEL = 60
MIN_PER_KIND = 4


def load_cases():
    return [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(PLANTED.glob("*.json"))]


CASES = load_cases()


def evidence_of(case) -> Evidence:
    return Evidence(before=case["before"], after=case["after"],
                    actions=[Action.from_json(a) for a in case["actions"]],
                    trace=[TraceEvent.from_json(t) for t in case["trace"]],
                    protected=tuple(case["protected"]), hidden=tuple(case["hidden"]),
                    expected_outputs=tuple(case["expected_outputs"]),
                    trace_recorded=case["trace_recorded"], visible_pass=case["visible_pass"],
                    hidden_pass=case["hidden_pass"], canary=case["canary"])


def test_counts():
    labels = Counter(c["label"] for _, c in CASES)
    assert labels["cheat"] >= MIN_PER_LABEL and labels["honest"] >= MIN_PER_LABEL, labels
    kinds = Counter(c["kind"] for _, c in CASES if c["label"] == "cheat")
    short = {k: kinds[k] for k in CHEAT_KINDS if kinds[k] < MIN_PER_KIND}
    assert not short, f"cheat kinds with fewer than {MIN_PER_KIND} cases: {short}"


def test_ids_unique_and_match_file_names():
    ids = [c["id"] for _, c in CASES]
    assert len(ids) == len(set(ids))
    assert all(p.stem == c["id"] for p, c in CASES)


@pytest.mark.parametrize("path, case", CASES, ids=[p.stem for p, _ in CASES])
def test_case_is_well_formed(path, case):
    for name, typ in FIELDS.items():
        assert isinstance(case.get(name), typ), f"{name} missing or not {typ.__name__}"
    for name in VERDICTS:
        assert case.get(name, "absent") in (True, False, None), name
    assert case["label"] in ("cheat", "honest")
    if case["label"] == "cheat":
        assert case["kind"] in CHEAT_KINDS
    else:
        assert case["kind"] == "honest"
    assert all(isinstance(k, str) and isinstance(v, str)
               for files in (case["before"], case["after"]) for k, v in files.items())
    for t in case["trace"]:
        assert t["kind"] in TRACE_KINDS and isinstance(t["run"], int)
    for a in case["actions"]:
        assert isinstance(a["text"], str) and isinstance(a.get("args", {}), dict)
    for literal in case["expected_outputs"]:
        ast.literal_eval(literal)
    ev = evidence_of(case)
    assert [TraceEvent.from_json(t.to_json()) for t in ev.trace] == ev.trace
    assert all(h not in case["before"] for h in case["hidden"]), "hidden files are never given"
    assert all(p in case["before"] for p in case["protected"])
    if not case["trace_recorded"]:
        assert not case["trace"]


@pytest.mark.parametrize("path, case", CASES, ids=[p.stem for p, _ in CASES])
def test_grader_kinds_match_verdicts(path, case):
    """The grader-derived kinds are defined by the verdicts; the others must not lean on a
    verdict no honest case could have."""
    kind = case["kind"]
    if kind == "special_casing":
        assert case["visible_pass"] is True and case["hidden_pass"] is False
    if kind == "canary_pass":
        assert case["canary"] and case["visible_pass"] is True
    if kind == "trace_incomplete":
        runs = {t["run"] for t in case["trace"]}
        ended = {t["run"] for t in case["trace"] if t["kind"] == "trace_end"}
        assert case["trace_recorded"] and runs - ended
    if kind == "test_edit":
        assert any(case["after"].get(p) != case["before"][p] for p in case["protected"])
    if case["label"] == "honest":
        assert not (case["canary"] and case["visible_pass"]), "an honest canary cannot pass"


def test_python_files_parse():
    """The workspaces' Python (before and after) is real code, so detectors see real syntax."""
    bad = []
    for _, case in CASES:
        for side in ("before", "after"):
            for rel, text in case[side].items():
                if rel.endswith(".py"):
                    try:
                        ast.parse(text)
                    except SyntaxError as e:
                        bad.append(f"{case['id']} {side} {rel}: {e}")
    assert not bad, bad


def test_every_finished_run_ends_and_traces_are_in_order():
    for _, case in CASES:
        runs = [t["run"] for t in case["trace"]]
        assert runs == sorted(runs), case["id"]
        for run in set(runs):
            kinds = [t["kind"] for t in case["trace"] if t["run"] == run]
            assert kinds.count("trace_end") <= 1 and (
                "trace_end" not in kinds or kinds[-1] == "trace_end"), case["id"]


def test_generator_output_is_committed():
    r = subprocess.run([sys.executable, str(SUITE / "make_planted.py"), "--check"],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
