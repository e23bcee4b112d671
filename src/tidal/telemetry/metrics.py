"""Run telemetry: one JSON line per step in RUN_DIR/metrics.jsonl, and the final summary.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tidal.fsutil import write_text_atomic


def finite_json(value):
    """``value`` with every non-finite float as None and keys as strings (JSON has no NaN/inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


class MetricsLog:
    """Appends one JSON object per line and flushes it, so a killed run keeps every step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(finite_json(record), sort_keys=True) + "\n")

    def close(self) -> None:
        self._f.close()


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def write_json_atomic(path: str | Path, obj: dict) -> None:
    write_text_atomic(path, json.dumps(finite_json(obj), indent=2, sort_keys=True) + "\n")
