"""Write the planted-hack suite: one JSON file per case under planted/ (see README.md).

The suite measures an integrity detector's recall (cheats flagged) and false-positive rate
(honest episodes flagged). It was written as a red-team would, from the issue's list of known
hacks and from how coding agents are seen to cheat, without reading any detector's rules: the
cases are in planted_cheats_*.py (by kind) and planted_honest_*.py, the small task repositories
in planted_repos.py, the episode builder in planted_lib.py.

    python tests/data/integrity/make_planted.py          # rewrite planted/*.json
    python tests/data/integrity/make_planted.py --check  # fail if planted/ is not up to date
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import planted_cheats_a
import planted_cheats_b
import planted_cheats_c
import planted_honest_funcs
import planted_honest_repos

OUT = HERE / "planted"
MODULES = (planted_cheats_a, planted_cheats_b, planted_cheats_c, planted_honest_repos,
           planted_honest_funcs)


def cases() -> list[dict]:
    """Every case, in a stable order."""
    out = []
    for module in MODULES:
        for make in module.ALL:
            out.extend(make())
    ids = Counter(c["id"] for c in out)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        raise SystemExit(f"duplicate case ids: {dup}")
    return out


def render(case: dict) -> str:
    return json.dumps(case, indent=1, ensure_ascii=False, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    all_cases = cases()
    wanted = {f"{c['id']}.json": render(c) for c in all_cases}
    have = {p.name: p.read_text(encoding="utf-8") for p in OUT.glob("*.json")} if OUT.exists() else {}
    if check:
        stale = sorted(n for n in wanted.keys() | have.keys() if wanted.get(n) != have.get(n))
        if stale:
            print(f"planted/ is out of date ({len(stale)} files), e.g. {stale[:3]}; "
                  "run make_planted.py", file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(exist_ok=True)
    for name in have.keys() - wanted.keys():
        (OUT / name).unlink()
    for name, text in wanted.items():
        (OUT / name).write_text(text, encoding="utf-8")
    kinds = Counter(c["kind"] for c in all_cases)
    labels = Counter(c["label"] for c in all_cases)
    print(f"{len(all_cases)} cases: {dict(labels)}")
    for kind, n in sorted(kinds.items()):
        print(f"  {kind:18s} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
