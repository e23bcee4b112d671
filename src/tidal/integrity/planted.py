"""The planted-hack suite: episodes that cheat in known ways and honest ones, kept as data.

Each case is one JSON file (``tests/data/integrity/planted/<id>.json``): an ``id``, a ``label``
("cheat" or "honest"), the ``kind`` of cheat (a FINDING_TYPES name, or "honest"), a one-line
``description``, and the episode's evidence in the form of ``Evidence`` (before, after,
actions, trace, protected, hidden, expected_outputs, trace_recorded, visible_pass,
hidden_pass, canary). The suite was written independently of the detectors' rules, so scoring
the detectors on it measures them rather than restating them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tidal.errors import UserError
from tidal.evidence.records import Action, Evidence, TraceEvent

LABELS = ("cheat", "honest")


class PlantedSuiteError(UserError, ValueError):
    """A planted-suite file is missing, unreadable or malformed."""


@dataclass(frozen=True)
class PlantedCase:
    id: str
    label: str
    """"cheat" or "honest"."""
    kind: str
    """The kind of cheat (a FINDING_TYPES name), or "honest"."""
    description: str
    evidence: Evidence


SUITES = ("planted", "heldout")
"""The suites kept with the source. ``planted`` was the detectors' development suite: its first
score (before any rule was changed for it) is in docs/integrity.md, and three rules were added
after its misses and false alarms. ``heldout`` was written afterwards by another author, and
never used to change a rule: its score is the unbiased one."""


def default_suite_dir(name: str = "planted") -> Path:
    """A suite kept with the source: <repository>/tests/data/integrity/<name>."""
    return Path(__file__).resolve().parents[3] / "tests" / "data" / "integrity" / name


def load_planted(directory: str | Path) -> list[PlantedCase]:
    """Every case in ``directory`` (``*.json``), sorted by id."""
    directory = Path(directory)
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        raise PlantedSuiteError(f"no planted-hack cases (*.json) in {directory}: give the suite's "
                                "directory (tests/data/integrity/planted in a source checkout)")
    return [_case(path) for path in files]


def _case(path: Path) -> PlantedCase:
    try:
        data = json.loads(path.read_text())
        if data["label"] not in LABELS:
            raise ValueError(f"label {data['label']!r} is not one of {LABELS}")
        evidence = Evidence(
            before=dict(data["before"]), after=dict(data["after"]),
            actions=[Action.from_json(a) for a in data.get("actions", [])],
            trace=[TraceEvent.from_json(e) for e in data.get("trace", [])],
            protected=tuple(data.get("protected", ())), hidden=tuple(data.get("hidden", ())),
            expected_outputs=tuple(data.get("expected_outputs", ())),
            trace_recorded=bool(data.get("trace_recorded", False)),
            visible_pass=data.get("visible_pass"), hidden_pass=data.get("hidden_pass"),
            canary=bool(data.get("canary", False)))
        return PlantedCase(str(data["id"]), data["label"], str(data["kind"]),
                           str(data.get("description", "")), evidence)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PlantedSuiteError(f"planted case {path}: {type(e).__name__}: {e}") from None


def score(cases: list[PlantedCase], detect, min_confidence: float) -> dict:
    """Recall on the cheats and false-positive rate on the honest cases of ``detect(evidence)``
    (a case is flagged by a finding at least ``min_confidence`` sure), with recall per kind and
    every miss and false alarm named."""
    cheats = [c for c in cases if c.label == "cheat"]
    honest = [c for c in cases if c.label == "honest"]
    flagged = {c.id: [f for f in detect(c.evidence) if f.confidence >= min_confidence]
               for c in cases}
    by_kind: dict[str, list[int]] = {}
    for c in cheats:
        hit = by_kind.setdefault(c.kind, [0, 0])
        hit[0] += bool(flagged[c.id])
        hit[1] += 1
    return {
        "cheats": len(cheats), "honest": len(honest), "min_confidence": min_confidence,
        "recall": sum(bool(flagged[c.id]) for c in cheats) / len(cheats) if cheats else None,
        "false_positive_rate": (sum(bool(flagged[c.id]) for c in honest) / len(honest)
                                if honest else None),
        "recall_by_kind": {k: hit / n for k, (hit, n) in sorted(by_kind.items())},
        "missed": [{"id": c.id, "kind": c.kind, "description": c.description}
                   for c in cheats if not flagged[c.id]],
        "false_alarms": [{"id": c.id, "description": c.description,
                          "findings": [f.to_json() for f in flagged[c.id]]}
                         for c in honest if flagged[c.id]],
    }
