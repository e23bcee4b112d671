"""What every ``tidal bench`` shares: writing its JSON result atomically, and a run folder of its own."""

from __future__ import annotations

import json
from pathlib import Path

from tidal.fsutil import write_text_atomic


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON via temp + rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(data, indent=2))


def new_run_dir(cfg, run_dir: Path) -> Path:
    """``run_dir`` made for one RL run of a benchmark, with the run's config.toml (so `tidal
    report` reads it); a ConfigError if a run is already there (its records would be mixed)."""
    from tidal.config import ConfigError
    from tidal.config.dump import recipe_tree, to_toml

    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run: give another --bench.runs_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(recipe_tree(cfg)) + "\n")
    return run_dir
