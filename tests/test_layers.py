"""The import layering of docs/design.md ("Who may import whom"): a lower layer that imports a
higher one fails here, naming the file and the import."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tidal"

FORBIDDEN = {
    "model": {"engine", "harness", "env", "envs", "trainer", "orchestrator", "pretrain", "bench", "cli", "online"},
    "engine": {"harness", "env", "envs", "trainer", "orchestrator", "pretrain", "bench", "cli", "online"},
    "sandbox": {"model", "engine", "harness", "env", "envs", "orchestrator", "bench", "cli", "online"},
    "env": {"envs", "harness", "engine", "orchestrator", "trainer", "pretrain", "bench", "cli", "online"},
    "harness": {"envs", "orchestrator", "trainer", "pretrain", "bench", "cli", "online"},
    "envs": {"orchestrator", "trainer", "pretrain", "bench", "cli", "config", "online"},
    "integrity": {"model", "engine", "harness", "env", "envs", "trainer", "orchestrator", "pretrain",
                  "bench", "cli", "online", "sandbox", "sync", "numerics", "telemetry"},
    "pretrain": {"orchestrator", "trainer", "harness", "bench", "cli", "online"},
    "trainer": {"orchestrator", "harness", "env", "envs", "bench", "cli", "online"},
    "sync": {"orchestrator", "trainer", "engine", "harness", "env", "envs", "bench", "cli", "online"},
    "numerics": {"model", "engine", "trainer", "orchestrator", "online"},
    "online": {"bench", "cli"},
    "telemetry": {"orchestrator", "trainer", "engine", "bench", "cli", "online"},
    "fleet": {"pretrain", "kernels", "online", "bench", "cli"},
    "parallel": {"engine", "harness", "env", "envs", "trainer", "orchestrator", "pretrain", "bench", "cli",
                 "online", "fleet", "sync"},
}
"""Per component folder: the tidal packages it must never import."""


def imported_components(path: Path) -> set[tuple[str, int]]:
    """(component, line) of every ``tidal.<component>`` import in the file, lazy ones too."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tidal" and len(parts) > 1:
                out.add((parts[1], node.lineno))
    return out


@pytest.mark.parametrize("component", sorted(FORBIDDEN))
def test_component_never_imports_a_higher_layer(component):
    bad = [f"{p.relative_to(SRC)}:{line} imports tidal.{c}"
           for p in sorted((SRC / component).rglob("*.py"))
           for c, line in sorted(imported_components(p)) if c in FORBIDDEN[component]]
    assert bad == []


FLEET_IMPORTERS = ("fleet/", "cli/", "bench/", "orchestrator/")
"""The only files that may import tidal.fleet (the fleet sits beside the orchestrator, which
drives it, and below the entry points); config/ may import only the topology section, a leaf."""

FLEET_LEAVES = {"config.py": {"section"}, "lease.py": {"errors"}}
"""Fleet modules that the config and the scheduler's callers load: they import only these."""


def test_the_fleet_topology_and_leases_are_leaves():
    for name, allowed in FLEET_LEAVES.items():
        used = {c for c, _ in imported_components(SRC / "fleet" / name)}
        assert used <= allowed, f"fleet/{name} imports {sorted(used - allowed)}"


def test_config_imports_only_the_fleet_topology():
    bad = [f"{p.relative_to(SRC)}:{node.lineno} imports {node.module}"
           for p in sorted((SRC / "config").rglob("*.py"))
           for node in ast.walk(ast.parse(p.read_text()))
           if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tidal.fleet")
           and node.module != "tidal.fleet.config"]
    assert bad == []


def test_only_the_entry_points_and_the_loop_import_fleet():
    bad = [f"{p.relative_to(SRC)}:{line} imports tidal.fleet"
           for p in sorted(SRC.rglob("*.py"))
           if not str(p.relative_to(SRC)).startswith(FLEET_IMPORTERS + ("config/",))
           for c, line in sorted(imported_components(p)) if c == "fleet"]
    assert bad == []


def test_envs_use_only_public_names_of_other_components():
    """An environment family is written as a user's would be: no private module or name."""
    bad = []
    for p in sorted((SRC / "envs").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tidal."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(part.startswith("_") for part in node.module.split(".")):
                    bad.append(f"{p.relative_to(SRC)}:{node.lineno} from {node.module} import {private}")
    assert bad == []
