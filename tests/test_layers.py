"""The import layering of docs/design.md ("A core and its extensions", "Who may import whom"): a
core package that imports an extension, a lower layer that imports a higher one, or an import
circle (between packages or between the files of one) fails here, naming the files and imports.

Every import counts, lazy ones inside functions too; only those under ``if TYPE_CHECKING:``
(annotations, never run) do not."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "tidal"

EXTENSIONS = {"online", "fleet", "integrity", "bench", "kernels", "gateway"}
"""Extensions: they import the core and plug into it through the protocols the core owns
(orchestrator.pool.RemotePools, env.spec.OutsideEpisodes, the entry points of tidal.plugins)."""

ENTRY_POINTS = {"cli", "__main__"}
"""The command line: it may import anything, and nothing imports it."""

FORBIDDEN = {
    "chat": {"model", "engine", "harness", "env", "families", "trainer", "orchestrator", "pretrain", "config"},
    "evidence": {"model", "engine", "harness", "env", "families", "trainer", "orchestrator", "pretrain",
                 "sandbox", "sync", "numerics", "telemetry", "config"},
    "model": {"engine", "harness", "env", "families", "trainer", "orchestrator", "pretrain", "config"},
    "engine": {"harness", "env", "families", "trainer", "orchestrator", "pretrain", "config"},
    "sandbox": {"model", "engine", "harness", "env", "families", "orchestrator", "config"},
    "env": {"families", "harness", "engine", "orchestrator", "trainer", "pretrain", "config"},
    "harness": {"families", "orchestrator", "trainer", "pretrain", "config"},
    "families": {"orchestrator", "trainer", "pretrain", "config"},
    "pretrain": {"orchestrator", "trainer", "harness"},
    "trainer": {"orchestrator", "harness", "env", "families"},
    "sync": {"orchestrator", "trainer", "engine", "harness", "env", "families"},
    "numerics": {"model", "engine", "trainer", "orchestrator"},
    "telemetry": {"orchestrator", "trainer", "engine"},
    "parallel": {"engine", "harness", "env", "families", "trainer", "orchestrator", "pretrain", "sync"},
}
"""Per core package: the core packages it must never import (beyond every extension and the
command line, which no core package imports)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(module: str) -> list[tuple[str, int]]:
    """(imported tidal module, line) for every import the module runs, resolved to a module of
    the tree (``from tidal.x import name`` counts as tidal.x.name where that is a module)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        names = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("tidal.") and name != module and not module.startswith(name + "."):
                out.append((name, node.lineno))
    return out


def package(module: str) -> str:
    """tidal.<package> of a module (a top-level module is its own package)."""
    return module.split(".")[1] if module.count(".") else module


def test_the_core_never_imports_an_extension_or_the_command_line():
    bad = [f"{MODULES[m].relative_to(PKG)}:{line} imports {target}"
           for m in MODULES if package(m) not in EXTENSIONS | ENTRY_POINTS and m != "tidal"
           for target, line in imports(m) if package(target) in EXTENSIONS | ENTRY_POINTS]
    assert bad == []


def test_nothing_but_the_command_line_imports_it():
    bad = [f"{MODULES[m].relative_to(PKG)}:{line} imports {target}"
           for m in MODULES if package(m) not in ENTRY_POINTS
           for target, line in imports(m) if package(target) in ENTRY_POINTS]
    assert bad == []


@pytest.mark.parametrize("component", sorted(FORBIDDEN))
def test_component_never_imports_a_higher_layer(component):
    bad = [f"{MODULES[m].relative_to(PKG)}:{line} imports {target}"
           for m in MODULES if package(m) == component
           for target, line in imports(m) if package(target) in FORBIDDEN[component]]
    assert bad == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _edges(key) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for m in MODULES:
        for target, _ in imports(m):
            a, b = key(m), key(target)
            if a != b:
                graph.setdefault(a, set()).add(b)
    return graph


def test_no_import_circle_between_packages():
    assert _circles(_edges(package)) == []


def test_no_import_circle_between_files():
    assert _circles(_edges(lambda m: m)) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_plugs_extensions_in_through_entry_points():
    """What pyproject.toml declares is what tidal.plugins loads, and each names an extension."""
    import tomllib

    from tidal.plugins import GROUPS, plugins

    declared = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["entry-points"]
    assert set(declared) == set(GROUPS)
    for group, entries in declared.items():
        assert set(entries) <= set(plugins(group)), f"{group}: run bash scripts/setup.sh again"
        for value in entries.values():
            assert package(value.split(":")[0]) in EXTENSIONS, value


def test_families_use_only_public_names_of_other_components():
    """An environment family is written as a user's would be: no private module or name."""
    bad = []
    for p in sorted((PKG / "families").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tidal."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(part.startswith("_") for part in node.module.split(".")):
                    bad.append(f"{p.relative_to(PKG)}:{node.lineno} from {node.module} import {private}")
    assert bad == []


MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 60
"""docs/design.md ("Long functions, and why"): no file over the first; a function over the
second is named there with the reason."""


def test_no_file_is_over_the_size_limit():
    long = {str(p.relative_to(PKG)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_every_long_function_is_explained_in_the_design():
    design = (SRC.parent / "docs" / "design.md").read_text()
    unexplained = []
    for p in MODULES.values():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                where = f"{p.relative_to(PKG)}: {node.name}"
                if lines > MAX_FUNCTION_LINES and where not in design.replace("\n", " "):
                    unexplained.append(f"{where} ({lines} lines)")
    assert unexplained == []


SECTIONS = {"run", "model", "engine", "env", "harness", "trainer", "sharding", "pretrain", "orchestrator",
            "sync", "fleet", "online"}
"""The run config's sections (tidal.config)."""

COMPOSITION_ROOTS = {"cli", "__main__", "bench", "config", "orchestrator", "online", "fleet"}
"""Who composes a run from all its sections, so may hold the whole run config: the command line,
the benchmarks, the config itself, the RL run (orchestrator), the online run (online) and the
run spread over pools (fleet). Every other component takes its own section or a typed view."""


def _run_config_params(fn: ast.FunctionDef) -> list[str]:
    """Parameters that are the whole run config: annotated so, or unannotated and read for two
    or more of its sections (a view is annotated with its own class)."""
    out = []
    for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
        annotation = ast.unparse(a.annotation) if a.annotation else ""
        read = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == a.arg and n.attr in SECTIONS}
        if a.arg != "self" and ("TidalConfig" in annotation or "CoreConfig" in annotation
                                or (not annotation and len(read) >= 2)):
            out.append(a.arg)
    return out


def whole_config_takers(tree: ast.AST, where: str) -> list[str]:
    """Functions of ``tree`` that take the whole run config, other than a view's ``of``."""
    return [f"{where}: {fn.name}({name})" for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name != "of"
            for name in _run_config_params(fn)]


def test_components_take_their_own_section_or_a_view_not_the_run_config():
    takers = []
    for module, path in MODULES.items():
        if package(module) not in COMPOSITION_ROOTS:
            takers += whole_config_takers(ast.parse(path.read_text()), module)
    assert takers == []


def test_the_whole_config_check_finds_a_taker():
    tree = ast.parse("def build(cfg):\n    return cfg.engine.x, cfg.model.y\n"
                     "def narrow(cfg: 'EngineConfig'):\n    return cfg.remote\n"
                     "def hub(cfg: 'TidalConfig'):\n    return cfg\n")
    assert whole_config_takers(tree, "m") == ["m: build(cfg)", "m: hub(cfg)"]
