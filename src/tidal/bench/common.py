"""What every ``tidal bench`` shares: writing its JSON result atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON via temp + rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return path
