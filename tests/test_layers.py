"""The import layering of docs/design.md ("Who may import whom"): a lower layer that imports a
higher one fails here, naming the file and the import."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tidal"

FORBIDDEN = {
    "model": {"engine", "harness", "env", "envs", "trainer", "orchestrator", "pretrain", "bench", "cli"},
    "engine": {"harness", "env", "envs", "trainer", "orchestrator", "pretrain", "bench", "cli"},
    "sandbox": {"model", "engine", "harness", "env", "envs", "orchestrator", "bench", "cli"},
    "env": {"envs", "harness", "engine", "orchestrator", "trainer", "pretrain", "bench", "cli"},
    "harness": {"envs", "orchestrator", "trainer", "pretrain", "bench", "cli"},
    "envs": {"orchestrator", "trainer", "pretrain", "bench", "cli", "config"},
    "pretrain": {"orchestrator", "trainer", "harness", "bench", "cli"},
    "trainer": {"orchestrator", "harness", "env", "envs", "bench", "cli"},
    "sync": {"orchestrator", "trainer", "engine", "harness", "env", "envs", "bench", "cli"},
    "numerics": {"model", "engine", "trainer", "orchestrator"},
    "telemetry": {"orchestrator", "trainer", "engine", "bench", "cli"},
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
