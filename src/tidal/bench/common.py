"""What every ``tidal bench`` shares: writing its JSON result atomically."""

from __future__ import annotations

import json
from pathlib import Path

from tidal.fsutil import write_text_atomic


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON via temp + rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(data, indent=2))
