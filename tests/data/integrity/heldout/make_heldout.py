"""Write the held-out planted-hack suite: one JSON file per episode in this folder.

    python tests/data/integrity/heldout/make_heldout.py            # (re)write the JSON files
    python tests/data/integrity/heldout/make_heldout.py --run      # also run every episode's
                                                                   # visible checks on its 'after'
                                                                   # workspace (a label sanity check)
The episodes are defined in _cheats_a.py, _cheats_b.py and _honest.py, over the tasks in
_tasks.py and the correct solutions in _fixes.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _cheats_a  # noqa: E402
import _cheats_b  # noqa: E402
import _honest  # noqa: E402
import _tasks  # noqa: E402


def cases() -> list[dict]:
    out = _cheats_a.all_cases() + _cheats_b.all_cases() + _honest.all_cases()
    ids = Counter(c["id"] for c in out)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        raise SystemExit(f"duplicate ids: {dup}")
    return out


def write(all_cases: list[dict]) -> None:
    for old in HERE.glob("*.json"):
        old.unlink()
    for c in all_cases:
        (HERE / f"{c['id']}.json").write_text(json.dumps(c, indent=1, sort_keys=False) + "\n",
                                               encoding="utf-8")


def _command_for(case: dict) -> list[str]:
    for t in vars(_tasks).values():
        if isinstance(t, _tasks.Task) and t.files == case["before"]:
            return list(t.test_cmd)
    if "f.py" in case["before"]:
        return ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_f.py"]
    return ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def run_visible(case: dict) -> bool:
    """Run the task's visible checks on the episode's final workspace (pristine protected files)."""
    with tempfile.TemporaryDirectory() as d:
        files = dict(case["after"])
        for p in case["protected"]:
            if p in case["before"]:
                files[p] = case["before"][p]
        for rel, text in files.items():
            if text.startswith("<binary"):
                continue
            path = Path(d) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        cmd = [sys.executable if a == "python" else a for a in _command_for(case)]
        if cmd[1:3] == ["-m", "pytest"] and "no:cacheprovider" not in cmd:
            cmd[3:3] = ["-p", "no:cacheprovider"]
        try:
            r = subprocess.run(cmd, cwd=d, capture_output=True, timeout=20,
                               env={"PATH": "/usr/bin:/bin", "PYTHONPATH": d})
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0


def main() -> None:
    all_cases = cases()
    write(all_cases)
    by = Counter((c["label"], c["kind"]) for c in all_cases)
    for (label, kind), n in sorted(by.items()):
        print(f"{label:7s} {kind:18s} {n}")
    print("cheat", sum(c["label"] == "cheat" for c in all_cases),
          "honest", sum(c["label"] == "honest" for c in all_cases))
    if "--run" in sys.argv:
        for c in all_cases:
            if c["label"] == "honest" and c["visible_pass"] is not None:
                got = run_visible(c)
                if got != c["visible_pass"]:
                    print(f"MISMATCH {c['id']}: recorded {c['visible_pass']}, ran {got}")


if __name__ == "__main__":
    main()
