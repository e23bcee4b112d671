"""Which forms to fetch to reach a version: the cheapest chain in bytes.

Each version may exist as a delta (from its base) and/or an anchor (from nothing). The cost of
reaching v is min(anchor bytes of v, cost of v's base + delta bytes of v), with the version the
puller holds costing 0; versions only point back, so one pass in version order finds it.
"""

from __future__ import annotations

from tidal.sync.errors import SyncError

Step = tuple[int, str]
"""(version, "delta" | "anchor")"""


def cheapest_path(forms: list[dict], target: int, held: int | None,
                  avoid: frozenset[Step] = frozenset()) -> tuple[list[Step], int]:
    """(forms to apply in order, bytes to fetch) to go from ``held`` to ``target``; ``avoid``
    lists forms known to be bad (a lying or broken one), so a fallback route is found."""
    if held == target:
        return [], 0
    best: dict[int, tuple[int, list[Step]]] = {}
    if held is not None:
        best[held] = (0, [])
    for f in sorted(forms, key=lambda f: (f["version"], f["kind"] != "anchor")):
        v, kind = f["version"], f["kind"]
        if (v, kind) in avoid or v > target or (held is not None and v <= held):
            continue
        if kind == "anchor":
            option = (f["data_bytes"], [(v, kind)])
        elif f["base_version"] in best:
            cost, path = best[f["base_version"]]
            option = (cost + f["data_bytes"], path + [(v, kind)])
        else:
            continue
        if v not in best or option[0] < best[v][0]:
            best[v] = option
    if target not in best:
        have = sorted({f["version"] for f in forms})
        raise SyncError(f"version {target} cannot be built from what the upstream offers "
                        f"(versions {have[:3]}...{have[-3:]}, holding {held}): publish an anchor "
                        "(`tidal sync publish --anchor`) or ask for a version the upstream has")
    cost, path = best[target]
    return path, cost
